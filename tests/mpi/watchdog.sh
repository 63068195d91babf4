#!/usr/bin/env bash
# Runs mpi_watchdog on 4 ranks with a 3 s comm timeout and checks that the job ends within
# seconds with a failing exit code and (sleep, finalize, stopped) the watchdog's diagnosis on stderr.
# Usage: watchdog.sh MODE MPIEXEC NUMPROC_FLAG MPI_WATCHDOG
set -u
mode=$1 mpiexec=$2 np_flag=$3 exe=$4
out=$(mktemp) && trap 'rm -f "$out"' EXIT
start=$(date +%s%N)
TYCHO_COMM_TIMEOUT=3 timeout 240 "$mpiexec" "$np_flag" 4 "$exe" "$mode" >"$out" 2>&1
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
cat "$out"
echo "--- mode $mode: exit code $rc after $elapsed_ms ms"
fail() { echo "FAIL: $*"; exit 1; }
[ "$rc" -ne 124 ] || fail "the job hung until timeout 240 killed it"
[ "$rc" -ne 0 ] || fail "the job exited 0"
[ "$elapsed_ms" -lt 20000 ] || fail "the job took $elapsed_ms ms"
expect() { grep -qF -- "$1" "$out" || fail "expected on stderr: $1"; }
case $mode in
  sleep|finalize|stopped)
    [ "$rc" -eq 1 ] || fail "exit code $rc, expected 1 (MPI_Abort with 1)"
    expect "comm watchdog: all-reduce on world (seq 2, 4096 bytes, step 5, mb 2) has not finished after 3."
    expect "s (TYCHO_COMM_TIMEOUT=3); aborting the job"
    expect "world group: world ranks 0 1 2 3; asking the others where they are:"
    expect "last 3 operations on this rank (seq op group bytes step mb issued started ended, seconds):"
    expect "2 all-reduce world 4096 5 2"
    grep -qE "rank [023]: in world all-reduce seq 2 \(4096 bytes\) for [0-9.]+ s" "$out" ||
      fail "expected a peer waiting in the same all-reduce"
    ;;&
  sleep)
    grep -qE "rank 1: not in a world operation; its last, all-reduce seq 1, ended [0-9.]+ s ago; it is in no comm operation \(computing, or stuck outside comm\)" "$out" ||
      fail "expected rank 1 to answer that it is outside comm"
    ;;
  finalize)
    grep -qE "rank 1: not in a world operation; its last, all-reduce seq 1, ended [0-9.]+ s ago; it waits in comm_finalize waiting for every rank to leave for [0-9.]+ s" "$out" ||
      fail "expected rank 1 to answer that it waits in comm_finalize"
    # rank 1's own diagnosis ("comm_finalize waiting for every rank to leave has not finished")
    # races the abort of the lowest stuck rank, so it is not required here
    ;;
  stopped)
    expect "rank 1: no answer within 2 s (exited, dead, or its watchdog is blocked)"
    ;;
  exit)
    grep -q "the third all-reduce finished" "$out" && fail "a collective finished without rank 1"
    ;;
esac
echo "ok: mode $mode"
