-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: model.tie_embeddings = true makes them one tensor, split one way
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  model = { tie_embeddings = true },
  mesh = { tp = 2 },
  tp_split = { embed = "vocab", head = "replicate" },  -- @error
})
