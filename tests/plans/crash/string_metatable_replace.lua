-- Issue 14.10: a plan replaced the string metatable's methods (every module's s:rep).
-- expect: attempt to index a nil value
local tycho = require "tycho"
getmetatable("").__index.rep = function() return "x" end  -- @error
return tycho.plan {}
