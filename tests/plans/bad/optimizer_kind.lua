-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: optimizer.kind = "sgd": must be one of "adamw"
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  optimizer = { kind = "sgd" },  -- @error
})
