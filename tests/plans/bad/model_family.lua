-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: model.family = "gpt2": must be one of "llama"
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  model = { family = "gpt2" },  -- @error
})
