-- A malformed plan: tycho check must refuse it with exit code 2 (a range of > 0 alone let inf through, and it trained garbage).
-- expect: model.norm_eps = inf: must be a finite number
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  model = { norm_eps = math.huge },  -- @error
})
