-- A malformed plan: tycho check must refuse it with exit code 2.
-- args: --world 2
-- expect: mesh.ep = 2: expert parallelism spreads the experts of model.moe, and this model has none; set mesh.ep = 1 (or leave it out), or give the model a model.moe
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { ep = 2 },  -- @error
})
