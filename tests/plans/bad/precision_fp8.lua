-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: precision.compute = "fp8": must be one of "fp32", "bf16", "fp16"
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  precision = { compute = "fp8" },  -- @error
})
