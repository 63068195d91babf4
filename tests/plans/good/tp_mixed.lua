-- The data-parallel test plan with three layers split three ways, for the tensor-parallel
-- equivalence tests (tests/mpi.cmake): layer 0 whole on every rank, layer 1 with every split
-- turned around (row q/k/v: attention on all heads after an all-reduce; column o and down
-- gathered back; row gate with column up: SwiGLU on an ffn slice), layer 2 with key heads
-- replicated and value heads row-split feeding a head-split attention; embedding replicated,
-- head split by vocabulary. Each must reproduce the serial run.
local tycho = require "tycho"
local base = require "dp_small"

local turned = { q = "row", k = "row", v = "row", o = "column", gate = "row", up = "column", down = "column" }
local mixed = { q = "column", k = "replicate", v = "row", o = "row", gate = "column", up = "replicate", down = "row" }

return tycho.extend(base, {
  name = "tp-mixed",
  model = { n_layers = 3 },
  tp_split = function(layer, module)
    if layer == nil then
      return module == "embed" and "replicate" or "vocab"
    end
    if layer == 0 then return "replicate" end
    if layer == 1 then return turned[module] end
    return mixed[module]
  end,
})
