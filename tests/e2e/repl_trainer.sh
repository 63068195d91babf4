#!/usr/bin/env bash
# `tycho repl` driving a live trainer under mpirun (piped input): the plan opened as t steps to
# the losses `tycho run` prints for the same steps; a step on part of the job (@0) is refused at
# its first collective, naming the group, and the trainer goes on to the same losses; coordinate
# selectors pick by t's mesh; a trainer dropped on every rank is closed (collectively) at the end
# of the chunk; Ctrl-C (SIGINT to rank 0) during t:step(n) stops every rank at the same step and
# the session goes on.
# usage: repl_trainer.sh TYCHO   (run from the source folder)
set -u
tycho=$1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# the reference: three steps of tycho run on 2 ranks (dp 2)
mpirun -np 2 "$tycho" run plans/tiny.lua --set train.steps=20 --set train.eval_every=0 \
  --set log.metrics="$tmp/m.jsonl" >/dev/null 2>&1 || fail "tycho run failed"
ref=$(grep '"step": 2,' "$tmp/m.jsonl" | sed 's/.*"loss": \([^,]*\),.*/\1/')
[ -n "$ref" ] || fail "no step 2 in tycho run's metrics"

printf '%s\n' 't:step(2)' '=t.step' '@0 t:step(1)' '=t.step' 'x = t:step(1)' \
  'print(string.format("%.12g", x))' '@dp=1 print("dp1", t.rank)' 'u = tycho.open("plans/tiny.lua")' \
  'v = tycho.open("plans/tiny.lua", {"mesh..tp=2"})' \
  'u = nil' 'collectgarbage()' |
  mpirun -np 2 "$tycho" repl plans/tiny.lua --set train.steps=20 --set train.eval_every=0 >"$tmp/out" 2>"$tmp/err"
rc=$?
out=$(cat "$tmp/out")
[ "$rc" -eq 1 ] || fail "the refused @0 step is a failed chunk: exit 1 expected, got $rc"$'\n'"$out"
grep -qF '[0,1] 2' <<<"$out" || fail "t.step is not 2 on both ranks after t:step(2)"$'\n'"$out"
grep -qF '[0] stdin:1: step 3: gradient all-reduce: all-reduce on group dp needs ranks 1, which this chunk does not run on (it runs on 0)' <<<"$out" ||
  fail "the @0 step was not refused at its all-reduce"$'\n'"$out"
[ "$(grep -cF '[0,1] 2' <<<"$out")" -ge 2 ] || fail "the refused step moved t.step"$'\n'"$out"
want=$(printf '%.12g' "$ref")
grep -qF "[0,1] $want" <<<"$out" || fail "step 2's loss is not tycho run's $want"$'\n'"$out"
grep -qF '[1] dp1	1' <<<"$out" || fail "@dp=1 did not select rank 1"$'\n'"$out"
grep -qF '[0,1] stdin:1: --set mesh..tp=2: mesh..tp: the path has an empty component' <<<"$out" ||
  fail "an override path with an empty component was not refused"$'\n'"$out"
grep -q 'rank 1: not in' "$tmp/err" && fail "a rank was left waiting"

interrupt_session() { # interrupt_session CHUNK SIGNALS: the chunk, SIGINT to rank 0 SIGNALS times
  rm -f "$tmp/in"
  mkfifo "$tmp/in"
  mpirun -np 2 "$tycho" repl plans/tiny.lua --set train.steps=100000 --set log.every=100000 \
    <"$tmp/in" >"$tmp/out4" 2>"$tmp/err4" &
  local job=$! p r0=
  exec 3>"$tmp/in"
  printf '%s\n' "$1" >&3
  for _ in $(seq 1200); do # 120 s: mpirun starts slowly on a loaded machine
    for p in $(pgrep -f "$tycho repl plans/tiny.lua --set train.steps=100000 --set log.every=100000"); do # this build's only
      tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=0' && r0=$p
    done
    [ -n "$r0" ] && break
    sleep 0.1
  done
  [ -n "$r0" ] || { exec 3>&-; kill $job 2>/dev/null; wait $job
    fail "rank 0's process was not found (exit $?): $(cat "$tmp/out4" "$tmp/err4")"; }
  sleep 3
  kill -INT "$r0"
  [ "$2" -ge 2 ] && { sleep 0.5; kill -INT "$r0"; }
  sleep 1
  printf '%s\n' '=t.step' '=t.step > 0' >&3 2>/dev/null
  exec 3>&-
  wait $job
  session_rc=$?
}

# Ctrl-C: rank 0 gets SIGINT during a long t:step; every rank stops at the same step
interrupt_session 't:step(100000)' 1
out2=$(cat "$tmp/out4")
[ "$session_rc" -eq 0 ] || fail "the interrupted session exited $session_rc"$'\n'"$out2"$'\n'"$(cat "$tmp/err4")"
grep -q '^\[0\] interrupted at step [0-9]*' <<<"$out2" || fail "no 'interrupted at step N'"$'\n'"$out2"
n=$(sed -n 's/^\[0\] interrupted at step \([0-9]*\)$/\1/p' <<<"$out2")
grep -qF "[0,1] $n" <<<"$out2" || fail "t.step is not $n on both ranks after the interrupt"$'\n'"$out2"
grep -qF '[0,1] true' <<<"$out2" || fail "the session did not go on after the interrupt"$'\n'"$out2"

# a loop of steps: the interrupted t:step returns, the next one ends the chunk on every rank;
# a chunk with no step boundary (a Lua loop, several ranks) goes on after one Ctrl-C, and a second
# within 2 s ends the job with exit 130
interrupt_session 'for i = 1, 100000 do t:step(10) end' 1
grep -q 'interrupted at step [0-9]* (the chunk stops: it was interrupted before)' "$tmp/out4" ||
  fail "the loop of steps did not end"$'\n'"$(cat "$tmp/out4")"
interrupt_session 'for i = 1, 1e12 do end' 2
[ "$session_rc" -eq 130 ] || fail "two Ctrl-C within 2 s must end the job with 130 (got $session_rc)"
grep -q 'interrupted twice: ending the job' "$tmp/err4" || fail "no message for the second Ctrl-C"

# a chunk that diverges (a step on rank 0 only, no selector): the watchdog, with the REPL's
# --timeout, names where each rank waits and ends the job; it never hangs
start=$SECONDS
printf '%s\n' 'if t.rank == 0 then t:step(1) end' '=1' |
  timeout 240 mpirun -np 2 "$tycho" repl plans/tiny.lua --timeout 3 >"$tmp/out3" 2>"$tmp/err3"
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "a diverged chunk must end the job with the diagnosis (exit $rc)"
grep -q "all-reduce on dp (seq 0.*has not finished after 3" "$tmp/err3" || fail "no watchdog diagnosis"$'\n'"$(cat "$tmp/err3")"
grep -q "rank 1: has started no dp operation; it waits, untimed, in the REPL's" "$tmp/err3" ||
  fail "the diagnosis does not say where rank 1 waits"$'\n'"$(cat "$tmp/err3")"
[ $((SECONDS - start)) -lt 30 ] || fail "the diagnosis took $((SECONDS - start)) s"

echo "ok: repl with a trainer (interrupted at step $n)"
