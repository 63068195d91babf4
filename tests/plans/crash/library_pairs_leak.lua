-- pairs(string) returned next and the real string table, which a plan could then write,
-- replacing every string's methods for every module.
-- expect: string.rep: the sandbox's libraries are read-only
local base = require "_base"
local _, lib = pairs(string)
lib.rep = function() return "x" end  -- @error
return base
