-- A hang: table.sort of 2^30 elements that __len and a C __index (rawlen) make up; the sort
-- compares in C, where the count hook never runs.
-- expect: table.sort: plan exceeded the instruction limit of 1000000 Lua instructions
-- args: --max-instructions 1000000
local base = require "_base"
local t = setmetatable({}, { __len = function() return 1 << 30 end, __index = rawlen })
table.sort(t)  -- @error
return base
