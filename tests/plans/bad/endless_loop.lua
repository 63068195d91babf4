-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: plan exceeded the instruction limit of 1000000 Lua instructions (an endless loop?)
-- args: --max-instructions 1000000
local tycho = require "tycho"
local n = 0
while true do n = n + 1 end  -- @error
return tycho.plan {}
