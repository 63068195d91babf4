-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: model.moe.capacity_facter: unknown field (did you mean "capacity_factor"?)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  model = { moe = { experts = 4, top_k = 2, capacity_facter = 1.25 } },  -- @error
})
