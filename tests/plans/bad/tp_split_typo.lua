-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: tp_split.q = "colum": must be one of "replicate", "column", "row", "vocab" (did you mean "column"?)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  tp_split = {
    q = "colum",  -- @error
  },
})
