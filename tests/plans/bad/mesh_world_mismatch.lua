-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mesh.dp = 2: tp 2 × pp 1 × dp 2 = 4 ranks, but the world has 8; set dp = 4
-- args: --world 8
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { tp = 2,
    dp = 2 },  -- @error
})
