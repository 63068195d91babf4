#!/usr/bin/env bash
# `tycho repl` on 4 ranks never hangs silently and never spins: a chunk that sends some ranks into
# a collective the others skip (rank 0 included or not: a step without rank 0, a step after
# `@0,1 t:close()`, an evaluation without rank 0) ends within --timeout and a few seconds with
# the watchdog's diagnosis naming which ranks wait where, printed once per job (the lowest waiting
# rank's), and the job exits nonzero; a session
# idle at the prompt (input a FIFO kept open) uses next to no CPU on any rank.
# usage: repl_no_hang.sh TYCHO   (run from the source folder)
set -u
tycho=$1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

now() { date +%s.%N; }

# divergent CHUNK WANT...: runs `print("go")` then CHUNK on 4 ranks with --timeout 3 under a 300 s
# guard; from "go" (the chunk before the divergent one ended) to the job's end at most 60 s: the
# watchdog's 3 s, the abort's grace and a loaded machine's slowness, well before the guard (a
# hang detector, not a speed test)
divergent() {
  local chunk=$1
  shift
  printf '%s\n' 'print("go")' "$chunk" >"$tmp/chunks.lua"
  timeout 300 mpirun -np 4 "$tycho" repl plans/tiny.lua "$tmp/chunks.lua" --set train.eval_every=0 --timeout 3 \
    >"$tmp/out" 2>"$tmp/err" &
  local job=$! t0=
  while kill -0 $job 2>/dev/null; do
    grep -q '^\[0-3\] go$' "$tmp/out" 2>/dev/null && { t0=$(now); break; }
    sleep 0.05
  done
  wait $job
  local rc=$? t1
  t1=$(now)
  [ "$rc" -ne 124 ] || fail "'$chunk' hung: killed by the 300 s guard"$'\n'"$(cat "$tmp/out" "$tmp/err")"
  [ -n "$t0" ] || fail "'$chunk': the session ended before its first chunk (exit $rc)"$'\n'"$(cat "$tmp/out" "$tmp/err")"
  [ "$rc" -ne 0 ] || fail "'$chunk': exit 0 after a collective some ranks skipped"
  local took
  took=$(echo "$t1 - $t0" | bc)
  [ "$(echo "$took <= 60" | bc)" -eq 1 ] || fail "'$chunk' ended $took s after it began: more than 60 s with --timeout 3"
  [ "$(grep -c 'comm watchdog: .* has not finished after' "$tmp/err")" -eq 1 ] ||
    fail "'$chunk': the diagnosis must be printed once per job, not once per waiting rank"$'\n'"$(cat "$tmp/err")"
  local want
  for want in "$@"; do
    grep -qF -- "$want" "$tmp/err" || fail "'$chunk': no \"$want\" in the diagnosis"$'\n'"$(cat "$tmp/err")"
  done
  echo "'$chunk': ended $took s after it began (exit $rc)"
}

# ranks 1-3 step without rank 0: they wait at the step's first boundary, rank 0 in the gather
# that ends the chunk (a wait the watchdog never times: without the others' diagnosis, a hang)
divergent 'if t.rank ~= 0 then t:step(1) end' \
  "comm watchdog: the REPL's interrupt check at a step boundary has not finished after 3" \
  "repl-interrupt group: world ranks 0 1 2 3; asking the others where they are:" \
  "rank 0: has started no repl-interrupt operation; it waits, untimed, in the REPL's end-of-chunk gather for"
# the trainer closed on ranks 0 and 1 only: the step runs on 2 and 3 alone
divergent $'@0,1 t:close()\nt:step(1)' \
  "comm watchdog: the REPL's interrupt check at a step boundary has not finished after 3" \
  "rank 0: has started no repl-interrupt operation; it waits, untimed, in the REPL's end-of-chunk gather for"
grep -qE "rank [23]: has started no repl-interrupt operation; it waits in the REPL's interrupt check" "$tmp/err" ||
  fail "the diagnosis does not name the other rank waiting at the step boundary"$'\n'"$(cat "$tmp/err")"
# a model collective without rank 0: ranks 1-3 do not leave the abort to rank 0, which waits untimed
divergent 'if t.rank ~= 0 then t:eval() end' \
  "on dp (seq 0," "has not finished after 3" \
  "rank 0: has started no dp operation; it waits, untimed, in the REPL's end-of-chunk gather for"

# the same without rank 0 through the front-end (tycho repl -n 4): the diagnosis, then the
# front-end names a rank that ended and exits nonzero
t0=$(now)
printf '%s\n' 'if t.rank ~= 0 then t:step(1) end' '=1' |
  timeout 300 "$tycho" repl plans/tiny.lua -n 4 --set train.eval_every=0 --timeout 3 >"$tmp/out" 2>"$tmp/err"
rc=$?
took=$(echo "$(now) - $t0" | bc)
[ "$rc" -ne 124 ] || fail "the front-end's divergent chunk hung"$'\n'"$(cat "$tmp/out" "$tmp/err")"
[ "$rc" -ne 0 ] || fail "the front-end's divergent chunk: exit 0"
[ "$(echo "$took <= 90" | bc)" -eq 1 ] || fail "the front-end's divergent chunk ended after $took s (start, --timeout 3 and the abort: at most 90 s)"
[ "$(grep -c 'comm watchdog: .* has not finished after 3' "$tmp/err")" -eq 1 ] ||
  fail "the front-end must show the diagnosis once (not once per waiting rank)"$'\n'"$(cat "$tmp/err")"
grep -qE "^tycho repl: rank [0-3] ended during the chunk" "$tmp/err" || fail "the front-end named no rank"$'\n'"$(cat "$tmp/err")"
echo "front-end: the divergent chunk ended the session $took s after the start (exit $rc)"

# idle at the prompt: every rank blocks without polling; their CPU time over 3 s idle
mkfifo "$tmp/in"
mpirun -np 4 "$tycho" repl --timeout 37 <"$tmp/in" >"$tmp/out" 2>"$tmp/err" &
job=$!
exec 3>"$tmp/in"
printf '%s\n' 'print("ready")' >&3
for _ in $(seq 1200); do # 120 s: mpirun starts slowly on a loaded machine
  grep -q '^\[0-3\] ready$' "$tmp/out" && break
  sleep 0.1
done
grep -q '^\[0-3\] ready$' "$tmp/out" || { exec 3>&-; wait $job; fail "the idle session did not start: $(cat "$tmp/out" "$tmp/err")"; }
ranks=()
for p in $(pgrep -f "$tycho repl --timeout 37"); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK=' && ranks+=("$p")
done
cpu() { # utime + stime of the rank processes, in clock ticks
  local p s=0
  for p in "${ranks[@]}"; do
    s=$((s + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  echo $s
}
sleep 0.5 # the ranks settle into the wait for the next chunk
c0=$(cpu)
sleep 3
c1=$(cpu)
printf '%s\n' 'quit()' >&3
exec 3>&-
wait $job
rc=$?
[ "${#ranks[@]}" -eq 4 ] || fail "found ${#ranks[@]} rank processes, not 4"
[ "$rc" -eq 0 ] || fail "the idle session exited $rc: $(cat "$tmp/out" "$tmp/err")"
hz=$(getconf CLK_TCK)
used=$(echo "scale=3; ($c1 - $c0) / $hz" | bc)
echo "idle: 4 ranks used $used s of CPU in 3 s"
[ "$(echo "$used < 0.2" | bc)" -eq 1 ] || fail "4 idle ranks used $used s of CPU in 3 s (at most 0.2 s): a wait polls"
echo "repl_no_hang: ok"
