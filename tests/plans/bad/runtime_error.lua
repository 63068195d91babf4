-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: attempt to call a nil value (field 'nope')
local tycho = require "tycho"
local t = {}
t.nope()  -- @error
return tycho.plan {}
