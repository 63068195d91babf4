-- A crash input (issue 14.1): extend(t, t) with t.self = t recursed until it segfaulted.
-- expect: tycho.extend: the override refers to itself through 'self'
local tycho = require "tycho"
local t = { name = "x" }
t.self = t
return tycho.extend(t, t)  -- @error
