-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: --set mesh.tpp=2: mesh.tpp: unknown field (did you mean "tp"?)
-- args: --set mesh.tpp=2
local tycho = require "tycho"
local base = require "_base"
return base
