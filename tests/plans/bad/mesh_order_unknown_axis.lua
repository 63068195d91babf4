-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mesh.order[3] = "ep": must be one of "tp", "dp", "pp", "cp"
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { order = { "tp", "dp", "ep" } },  -- @error
})
