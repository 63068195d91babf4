-- A hang: table.concat over 2^50 elements that a C function (rawlen) makes up for __index:
-- one byte each, so the memory cap took far longer than any instruction limit to stop it.
-- expect: table.concat: plan exceeded the instruction limit of 1000000 Lua instructions
-- args: --max-instructions 1000000
local base = require "_base"
local t = setmetatable({}, { __index = rawlen })
local s = table.concat(t, "", 1, 1 << 50)  -- @error
return base
