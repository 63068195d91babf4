-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: stages: layer 1 is in stage 0 after layer 0 in stage 1
-- args: --world 2
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 2 },
  stages = function(layer) return layer == 0 and 1 or (layer < 2 and 0 or 1) end,  -- @error
})
