-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: tp_split.q = "column": mesh.tp = 3 does not divide model.n_heads = 4
-- args: --world 3
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { tp = 3 },
  tp_split = { q = "column" },  -- @error
  batch = { global = 6, micro = 2, seq = 33 },
  model = { vocab = 66, max_seq = 64 },
})
