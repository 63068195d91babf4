-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: optimizer.beta2 = 1: must be a number in [0, 1)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  optimizer = { beta2 = 1 },  -- @error
})
