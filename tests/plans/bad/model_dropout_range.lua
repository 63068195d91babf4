-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: model.dropout = 1.5: must be a number in [0, 1)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  model = { dropout = 1.5 },  -- @error
})
