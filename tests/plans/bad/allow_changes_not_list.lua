-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: checkpoint.allow_changes = true: must be a list of field names, e.g. { "train.steps", "optimizer.lr" }
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  checkpoint = { dir = "ckpt/x", allow_changes = true },  -- @error
})
