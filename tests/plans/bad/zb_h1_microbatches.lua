-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: schedule.kind = "zb-h1" needs at least mesh.pp = 4 micro-batches per step (it has 2
-- args: --world 4
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 4 },
  schedule = { kind = "zb-h1" },
  batch = { global = 4 },  -- @error
})
