-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: model.moe.layers[3] = 4: layer 4 does not exist; layers are 0..3
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  model = { moe = { experts = 4, top_k = 2, layers = { 0, 2,
    4 } } },  -- @error
})
