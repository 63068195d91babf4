-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mesh.order: lists three axes without "tp"; list "tp", "cp", "dp", "pp" once each
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { order = { "cp", "dp", "pp" } },  -- @error
})
