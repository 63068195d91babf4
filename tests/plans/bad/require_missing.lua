-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: module 'models.llama3' not found in the plan search path
local m = require "models.llama3"  -- @error
return m
