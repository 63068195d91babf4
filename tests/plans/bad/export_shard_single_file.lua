-- A malformed plan: tycho check must refuse it with exit code 2. A single-file export has no
-- shards, so a shard size would be accepted and do nothing.
-- expect: export.shard_mb is the shard size of a Hugging Face folder; set export.format = "hf", or leave shard_mb out (a safetensors export is one file)
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  export = {
    path = "out.safetensors",
    shard_mb = 100,  -- @error
  },
})
