-- A module assigned a new table to the global `string`, which every module after it then saw.
-- expect: assigns to global 'string': the sandbox's globals are read-only
local base = require "_base"
string = { rep = function() return "x" end }  -- @error
return base
