#!/usr/bin/env bash
# Runs `mpi_all_to_all watchdog` on 4 ranks with a 3 s comm timeout: rank 1 sleeps before the
# second all-to-all (step 7, mb 1) while ranks 0, 2 and 3 wait in it. The job must end within
# seconds by the watchdog's abort (exit code 1), with rank 0's diagnosis naming the all-to-all,
# its bytes (what rank 0 sends: 1 + 2 + 3 + 4 floats), the peers waiting in it and rank 1 outside comm.
# Usage: all_to_all_watchdog.sh MPIEXEC NUMPROC_FLAG MPI_ALL_TO_ALL
set -u
mpiexec=$1 np_flag=$2 exe=$3
out=$(mktemp) && trap 'rm -f "$out"' EXIT
start=$(date +%s%N)
TYCHO_COMM_TIMEOUT=3 timeout 240 "$mpiexec" "$np_flag" 4 "$exe" watchdog >"$out" 2>&1
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$out"
echo "--- exit code $rc after $elapsed_ms ms"
fail() { echo "FAIL: $*"; exit 1; }
[ "$rc" -ne 124 ] || fail "the job hung until timeout 240 killed it"
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1 (MPI_Abort with 1)"
[ "$elapsed_ms" -lt 20000 ] || fail "the job took $elapsed_ms ms"
expect() { grep -qF -- "$1" "$out" || fail "expected on stderr: $1"; }
expect "rank 0: comm watchdog: all-to-all on world (seq 1, 40 bytes, step 7, mb 1) has not finished after 3."
expect "s (TYCHO_COMM_TIMEOUT=3); aborting the job"
expect "world group: world ranks 0 1 2 3; asking the others where they are:"
expect "    0 all-to-all world 40 7 0 "
for peer in "2: in world all-to-all seq 1 (72 bytes)" "3: in world all-to-all seq 1 (88 bytes)"; do
  expect "rank $peer for "
done
grep -qE "rank 1: not in a world operation; its last, all-to-all seq 0, ended [0-9.]+ s ago; it is in no comm operation" "$out" ||
  fail "expected rank 1 to answer that it is outside comm after its first all-to-all"
grep -q "the second all-to-all finished" "$out" && fail "an all-to-all finished without rank 1"
echo "ok: the watchdog diagnosed the missing rank"
