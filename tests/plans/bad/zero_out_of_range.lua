-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: zero = 4: must be an integer in 0..3
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  zero = 4,  -- @error
})
