-- A hang: each string.rep makes 8 MB (under the memory cap, and garbage at once) for one
-- instruction, so a loop of them ran for hours inside any instruction limit.
-- expect: string.rep: plan exceeded the instruction limit of 1000000 Lua instructions
-- args: --max-instructions 1000000
local base = require "_base"
for _ = 1, 100000 do local s = string.rep("x", 8000000) end  -- @error
return base
