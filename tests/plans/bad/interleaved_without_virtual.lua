-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: schedule.kind = "interleaved": needs virtual_stages ≥ 2
-- args: --world 2
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 2 },
  schedule = { kind = "interleaved" },  -- @error
})
