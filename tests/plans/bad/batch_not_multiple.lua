-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: batch.global = 10: not a multiple of batch.micro × dp = 2 × 4 = 8; use a multiple of 8 (e.g. 16)
-- args: --world 4
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  batch = {
    global = 10,  -- @error
  },
})
