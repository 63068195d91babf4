-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: lr_schedule.min_lr = 0.1: larger than optimizer.lr = 0.001
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  lr_schedule = { decay = "cosine", min_lr = 0.1 },  -- @error
})
