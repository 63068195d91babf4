#!/usr/bin/env bash
# The ranks' side of the REPL's front-end (`tycho repl --frontend DIR`, host/repl/link.h), driven
# by tests/tools/linkdrive.c playing the front-end: every rank connects and says hello with its
# rank, the job's size and the session's token; a chunk's output comes back line by line while
# the chunk runs (a line printed 2 s before the chunk ends arrives 2 s before its end), then its
# end with the rank's flags; an interrupt stops a pure Lua loop ("interrupted!", the failed flag)
# on one rank and on two, and on two ranks stops t:step at the same step everywhere ("interrupted
# at step N", the trainer usable); completion answers full words, fields of the trainer
# included; ranks idle at the prompt use no CPU; a quit ends every rank with its code.
# usage: repl_link.sh TYCHO   (run from the source folder; ctest sets $TYCHO_LINKDRIVE)
set -u
tycho=$(readlink -f "$1")
drive=${TYCHO_LINKDRIVE:?"the path of the linkdrive tool (ctest sets it)"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- transcript"; cat "$tmp/out"; exit 1; }
has() { grep -qxF -- "$1" <(cut -d' ' -f2- "$tmp/out") || fail "no line '$1'"; }
# the time of the first frame of rank $1 whose type and payload begin with $2
at() { awk -v r="$1" -v w="$2" '$2 == r && index(substr($0, index($0, $3)), w) == 1 { print $1; exit }' "$tmp/out"; }

# one rank, without mpirun
mkdir -m 700 "$tmp/one"
cat > "$tmp/one.script" <<'SCRIPT'
hello 1
chunk print(1+1)
until done
chunk print("before") local c = os.clock() while os.clock() - c < 2 do end print("after")
until done
chunk for i = 1, 1e12 do end
sleep 1
interrupt
until done
complete tycho.op
until candidates
chunk =1
until done
quit 3
exit 3
SCRIPT
"$drive" "$tmp/one" "$tmp/one.script" -- "$tycho" repl --frontend "$tmp/one" >"$tmp/out" 2>&1 ||
  fail "one rank: the driver failed"
has "0 1 token"
has "0 output 2\\n"
[ "$(grep -c ' 0 done 1 0$' "$tmp/out")" -eq 2 ] || fail "one rank: print(1+1) and the 2 s chunk must end with 'done 1 0'"
before=$(at 0 "output before") after=$(at 0 "output after")
[ -n "$before" ] && [ -n "$after" ] || fail "one rank: the lines of the 2 s chunk did not come"
awk -v b="$before" -v a="$after" 'BEGIN { exit !(a - b > 1.0) }' ||
  fail "one rank: a line printed 2 s before the chunk's end came with the end (at $before, the end at $after)"
has "0 output interrupted!\\nstack traceback:\\n"
has "0 done 3 0"
has "0 candidates tycho.open\\n"
has "0 output stdin:1: unexpected symbol near '='\\n" # the front-end's =expr is its own: a rank runs Lua
grep -qx "exit 3" "$tmp/out" || fail "no exit 3"

# two ranks under mpirun, a trainer
mkdir -m 700 "$tmp/two"
cat > "$tmp/two.script" <<'SCRIPT'
hello 2
chunk print(1+1)
until done
chunk t = tycho.open("plans/tiny.lua", {"train.steps=100000", "log.every=1000", "train.eval_every=0"})
until done
complete t.
until candidates
complete t:ste
until candidates
idle 3 0.3
chunk t:step(100000)
sleep 2
interrupt
until done
chunk print("at", t.step)
until done
chunk for i = 1, 1e12 do end
sleep 1
interrupt
until done
chunk @1 quit(5)
until done
quit 5
exit 5
SCRIPT
timeout 300 "$drive" "$tmp/two" "$tmp/two.script" -- mpirun -np 2 "$tycho" repl --frontend "$tmp/two" \
  >"$tmp/out" 2>&1 || fail "two ranks: the driver failed"
has "0 2 token"
has "1 2 token"
has "0 output 2\\n"
has "1 output 2\\n"
cands=$(grep ' 0 candidates t\.close' "$tmp/out")
for w in t.mesh t.rank t.step t.world t.dp t.path t.step t.close t.memory; do
  grep -qF "$w\\n" <<<"$cands" || fail "two ranks: 't.' does not offer $w"
done
has "0 candidates t:step\\n"
stop=$(sed -n 's/.* 0 output interrupted at step \([0-9]*\)\\n$/\1/p' "$tmp/out")
[ -n "$stop" ] && [ "$stop" -gt 0 ] || fail "two ranks: t:step(100000) was not interrupted at a step"
has "0 output at	$stop\\n"
has "1 output at	$stop\\n"
[ "$(grep -c ' done 3 0$' "$tmp/out")" -eq 2 ] || fail "two ranks: the interrupted loop must end 'done 3 0' on both ranks"
[ "$(grep -c ' output interrupted!\\nstack traceback:\\n$' "$tmp/out")" -eq 2 ] ||
  fail "two ranks: the interrupted loop must say interrupted! on both ranks"
has "0 done 0 0" # rank 0 not selected by @1
has "1 done 5 5"
grep -qx "exit 5" "$tmp/out" || fail "no exit 5"
echo "ok: the ranks' side of the REPL's front-end"
