-- A finalizer through tycho.extend: setmetatable refuses __gc, but __gc added to a metatable
-- already set was copied onto the copy by extend, which then ran at lua_close, uncounted.
-- expect: tycho.extend: a table to copy has a metatable with __gc
local tycho = require "tycho"
local base = require "_base"
local mt = {}
local t = setmetatable({}, mt)
mt.__gc = function() while true do end end
return tycho.extend(base, { t = t })  -- @error
