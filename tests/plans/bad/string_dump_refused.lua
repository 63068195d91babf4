-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: string.dump is not available to plans (sandbox); --unsafe lifts it
local tycho = require "tycho"
local s = string.dump(function() end)  -- @error
return tycho.plan {}
