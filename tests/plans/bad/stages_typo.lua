-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: stages = "evn": must be one of "even", "balanced"
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  stages = "evn",  -- @error
})
