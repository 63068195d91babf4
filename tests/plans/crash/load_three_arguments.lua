-- load(chunk, name, mode) gave the chunk the chunk itself as its environment (the function
-- pushed at argument 4's slot was taken for an env); it gets the plan's globals.
-- expect: load gave abab
local base = require "_base"
local f = load("return string.rep('ab', 2)", "chunk", "t")
error("load gave " .. f())  -- @error
return base
