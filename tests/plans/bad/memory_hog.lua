-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: plan exceeded the memory cap of 16 MiB
-- args: --max-memory 16
local tycho = require "tycho"
local t = {}
for i = 1, 1e8 do t[i] = i end  -- @error
return tycho.plan {}
