-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: lr_schedule.decay = "cosin": must be one of "constant", "cosine", "linear" (did you mean "cosine"?)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  lr_schedule = { decay = "cosin" },  -- @error
})
