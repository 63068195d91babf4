-- A hang: table.move over 2^50 nils loops in C and allocates nothing.
-- expect: table.move: plan exceeded the instruction limit of 1000000 Lua instructions
-- args: --max-instructions 1000000
local base = require "_base"
table.move({}, 1, 1 << 50, 1, {})  -- @error
return base
