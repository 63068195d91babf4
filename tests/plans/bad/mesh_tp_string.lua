-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mesh.tp = "2": must be an integer
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { tp = "2" },  -- @error
})
