-- A malformed plan: tycho check must refuse it with exit code 2 (inf passed the range ≥ 0).
-- expect: optimizer.weight_decay = inf: must be a finite number
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  optimizer = { weight_decay = math.huge },  -- @error
})
