#!/usr/bin/env bash
# `tycho repl` with piped input, on one rank and on four: values of `=expr` and of expression
# lines, print and io.write captured per rank, continuation lines, an error with its traceback
# after which the session goes on, identical lines of several ranks collapsed under one prefix,
# selectors by rank (@1-2, @0,3) and their refusals, an error on one rank only, quit(code) as
# the exit code of every rank, exit 1 when a chunk failed, and help().
# usage: repl_basics.sh TYCHO   (run from the source folder)
set -u
tycho=$1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fail() { echo "FAIL: $*"; exit 1; }
same() { # same NAME EXPECTED ACTUAL
  [ "$2" == "$3" ] || { diff <(printf '%s\n' "$2") <(printf '%s\n' "$3"); fail "$1: output differs (above: < expected, > got)"; }
}

out=$(printf '%s\n' 'x = 1 + 2' '=x' 'print("hi", x)' 'function f(a)' '  return a * 2' 'end' 'f(21)' \
  'error("boom")' 'io.write("a", 1, "\n")' '=x + 1' | "$tycho" repl 2>/dev/null)
rc=$?
want='> x = 1 + 2
> =x
3
> print("hi", x)
hi	3
> function f(a)
>>   return a * 2
>> end
> f(21)
42
> error("boom")
stdin:1: boom
stack traceback:
	[C]: in function '"'"'error'"'"'
	stdin:1: in main chunk
> io.write("a", 1, "\n")
a1
> =x + 1
4'
same "one rank" "$want" "$out"
[ "$rc" -eq 1 ] || fail "one rank: a failed chunk in piped input must exit 1 (got $rc)"

out=$(printf '%s\n' '=2 + 2' 'print("x")' | "$tycho" repl 2>/dev/null)
[ $? -eq 0 ] || fail "a session without errors exits 0"

rank='tonumber(os.getenv("OMPI_COMM_WORLD_RANK"))'
out=$(printf '%s\n' "function rank() return $rank end" '=1 + 1' '=rank()' 'print("parity", rank() % 2)' \
  '@1-2 print("sel", rank())' '@0,3 =rank() * 10' 'if rank() == 2 then error("only on 2") end' \
  'for i = 1, 2 do print("line", i) end' '@9 print(1)' '@2-1 print(1)' '@dp=0 print(1)' '=rank() + 100' |
  mpirun -np 4 "$tycho" repl 2>/dev/null)
want='> function rank() return '"$rank"' end
> =1 + 1
[0-3] 2
> =rank()
[0] 0
[1] 1
[2] 2
[3] 3
> print("parity", rank() % 2)
[0,2] parity	0
[1,3] parity	1
> @1-2 print("sel", rank())
[1] sel	1
[2] sel	2
> @0,3 =rank() * 10
[0] 0
[3] 30
> if rank() == 2 then error("only on 2") end
[2] stdin:1: only on 2
[2] stack traceback:
[2] 	[C]: in function '"'"'error'"'"'
[2] 	stdin:1: in main chunk
> for i = 1, 2 do print("line", i) end
[0-3] line	1
[0-3] line	2
> @9 print(1)
[0-3] @9: rank 9 is not in the job (ranks 0-3)
> @2-1 print(1)
[0-3] @2-1: a range is a-b with a ≤ b
> @dp=0 print(1)
[0-3] a coordinate selector needs the trainer t (tycho repl PLAN.lua, or t = tycho.open(...))
> =rank() + 100
[0] 100
[1] 101
[2] 102
[3] 103'
same "four ranks" "$want" "$out"

# quit(code) on one rank ends the session on every rank with that code
printf '%s\n' 'x = 1' "@2 quit(3)" 'print("not reached")' | mpirun -np 4 "$tycho" repl >/tmp/repl_quit.$$ 2>&1
rc=$?
grep -q 'not reached' /tmp/repl_quit.$$ && fail "a chunk ran after quit(3)"
rm -f /tmp/repl_quit.$$
[ "$rc" -eq 3 ] || fail "quit(3) must end the job with exit code 3 (got $rc)"
# a plan that does not open: tycho run's refusal (exit 2) before the session, on one rank and on two
for np in 1 2; do
  out=$(mpirun -np $np "$tycho" repl plans/tyni.lua 2>&1 < /dev/null)
  rc=$?
  [ "$rc" -eq 2 ] || fail "a missing plan on $np rank(s): exit $rc, expected 2: $out"
  [ "$(grep -cxF 'tycho: plan error: plans/tyni.lua: cannot open: No such file or directory' <<<"$out")" -eq 1 ] ||
    fail "a missing plan on $np rank(s): expected tycho run's message once: $out"
  grep -q '^> ' <<<"$out" && fail "a missing plan on $np rank(s): a prompt showed: $out"
done

# help(): the REPL's commands, the module's functions and the trainer's fields and methods, one
# line each, from the tables completion uses; help("t:step") that one line; t:help() and help(x)
out=$(printf '%s\n' 'help()' 'help("t:step")' 't = tycho.open("plans/tiny.lua")' 't:help()' \
  'help(t:param("embed"))' 'help("nothing")' | "$tycho" repl 2>&1)
squeezed=$(tr -s ' ' <<<"$out")
for line in ' quit([code]) end the session' ' tycho.open(path [, overrides]) compile' ' t:step([n]) run n steps' \
  ' t:save([dir]) a checkpoint' ' t:eval() the plan' ' t.step optimizer steps done' \
  " t:set's fields: optimizer.lr" ' x:norm() the L2 norm'; do
  grep -qF -- "$line" <<<"$squeezed" || fail "help: no line '$line' in: $out"
done
[ "$(grep -cF ' t:step([n]) run n steps' <<<"$squeezed")" -eq 3 ] ||
  fail "help(), help(\"t:step\") and t:help() must each print t:step's line once: $out"
one=$(sed -n '/^> help("t:step")/,/^> /p' <<<"$out")
[ "$(wc -l <<<"$one")" -eq 3 ] || fail "help(\"t:step\") must print one line: $one"
grep -q "help: nothing is named 'nothing'" <<<"$out" || fail "help(\"nothing\") must say so: $out"
echo "ok: repl basics"
