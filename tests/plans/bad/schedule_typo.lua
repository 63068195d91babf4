-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: schedule.kind = "1fb1": must be one of "gpipe", "1f1b", "interleaved", "zb-h1" (did you mean "1f1b"?)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  schedule = { kind = "1fb1" },  -- @error
})
