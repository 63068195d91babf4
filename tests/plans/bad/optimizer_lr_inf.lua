-- A malformed plan: tycho check must refuse it with exit code 2 (inf passed the range > 0).
-- expect: optimizer.lr = inf: must be a finite number
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  optimizer = { lr = math.huge },  -- @error
})
