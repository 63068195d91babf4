-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: require '/etc/passwd': a plan module name is a dotted name
local m = require "/etc/passwd"  -- @error
return m
