-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: axis "tp" appears twice
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { order = { "tp", "tp", "pp" } },  -- @error
})
