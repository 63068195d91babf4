-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mdoel: unknown field (did you mean "model"?)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mdoel = {},  -- @error
})
