-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: sequence_parallel = true with model.moe (tests/plans/bad/moe_tp2_sequence_parallel.lua:8) and mesh.tp = 2: a sparse layer routes whole sequences
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { tp = 2 },
  sequence_parallel = true,  -- @error
  model = { moe = { experts = 4, top_k = 2 } },
})
