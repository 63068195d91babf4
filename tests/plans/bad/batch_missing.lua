-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: batch: missing; a plan needs batch
local tycho = require "tycho"
return tycho.plan {  -- @error
  model = { n_layers = 2, dim = 64, n_heads = 4, ffn_dim = 128, vocab = 64, max_seq = 64 },
}
