-- A hang: string.format("%99.99f", 1e308) prints 400 digits in C; a format of a thousand of them
-- takes milliseconds for a handful of instructions.
-- expect: string.format: plan exceeded the instruction limit of 1000000 Lua instructions
-- args: --max-instructions 1000000
local base = require "_base"
local f = ("%99.99f"):rep(200)
local args = {}
for i = 1, 200 do args[i] = 1e308 end
while true do local s = string.format(f, table.unpack(args)) end  -- @error
return base
