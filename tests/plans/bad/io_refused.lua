-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: 'io' is not available in the plan sandbox; run tycho with --unsafe
local tycho = require "tycho"
local f = io.open("/etc/hostname")  -- @error
return tycho.plan {}
