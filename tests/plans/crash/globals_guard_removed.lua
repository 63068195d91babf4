-- Issue 14.10: a plan removed the strict-globals guard.
-- expect: cannot change a protected metatable
local tycho = require "tycho"
setmetatable(_ENV, nil)  -- @error
return tycho.plan {}
