-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: model.n_kv_heads = 3: must divide model.n_heads = 4
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  model = {
    n_kv_heads = 3,  -- @error
  },
})
