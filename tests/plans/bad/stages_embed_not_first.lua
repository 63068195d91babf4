-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: stages[2]: "embed" belongs at the start of the first stage
-- args: --world 2
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 2 },
  stages = {
    { 0, 1 },
    { "embed", 2, 3 },  -- @error
  },
})
