-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: 'dofile' is not available in the plan sandbox
local tycho = require "tycho"
dofile("x.lua")  -- @error
return tycho.plan {}
