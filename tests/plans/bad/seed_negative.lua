-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: seeds.global = -1: must be an integer ≥ 0
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  seeds = { global = -1 },  -- @error
})
