-- The data-parallel test plan with four layers placed on two pipeline stages by a function
-- (three layers and the embedding on the first stage, one and the head on the second), for the
-- pipeline equivalence tests (tests/mpi.cmake): it must reproduce the serial run.
local tycho = require "tycho"
local base = require "dp_small"

return tycho.extend(base, {
  name = "pp-function",
  model = { n_layers = 4 },
  mesh = { pp = 2 },
  stages = function(layer) return layer < 3 and 0 or 1 end,
})
