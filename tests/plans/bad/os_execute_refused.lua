-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: os.execute is not available to plans (sandbox); --unsafe lifts it
local tycho = require "tycho"
os.execute("true")  -- @error
return tycho.plan {}
