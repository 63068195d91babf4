-- A crash input (issue 14.2): the instruction limit firing inside an __index run by the plan
-- reader was a Lua panic (exit 134, empty stderr).
-- expect: plan exceeded the instruction limit of 1000000 Lua instructions
-- args: --max-instructions 1000000
local tycho = require "tycho"
local base = require "_base"
local p = tycho.extend(base, {})
return tycho.plan(setmetatable(p, { __index = function() while true do end end }))  -- @error
