-- A malformed plan: tycho check must refuse it with exit code 2.
-- expect: attempt to compare nil with number (in the tp_split function, called for (nil, "embed"))
local tycho = require "tycho"
local base = require "_base"
return tycho.extend(base, {
  tp_split = function(layer, module)
    if layer < 2 then return "replicate" end  -- @error
  end,
})
