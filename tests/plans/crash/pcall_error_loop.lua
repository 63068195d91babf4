-- A slow loop: a pcall of an error in a loop took 35 times as long per instruction as a plain
-- loop (20 s at the default limit). Caught errors are charged to the count now.
-- expect: plan exceeded the instruction limit of 200000000 Lua instructions
local tycho = require "tycho"
while true do pcall(function() return tsue end) end  -- @error
return tycho.plan {}
