-- A hang (issue 14.3): a __gc finalizer runs at lua_close, after the plan was read.
-- expect: setmetatable: __gc metamethods are not available to plans (sandbox)
local tycho = require "tycho"
local base = require "_base"
setmetatable({}, { __gc = function() while true do end end })  -- @error
return base
