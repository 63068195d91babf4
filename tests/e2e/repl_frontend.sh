#!/usr/bin/env bash
# `tycho repl PLAN -n 4` at a terminal (a pseudo-terminal driven by tests/tools/ptydrive.c): the
# front-end starts 4 ranks itself; the prompt shows before any input; a value all ranks return
# shows once ([0-3] 2); t:step's progress line arrives while the chunk still runs, Ctrl-C stops
# it at a step boundary on every rank and the trainer answers after; the idle ranks at the prompt
# use next to no CPU (blocked, not spinning); killing one rank ends the session with a message
# naming it. Then Ctrl-C twice during a chunk ends the job (exit 130, no rank left), and Ctrl-D
# ends a session with 0; a slow start says what it waits for. The session's folder is gone after
# each. A plan that does not open is refused (exit 2, tycho run's message) before the launcher
# starts.
# usage: repl_frontend.sh TYCHO   (run from the source folder; ctest sets $TYCHO_PTYDRIVE)
set -u
tycho=$(readlink -f "$1")
drive=${TYCHO_PTYDRIVE:?"the path of the ptydrive tool (ctest sets it)"}
command -v mpirun >/dev/null 2>&1 || { echo "skip: no mpirun"; exit 77; }
home=$(mktemp -d)
trap 'pkill -KILL -f -- "--frontend $home/" 2>/dev/null; rm -rf "$home"' EXIT
export HOME="$home" TMPDIR="$home" OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1
repl=(repl plans/tiny.lua -n 4 --set train.steps=100000 --set log.every=10)

fail() { echo "FAIL: $*"; exit 1; }
# the pids of this test's ranks (the launcher's command line names the folder too: not it)
ranks() { pgrep -f -- "^$tycho repl --frontend $home/"; }
# user + system CPU ticks of the given pids, summed
ticks() {
  local sum=0
  for p in "$@"; do
    read -r -a f < "/proc/$p/stat" || continue
    sum=$((sum + f[13] + f[14]))
  done
  echo "$sum"
}
no_leftovers() {
  sleep 0.5
  [ -z "$(pgrep -f -- "--frontend $home/")" ] || fail "$1: ranks are left: $(pgrep -af -- "--frontend $home/")"
  ! ls -d "$home"/tycho-repl-* >/dev/null 2>&1 || fail "$1: the session's folder is left: $(ls -d "$home"/tycho-repl-*)"
}

# 1. prompt, value, live progress, Ctrl-C, idle CPU, a killed rank
cat > "$home/main.script" <<SCRIPT
timeout 40
expect > 
timeout 15
send =1+1\r
expect [0-3] 2
expect > 
send t:step(100000)\r
timeout 30
expect 10/100000 |
timeout 15
send \x03
expect interrupted at step
expect > 
send =t.step > 0\r
expect [0-3] true
expect > 
send io.open("$home/idle", "w"):close()\r
expect > 
timeout 30
expect ended while the session was at the prompt
exit 1
SCRIPT
"$drive" "$home/main.script" -- "$tycho" "${repl[@]}" &
driver=$!
for _ in $(seq 1200); do [ -e "$home/idle" ] && break; sleep 0.1; done
[ -e "$home/idle" ] || { wait $driver; fail "the session never reached the idle point"; }
sleep 1 # the chunk's end and the prompt
pids=$(ranks)
[ "$(echo "$pids" | wc -w)" -eq 4 ] || fail "expected 4 ranks, found: $pids"
before=$(ticks $pids)
sleep 3
after=$(ticks $pids)
hz=$(getconf CLK_TCK)
# 0.2 s of CPU over 3 s idle, all 4 ranks together: a rank that polls would use a core's worth
[ $((after - before)) -lt $((hz / 5)) ] || fail "idle ranks used $((after - before)) ticks (of $hz a second) in 3 s"
victim=$(echo "$pids" | tail -n 1)
kill -9 "$victim"
wait $driver || fail "the terminal session (exit $?)"
no_leftovers "a killed rank"

