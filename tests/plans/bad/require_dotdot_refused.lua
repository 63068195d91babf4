-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: require '..models.llama2': a plan module name is a dotted name
local m = require "..models.llama2"  -- @error
return m
