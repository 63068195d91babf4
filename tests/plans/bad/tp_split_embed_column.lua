-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: tp_split.embed = "column": the embedding splits as "vocab"
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  tp_split = { embed = "column" },  -- @error
})
