-- A hang: utf8.len scans its whole string in C (10 MB here) for one instruction.
-- expect: utf8.len: plan exceeded the instruction limit of 20000000 Lua instructions
-- args: --max-instructions 20000000
local base = require "_base"
local s = ("x"):rep(10000000)
while true do local n = utf8.len(s) end  -- @error
return base
