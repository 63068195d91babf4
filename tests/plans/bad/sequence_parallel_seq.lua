-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: batch.seq = 30 is not a multiple of mesh.tp = 4
-- args: --world 4
local tycho = require "tycho"
return tycho.plan {
  model = { n_layers = 2, dim = 64, n_heads = 4, ffn_dim = 128, vocab = 64, max_seq = 64 },
  mesh = { tp = 4 },
  sequence_parallel = true,  -- @error
  batch = { global = 8, seq = 30 },
}
