-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: zero_every.grads = "microbatch": must be one of "micro_batch", "step" (did you mean "micro_batch"?)
-- args: --world 4
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 2 },
  zero = 3,
  zero_every = {
    grads = "microbatch",  -- @error
  },
})
