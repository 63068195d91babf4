-- A malformed plan: tycho check must refuse it with exit code 2. A C path ends at its first NUL,
-- so the file written would not be the one the plan names.
-- expect: export.path has a NUL byte at offset 3 (names and paths end at NUL)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  export = {
    path = "out\0.safetensors",  -- @error
  },
})
