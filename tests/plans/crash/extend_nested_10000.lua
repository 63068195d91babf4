-- A crash input (issue 14.1): tycho.extend on a table nested 10000 levels deep.
-- expect: tycho.extend: tables nested deeper than 100 levels
local tycho = require "tycho"
local base = require "_base"
local t = {}
for _ = 1, 10000 do t = { x = t } end
return tycho.extend(base, t)  -- @error
