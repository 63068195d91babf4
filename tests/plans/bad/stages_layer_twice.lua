-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: stages[2]: layer 1 appears twice or out of order
-- args: --world 2
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 2 },
  stages = {
    { "embed", 0, 1 },
    { 1, 2, 3, "head" },  -- @error
  },
})
