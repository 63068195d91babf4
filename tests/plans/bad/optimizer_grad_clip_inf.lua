-- A malformed plan: tycho check must refuse it with exit code 2 (inf passed the range ≥ 0).
-- expect: optimizer.grad_clip = inf: must be a finite number
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  optimizer = { grad_clip = math.huge },  -- @error
})
