-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: attempt to call a nil value (field 'execute')
local tycho = require "tycho"
os.execute("true")  -- @error
return tycho.plan {}
