-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: train.max_loss_jump = inf: must be a number ≥ 0
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  train = { steps = 10, max_loss_jump = math.huge },  -- @error
})
