-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: a synthetic corpus replaces data.train and data.val
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  data = { train = "x.bin",
    synthetic = "addition" },  -- @error
})
