-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: recompute = "full" (returned by the recompute function for layer 2): layer 2 is sparse (model.moe, tests/plans/bad/moe_recompute_mlp.lua:8), and recompute of the sparse MLP is not supported yet; recompute attention parts only
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  -- dense layers may recompute anything, sparse ones their attention only
  recompute = function(layer) return layer >= 2 and "full" or "attn" end,  -- @error
  model = { moe = { experts = 4, top_k = 2, layers = { 2, 3 } } },
})
