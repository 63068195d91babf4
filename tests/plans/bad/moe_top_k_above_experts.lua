-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: model.moe.top_k = 5: more than model.moe.experts = 4; each token goes to top_k of the experts, so 1 ≤ top_k ≤ 4
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  model = { moe = { experts = 4,
    top_k = 5 } },  -- @error
})
