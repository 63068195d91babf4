-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: master weights are kept in fp32 only
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  precision = { compute = "bf16",
    master = "bf16" },  -- @error
})
