-- A hang: string.rep of an empty string loops its count in C, where the count hook never runs,
-- and allocates nothing the memory cap would stop.
-- expect: string.rep: plan exceeded the instruction limit of 1000000 Lua instructions
-- args: --max-instructions 1000000
local base = require "_base"
local s = string.rep("", 1 << 50)  -- @error
return base
