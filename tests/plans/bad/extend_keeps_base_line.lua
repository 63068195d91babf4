-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mesh.tp = 0: must be an integer in 1..
local tycho = require "tycho"
local base = tycho.plan {
  model = { n_layers = 2, dim = 64, n_heads = 4, ffn_dim = 128, vocab = 64, max_seq = 64 },
  mesh = { tp = 0 },  -- @error
  batch = { global = 8, seq = 32 },
}
return tycho.extend(base, { batch = { micro = 1 } })