# 2. Ctrl-C twice within 2 s during a chunk ends the job (a chunk no step boundary stops: the
# first Ctrl-C cannot end it)
cat > "$home/twice.script" <<'SCRIPT'
timeout 40
expect > 
send t:step(1) os.execute("sleep 10")\r
sleep 1.5
send \x03
expect (interrupt: every rank stops
sleep 0.3
send \x03
timeout 15
expect interrupted twice
exit 130
SCRIPT
"$drive" "$home/twice.script" -- "$tycho" "${repl[@]}" || fail "Ctrl-C twice (exit $?)"
no_leftovers "Ctrl-C twice"

grep -qF '=1+1' "$home/.tycho_history" || fail "~/.tycho_history does not hold the chunks of a session that died"

# 3. completion asks rank 0; Ctrl-C at the prompt clears the line, at a continuation line drops
# the whole chunk; Ctrl-D ends the session: every rank ends, exit 0
cat > "$home/eof.script" <<'SCRIPT'
timeout 40
expect > 
timeout 15
send =tycho.ope\t
expect =tycho.open
send \x15\r
expect > 
send not lua at all
send \x03
expect > 
send for i = 1, 2 do\r
expect >> 
send print(i)\r
expect >> 
send \x03
expect > 
send =6 * 7\r
expect [0,1] 42
absent [0,1] 1
absent syntax error
expect > 
send \x04
timeout 20
exit 0
SCRIPT
"$drive" "$home/eof.script" -- "$tycho" repl -n 2 || fail "Ctrl-D (exit $?)"
no_leftovers "Ctrl-D"

# 4. SIGTERM to the front-end ends the job and removes the session's folder
"$tycho" repl -n 2 < <(sleep 20) > "$home/term.out" 2>&1 &
frontend=$!
for _ in $(seq 1200); do [ "$(ranks | wc -l)" -eq 2 ] && break; sleep 0.1; done
sleep 0.5
kill -TERM $frontend
wait $frontend
rc=$?
[ $rc -eq 143 ] || fail "SIGTERM: exit $rc, expected 143: $(cat "$home/term.out")"
no_leftovers "SIGTERM"

# 5. a slow start (a launcher that takes 3 s) says what the prompt waits for, then the prompt comes
printf '#!/bin/sh\nsleep 3\nexec mpirun "$@"\n' > "$home/slow"
chmod +x "$home/slow"
cat > "$home/slow.script" <<'SCRIPT'
timeout 30
expect tycho repl: waiting for 2 ranks to connect (0 so far)...
timeout 60
expect > 
timeout 15
send =1+1\r
expect [0,1] 2
expect > 
send \x04
timeout 20
exit 0
SCRIPT
"$drive" "$home/slow.script" -- "$tycho" repl -n 2 --launcher "$home/slow -np {n}" || fail "a slow start (exit $?)"
no_leftovers "a slow start"

# 6. refusals before anything starts (exit 2), and a launcher that cannot start the ranks
expect_fail() { # CODE MESSAGE ARGS...
  local code=$1 msg=$2
  shift 2
  out=$("$tycho" "$@" 2>&1 < /dev/null)
  rc=$?
  [ $rc -eq "$code" ] || fail "tycho $*: exit $rc, expected $code: $out"
  grep -qF -- "$msg" <<< "$out" || fail "tycho $*: expected '$msg' in: $out"
}
expect_fail 2 "tycho: -n needs an integer in 1..65536 (got 0: out of range)" repl -n 0
expect_fail 2 "tycho: --ranks needs an integer in 1..65536 (got abc: not an integer)" repl --ranks abc
expect_fail 2 "tycho: --launcher 'srun -n 4': write {n} where the rank count goes" repl -n 4 --launcher 'srun -n 4'
expect_fail 2 "tycho: --launcher needs -n N, the ranks to start" repl --launcher 'srun -n {n}'
expect_fail 1 "tycho repl: the ranks did not start (launcher exit code 1)" repl -n 2 --launcher 'false {n}'
no_leftovers "a launcher that fails"
# a plan that does not open is refused as tycho run refuses it, before the launcher starts anything
printf '#!/bin/sh\ntouch "%s/launched"\nexec mpirun "$@"\n' "$home" > "$home/launcher"
chmod +x "$home/launcher"
out=$("$tycho" repl plans/tyni.lua -n 2 --launcher "$home/launcher -np {n}" 2>"$home/plan.err" < /dev/null)
rc=$?
[ $rc -eq 2 ] || fail "a missing plan: exit $rc, expected 2: $(cat "$home/plan.err")"
grep -qxF "tycho: plan error: plans/tyni.lua: cannot open: No such file or directory" "$home/plan.err" ||
  fail "a missing plan: expected tycho run's message, got: $(cat "$home/plan.err")"
[ -z "$out" ] || fail "a missing plan: nothing may show on stdout (no prompt), got: $out"
[ ! -e "$home/launched" ] || fail "a missing plan: the launcher was started"
expect_fail 2 "tycho: plan error: plans/tiny.lua:32: batch.global = 32: not a multiple" repl plans/tiny.lua -n 3 \
  --launcher "$home/launcher -np {n}"
[ ! -e "$home/launched" ] || fail "a plan that does not compile for 3 ranks: the launcher was started"
no_leftovers "a plan that does not open"
echo "ok: repl -n 4 at a terminal"
