-- tycho.extend's source records were C memory outside the memory cap: a loop of extends grew
-- tycho past 1 GB under --max-memory 16.
-- expect: plan exceeded the memory cap of 16 MiB
-- args: --max-memory 16
local tycho = require "tycho"
local base = require "_base"
local t = {}
for i = 1, 100 do t["k" .. i] = i end
for _ = 1, 10000000 do local x = tycho.extend(t, t) end  -- @error
return base
