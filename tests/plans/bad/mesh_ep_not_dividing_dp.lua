-- A malformed plan: tycho check must refuse it with exit code 2.
-- args: --world 4
-- expect: mesh.ep = 3 does not divide mesh.dp = 4 (dp "auto" = world 4 / (tp 1 × pp 1)): an ep group is ep consecutive data-parallel ranks; use ep in {1, 2, 4} (the divisors of dp that divide model.moe.experts = 8)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { ep = 3 },  -- @error
  model = { moe = { experts = 8, top_k = 2 } },
})
