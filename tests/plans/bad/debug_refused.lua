-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: 'debug' is not available in the plan sandbox
local tycho = require "tycho"
local info = debug.getinfo(1)  -- @error
return tycho.plan {}
