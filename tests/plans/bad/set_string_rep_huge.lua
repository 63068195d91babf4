-- A --set table constructor runs in the sandbox too: string.rep of 2^50 empty strings there hung.
-- expect: --set:1: string.rep: plan exceeded the instruction limit of 200000000 Lua instructions
-- args: --set x={(""):rep(1<<50)}
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {})
