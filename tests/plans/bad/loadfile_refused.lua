-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: 'loadfile' is not available in the plan sandbox
local tycho = require "tycho"
loadfile("x.lua")  -- @error
return tycho.plan {}
