-- A small valid plan the crash plans in this folder extend (not a test itself).
local tycho = require "tycho"
return tycho.plan {
  name = "bad-plan-base",
  model = { n_layers = 4, dim = 64, n_heads = 4, n_kv_heads = 2, ffn_dim = 192, vocab = 64, max_seq = 64 },
  mesh = { tp = 1, pp = 1, dp = "auto" },
  batch = { global = 8, micro = 2, seq = 32 },
  data = { synthetic = "addition" },
}
