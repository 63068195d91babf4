-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mesh.tp = 8 does not divide model.ffn_dim = 100
-- args: --world 8
local tycho = require "tycho"
return tycho.plan {
  model = { n_layers = 2, dim = 64, n_heads = 8, ffn_dim = 100, vocab = 64, max_seq = 64 },
  mesh = { tp = 8 },
  tp_split = { gate = "column" },  -- @error
  batch = { global = 8, seq = 32 },
}
