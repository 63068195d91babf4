-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mesh.dp = "autoo": must be an integer ≥ 1 or "auto"
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { dp = "autoo" },  -- @error
})
