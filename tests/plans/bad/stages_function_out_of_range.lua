-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: stages: the function returned 2 for layer 2; it must return a stage index in 0..1
-- args: --world 2
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 2 },
  stages = function(layer) return layer // 2 * 2 end,  -- @error
})
