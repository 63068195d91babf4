-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: '}' expected (to close '{' at line 4) near 'batch'
local tycho = require "tycho"
return tycho.plan {
  model = { n_layers = 2 }
  batch = {},  -- @error
}
