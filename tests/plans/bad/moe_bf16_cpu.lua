-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: precision.compute = "bf16" with model.moe (tests/plans/bad/moe_bf16_cpu.lua:7) on the CPU runtime: its bf16 mode has no mixture-of-experts kernels
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  precision = { compute = "bf16" },  -- @error
  model = { moe = { experts = 4, top_k = 2 } },
})
