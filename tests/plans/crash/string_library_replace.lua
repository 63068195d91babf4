-- Issue 14.10: the string library, the methods of every string, is read-only in the sandbox.
-- expect: string.rep: the sandbox's libraries are read-only
local tycho = require "tycho"
string.rep = function() return "x" end  -- @error
return tycho.plan {}
