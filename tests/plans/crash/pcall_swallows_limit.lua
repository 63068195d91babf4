-- A hang (issue 14.3): pcall caught the instruction-limit error, so a loop of pcalls ran forever.
-- expect: plan exceeded the instruction limit of 1000000 Lua instructions
-- args: --max-instructions 1000000
local tycho = require "tycho"
while true do pcall(function() while true do end end) end  -- @error
return tycho.plan {}
