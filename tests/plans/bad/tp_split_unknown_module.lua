-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: tp_split.qq: unknown field (did you mean "q"?)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  tp_split = { qq = "column" },  -- @error
})
