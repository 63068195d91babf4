-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: batch = 8: must be a table
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  batch = 8,  -- @error
})
