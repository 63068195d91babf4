-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: attempt to call a nil value (field 'dump')
local tycho = require "tycho"
local s = string.dump(function() end)  -- @error
return tycho.plan {}
