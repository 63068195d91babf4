-- A malformed plan written with keywords against braces (`return{`, `and{`, `or{`, `in{`):
-- valid Lua, so it must compile as written and its error must still name its line.
-- expect: mesh.tp = 0: must be an integer in 1..
local tycho = require "tycho"
local big = false
local function shape() return{ dim = 64, n_heads = 4, ffn_dim = 128, vocab = 64, max_seq = 64 } end
local model = big and{ n_layers = 8 } or{ n_layers = 2 }
for k, v in pairs{ n_kv_heads = 2 } do model[k] = v end
for k, v in pairs(shape()) do model[k] = v end
local mesh = big and{ tp = 2 } or{
  tp = 0,  -- @error
}
return tycho.plan{ model = model, mesh = mesh, batch = { global = 8, seq = 32 } }
