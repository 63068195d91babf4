-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: model.dim = 100: not a multiple of model.n_heads = 3
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  model = { dim = 100,  -- @error
    n_heads = 3, n_kv_heads = 3 },
})
