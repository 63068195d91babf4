-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: the interleaved schedule needs the micro-batches per step (3
-- args: --world 2
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 2 },
  virtual_stages = 2,
  schedule = { kind = "interleaved" },
  batch = { global = 6 },  -- @error
})
