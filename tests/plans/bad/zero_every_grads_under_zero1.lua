-- A malformed plan: tycho check must refuse it with exit code 2. Zero 0 and 1 keep whole
-- gradients and reduce them once a step: there is nothing for zero_every.grads to choose.
-- expect: zero_every.grads = "micro_batch" with zero = 1: zero 0 and 1 keep whole gradients
-- args: --world 2
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  zero = 1,
  zero_every = { grads = "micro_batch" },  -- @error
})
