-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mesh.tp = 2 with model.moe (tests/plans/bad/moe_tp2.lua:7): tensor parallelism inside experts is not supported yet; use mesh.tp = 1
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { tp = 2 },  -- @error
  model = { moe = { experts = 4, top_k = 2 } },
})
