-- A hang (issue 14.3): xpcall, its handler looping too, caught the instruction-limit error.
-- expect: plan exceeded the instruction limit of 1000000 Lua instructions
-- args: --max-instructions 1000000
local tycho = require "tycho"
local function spin() local n = 0 while true do n = n + 1 end end  -- @error
while true do xpcall(spin, function() spin() end) end
return tycho.plan {}
