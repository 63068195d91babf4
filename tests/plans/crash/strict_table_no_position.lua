-- A crash input (issue 14.2): a strict table whose __index raises a message without a position
-- (error(msg, 0)) while the plan reader reads it; the message names the field and the line the
-- table was written on.
-- expect: name: no field name
local tycho = require "tycho"
return tycho.plan(setmetatable({  -- @error
  model = { n_layers = 4, dim = 64, n_heads = 4, n_kv_heads = 2, ffn_dim = 192, vocab = 64, max_seq = 64 },
  mesh = { tp = 1, pp = 1, dp = "auto" },
  batch = { global = 8, micro = 2, seq = 32 },
  data = { synthetic = "addition" },
}, { __index = function(_, k) error("no field " .. k, 0) end }))
