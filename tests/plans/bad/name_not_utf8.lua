-- A malformed plan: tycho check must refuse it with exit code 2. The name reaches checkpoint
-- manifests and `check --json`, which are UTF-8: a name that is not would make them unreadable.
-- expect: name is not valid UTF-8 (byte 0xff at offset 4)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  name = "run-\xff\xfe",  -- @error
})
