-- table.insert reads __len once: a __len that says 1 to a check and 2^50 to the shift that
-- follows cannot slip a huge shift past the charge.
-- expect: table.insert: plan exceeded the instruction limit of 1000000 Lua instructions
-- args: --max-instructions 1000000
local base = require "_base"
local calls = 0
local t = setmetatable({}, { __len = function() calls = calls + 1; return calls == 1 and (1 << 50) or 1 end })
table.insert(t, 1, 0)  -- @error
return base
