-- A slow loop the plan fuzzer found: xpcall of a function that raises, with a handler that
-- raises too (Lua calls it again, 200 deep), took 30 times as long per instruction as a plain
-- loop (80 s at the default limit, past the test timeout of 60 s). Caught errors are charged to the count now.
-- expect: plan exceeded the instruction limit of 200000000 Lua instructions
local tycho = require "tycho"
local function spin() local n = 1 while tsue do n = n + 1 end end
while true do xpcall(spin, function(pin) s() end) end  -- @error
return tycho.plan {}
