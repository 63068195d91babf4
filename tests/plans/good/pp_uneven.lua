-- The data-parallel test plan with five layers on two pipeline stages of uneven size (the first
-- holds the embedding and one layer, the second four layers and the head), for the pipeline
-- equivalence tests (tests/mpi.cmake): it must reproduce the serial run.
local tycho = require "tycho"
local base = require "dp_small"

return tycho.extend(base, {
  name = "pp-uneven",
  model = { n_layers = 5 },
  mesh = { pp = 2 },
  stages = { { "embed", 0 }, { 1, 2, 3, 4, "head" } },
})
