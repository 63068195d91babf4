-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: device = "cdua": must be one of "auto", "cpu", "cuda" (did you mean "cuda"?)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  device = "cdua",  -- @error
})
