-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: a world of 6 ranks is not a multiple of tp × cp × pp = 2 × 2 × 1 = 4; use a world that is, or change tp, cp or pp
-- args: --world 6
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { tp = 2, cp = 2 },  -- @error
})
