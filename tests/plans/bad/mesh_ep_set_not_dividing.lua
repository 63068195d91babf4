-- A malformed plan: tycho check must refuse it with exit code 2 (mesh.ep from --set, against
-- the plan's dp = 2).
-- args: --set mesh.ep=4
-- expect: mesh.ep = 4 does not divide mesh.dp = 2: an ep group is ep consecutive data-parallel ranks; use ep in {1, 2} (the divisors of dp that divide model.moe.experts = 4)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { dp = 2 },
  model = { moe = { experts = 4, top_k = 2 } },
})
