-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: mesh.cp = 17: batch.seq = 32 is shorter than the 2 × cp = 34 chunks context parallelism cuts each sequence into (each of at least one token); use cp ≤ 16
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { cp = 17 },  -- @error
})
