-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: stages[2]: layer 2 is missing (the list jumps to 3)
-- args: --world 2
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 2 },
  stages = {
    { "embed", 0, 1 },
    { 3, "head" },  -- @error
  },
})
