-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: assigns to undeclared global 'model'; declare it with 'local model'
local tycho = require "tycho"
model = {}  -- @error
return tycho.plan { model = model }
