-- A malformed plan: tycho check must refuse it with exit code 2. ZeRO 2 with pipeline stages
-- runs, but only ZeRO 3 gathers parameters: a zero_every.params choice would change nothing.
-- expect: zero_every.params = "step" with zero = 2: only zero = 3 shards the parameters
-- args: --world 4
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 2 },
  zero = 2,
  zero_every = {
    params = "step",  -- @error
  },
})
