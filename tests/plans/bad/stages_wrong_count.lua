-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: stages: 3 entries, but pp 2 × virtual_stages 1 = 2 stages
-- args: --world 2
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 2 },
  stages = { { 0 }, { 1, 2 }, { 3 } },  -- @error
})
