-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: --set zero.x=1: zero is 0, not a table of fields
-- args: --set zero.x=1
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, { zero = 0 })
