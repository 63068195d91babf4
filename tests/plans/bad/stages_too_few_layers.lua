-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: stages = "even": 4 layers cannot fill 8 stages
-- args: --world 8
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 8 },
  stages = "even",  -- @error
})
