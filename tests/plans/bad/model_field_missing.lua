-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: model.ffn_dim: missing; it is required
local tycho = require "tycho"
return tycho.plan {
  model = { n_layers = 2, dim = 64, n_heads = 4, vocab = 64, max_seq = 64 },  -- @error
  batch = { global = 8, seq = 32 },
}
