-- tycho.extend searched a source record per key: extending a table of 200000 keys took over a
-- minute (n^2). It is linear now, so this plan reaches its error in about a second.
-- expect: extended 200000 keys
local tycho = require "tycho"
local t = {}
for i = 1, 200000 do t["k" .. i] = i end
local x = tycho.extend(t, t)
local n = 0
for _ in pairs(x) do n = n + 1 end
error("extended " .. n .. " keys")  -- @error
