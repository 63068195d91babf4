-- A malformed plan: tycho check must refuse it with exit code 2. Paths are bytes, but a data path
-- is written into checkpoint manifests (what a resume compares), which are UTF-8 JSON.
-- expect: data.train is not valid UTF-8 (byte 0xe9 at offset 10)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  data = {
    train = "tokens/caf\xe9.bin",  -- @error (Latin-1, not UTF-8)
  },
})
