-- A crash input (issue 14.1): tycho.extend on tables nested 8+ levels wrote past the Lua stack
-- (segfault). It must compile cleanly up to the model error the base plan carries.
-- expect: tycho.extend: tables nested deeper than 100 levels
local tycho = require "tycho"
local base = require "_base"
local deep, over = {}, {}
for _ = 1, 12 do deep = { x = deep, y = 1, z = { 1, 2 } } end
local t = tycho.extend({ a = deep }, { a = deep })
for _ = 1, 200 do over = { x = over } end
return tycho.extend(base, { deep = over })  -- @error
