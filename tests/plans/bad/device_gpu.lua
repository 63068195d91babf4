-- A malformed plan: tycho check must refuse it with exit code 2. "gpu" is one edit from "cpu",
-- but the hint names the GPU runtime's device, "cuda".
-- expect: --set device=gpu: device = "gpu": must be one of "auto", "cpu", "cuda" (did you mean "cuda"?
-- args: --set device=gpu
local tycho = require "tycho"
local base = require "_base"
return base
