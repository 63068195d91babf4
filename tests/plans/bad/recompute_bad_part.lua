-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: recompute[1] = "attn_cor": must be one of "attn_norm", "attn_core"
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  recompute = { "attn_cor" },  -- @error
})
