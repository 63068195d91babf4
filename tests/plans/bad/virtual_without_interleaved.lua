-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: virtual_stages = 2: only the "interleaved" schedule runs virtual stages
-- args: --world 2
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  mesh = { pp = 2 },
  virtual_stages = 2,  -- @error
})
