-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mesh: unexpected entry [1]; mesh has named fields only
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { 4,  -- @error
    tp = 1 },
})
