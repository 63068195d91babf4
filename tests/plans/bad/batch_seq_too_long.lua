-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: batch.seq = 128: longer than model.max_seq = 64
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  batch = { seq = 128 },  -- @error
})
