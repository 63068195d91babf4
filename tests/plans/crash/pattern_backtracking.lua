-- A hang (issue 14.3): Lua's pattern matching runs in C, outside the instruction count.
-- expect: string.find: the pattern could backtrack
local tycho = require "tycho"
local s = string.find(("a"):rep(3000), (".-"):rep(15) .. "b")  -- @error
return tycho.plan {}
