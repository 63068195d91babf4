-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mesh.tp = 0: must be an integer in 1..
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = {
    tp = 0,  -- @error
  },
})
