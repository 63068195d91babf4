-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mesh.pd: unknown field (did you mean "pp"?)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { tp = 1,
    pd = 2 },  -- @error
})
