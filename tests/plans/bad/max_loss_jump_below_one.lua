-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: train.max_loss_jump = 0.5: must be above 1
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  train = { steps = 10, max_loss_jump = 0.5 },  -- @error
})
