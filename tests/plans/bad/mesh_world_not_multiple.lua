-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: a world of 6 ranks is not a multiple of tp × pp = 4 × 1
-- args: --world 6
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { tp = 4 },  -- @error
})
