-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: set tp_split.k and tp_split.v to "replicate"
-- args: --world 4
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { tp = 4 },
  tp_split = { q = "column",
    k = "column" },  -- @error
})
