-- A malformed plan: tycho check must refuse it with exit code 2.
-- args: --world 8
-- expect: mesh.ep = 8 does not divide model.moe.experts = 4 (tests/plans/bad/mesh_ep_not_dividing_experts.lua:9): each ep rank holds experts / ep of every sparse layer's experts; use ep in {1, 2, 4} (the divisors of the experts that divide mesh.dp = 8)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { ep = 8 },  -- @error
  batch = { global = 16, micro = 2 },
  model = { moe = { experts = 4, top_k = 2 } },
})
