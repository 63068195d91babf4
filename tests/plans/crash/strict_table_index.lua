-- A crash input (issue 14.2): an __index that raises (a "strict table") fired outside a
-- protected call while the plan was read: Lua panic, exit 134, empty stderr.
-- expect: strict: no field 'virtual_stages' (while reading plan field virtual_stages)
local tycho = require "tycho"
local base = require "_base"
local p = tycho.extend(base, {})
return tycho.plan(setmetatable(p, { __index = function(_, k) error("strict: no field '" .. k .. "'") end }))  -- @error
