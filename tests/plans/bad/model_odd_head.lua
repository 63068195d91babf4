-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: head size dim / n_heads = 15 is odd
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  model = { dim = 60 },  -- @error
})
