-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: model: missing; a plan needs a model
local tycho = require "tycho"
return tycho.plan {  -- @error
  batch = { global = 8, seq = 32 },
}
