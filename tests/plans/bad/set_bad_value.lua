-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: --set mesh.tp=0: mesh.tp = 0: must be an integer in 1..
-- args: --set mesh.tp=0
local tycho = require "tycho"
local base = require "_base"
return base
