-- A hang (issue 14.3): the same backtracking pattern through gsub and gmatch, refusals caught
-- by pcall in a loop, still ends at the instruction limit.
-- expect: plan exceeded the instruction limit of 1000000 Lua instructions
-- args: --max-instructions 1000000
local tycho = require "tycho"
local s, p = ("a"):rep(3000), (".-"):rep(15) .. "b"
while true do
  pcall(string.gsub, s, p, "")
  pcall(function() for _ in s:gmatch(p) do end end)
  pcall(string.match, s, p)
end
return tycho.plan {}
