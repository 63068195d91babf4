-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: zero = 2: ZeRO stages 2 and 3 shard gradients
-- args: --world 2
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 2 },
  zero = 2,  -- @error
})
