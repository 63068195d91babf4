-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: checkpoint.allow_changes[2] = "optimizer.learning_rate" (the fields a resume compares): must be one of
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  checkpoint = { dir = "ckpt/x", allow_changes = {
    "train.steps",
    "optimizer.learning_rate",  -- @error
  } },
})
