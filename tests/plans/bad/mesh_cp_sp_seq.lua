-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: sequence_parallel = true with mesh.cp = 2: batch.seq = 36 is not a multiple of 2 × cp × tp = 8 (each of the 2 × cp chunks splits over the 2 tp ranks); use a multiple of 8 or sequence_parallel = false
-- args: --world 4
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { tp = 2, cp = 2 },
  sequence_parallel = true,  -- @error
  batch = { seq = 36 },
})
