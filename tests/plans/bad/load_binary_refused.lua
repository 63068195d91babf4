-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: load: binary chunks are refused in plans
local tycho = require "tycho"
local f = load("\27Lua", "x", "b")  -- @error
return tycho.plan {}
