-- string.rep whose result cannot fit the memory cap is refused before it starts, by name.
-- expect: string.rep: plan exceeded the memory cap of 16 MiB (it would need 1099511627776 bytes more)
-- args: --max-memory 16
local base = require "_base"
local s = ("x"):rep(1 << 40)  -- @error
return base
