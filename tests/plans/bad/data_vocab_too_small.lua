-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: the byte-level "addition" corpus needs vocab ≥ 62
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  model = { vocab = 32 },  -- @error
})
