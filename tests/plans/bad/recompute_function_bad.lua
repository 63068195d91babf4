-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: returned by the recompute function for layer 0
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  recompute = function(layer) return 7 end,  -- @error
})
