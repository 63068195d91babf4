-- A hang: table.insert at position 1 shifts every element up to #t, which __len makes 2^50.
-- expect: table.insert: plan exceeded the instruction limit of 1000000 Lua instructions
-- args: --max-instructions 1000000
local base = require "_base"
local t = setmetatable({}, { __len = function() return 1 << 50 end })
table.insert(t, 1, 0)  -- @error
return base
