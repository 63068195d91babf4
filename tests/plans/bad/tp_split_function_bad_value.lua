-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: returned by the tp_split function for layer 2
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  tp_split = function(layer, module)  -- @error
    if layer == 2 then return "diagonal" end
  end,
})
