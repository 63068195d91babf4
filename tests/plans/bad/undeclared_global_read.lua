-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: reads undeclared global 'llama'
local tycho = require "tycho"
return tycho.plan {
  model = llama,  -- @error
}
