-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: tp_split.q = "vocab": only embed and head split by vocabulary
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  tp_split = { q = "vocab" },  -- @error
})
