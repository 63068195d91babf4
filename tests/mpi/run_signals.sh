#!/usr/bin/env bash
# SIGTERM to one rank of a 2-rank `tycho run` (not to mpirun, not to the other rank): the
# signalled rank's flag rides on the step's agreement, so both ranks stop after the same step,
# write the checkpoint of that step together (both shard files; it verifies), and the job exits
# 143 with one line from rank 0 naming the step; a 2-rank run then resumes from it.
# usage: run_signals.sh MPIEXEC NUMPROC_FLAG TYCHO   (run from the source folder)
set -u
mpiexec=$1 np=$2 tycho=$3
plan=tests/plans/good/dp_small.lua
tmp=$(mktemp -d)
job=
trap '[ -n "$job" ] && kill -KILL "$job" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "--- stdout"; cat "$tmp/out"; echo "--- stderr"; cat "$tmp/err"; echo "FAIL: $*"; exit 1; }

timeout 240 "$mpiexec" "$np" 2 "$tycho" run "$plan" --set train.steps=1000000 --set checkpoint.dir="$tmp/ck" \
  --set checkpoint.every=1000000 --set log.metrics="$tmp/m.jsonl" >"$tmp/out" 2>"$tmp/err" &
job=$!
for _ in $(seq 1200); do [ "$(grep -c '"loss"' "$tmp/m.jsonl" 2>/dev/null)" -ge 20 ] 2>/dev/null && break; sleep 0.1; done
# The rank-1 process: a descendant of the job whose environment says so (Open MPI, MPICH, PMIx).
rank1=
for pid in $(pgrep -P "$job") $(for c in $(pgrep -P "$job"); do pgrep -P "$c"; done); do
  [ -r "/proc/$pid/environ" ] || continue
  if tr '\0' '\n' <"/proc/$pid/environ" | grep -qxE '(OMPI_COMM_WORLD_RANK|PMI_RANK|PMIX_RANK)=1'; then
    rank1=$pid
    break
  fi
done
[ -n "$rank1" ] || { echo "skipped: cannot find the rank-1 process of the job"; exit 77; }
kill -TERM "$rank1"
wait "$job"
rc=$?
job=
[ "$rc" -ne 124 ] || fail "the job hung until timeout 240 killed it"
[ "$rc" -eq 143 ] || fail "exit code $rc, expected 143"
steps=$(grep -c '"loss"' "$tmp/m.jsonl")
ckpt=$(printf '%s/ck/step_%08d' "$tmp" "$steps")
[ "$(grep -c '^tycho: ' "$tmp/err")" -eq 1 ] || fail "expected one 'tycho:' line on stderr"
[ "$(head -n 1 "$tmp/err")" = "tycho: interrupted by SIGTERM after step $steps: checkpoint $ckpt written" ] ||
  fail "first stderr line '$(head -n 1 "$tmp/err")'"
[ -f "$ckpt/rank_00000.bin" ] && [ -f "$ckpt/rank_00001.bin" ] || fail "$ckpt lacks a rank's shard"
"$tycho" ckpt verify "$ckpt" >"$tmp/verify" 2>&1 || fail "the checkpoint does not verify: $(cat "$tmp/verify")"
timeout 240 "$mpiexec" "$np" 2 "$tycho" run "$plan" --set train.steps=$((steps + 3)) --set checkpoint.dir="$tmp/ck" \
  --set log.metrics="$tmp/m.jsonl" >"$tmp/out" 2>"$tmp/err" || fail "the resumed run failed"
grep -q "^resumed from $ckpt: step $steps\$" "$tmp/out" || fail "the resumed run did not start from $ckpt"
[ "$(grep -c '"loss"' "$tmp/m.jsonl")" -eq $((steps + 3)) ] || fail "the resumed run did not add 3 steps"
echo "ok: SIGTERM to rank 1 only: both ranks stopped after step $steps, exit 143, resumed"
