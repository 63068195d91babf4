#!/usr/bin/env bash
# `tycho run` under mpirun with the real binary: tests/plans/good/dp_small.lua on RANKS ranks
# with ZERO, against the same plan on one rank. Rank 0 alone writes: one progress line per
# logged step, one eval line, one metrics record per step (not one per rank), the export; the
# memory bill has a line per rank. Every step's loss and the validation losses in the metrics
# match the serial run's within EQUIV_TOL relative, the gradient norms within NORM_TOL
# (tests/lib/build.sh: fp32 1e-5 and 1e-3, float64 1e-10).
# usage: run_dp.sh RANKS ZERO MPIEXEC NUMPROC_FLAG TYCHO   (run from the source folder)
set -u
ranks=$1 zero=$2 mpiexec=$3 np=$4 tycho=$5
. "$(dirname "$0")/../lib/build.sh" "$tycho"
plan=tests/plans/good/dp_small.lua
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fail() { echo "--- stdout"; cat "$tmp/out"; echo "--- stderr"; cat "$tmp/err"; echo "FAIL: $*"; exit 1; }

"$tycho" run "$plan" --set log.metrics="$tmp/serial.jsonl" >"$tmp/serial.out" 2>&1 ||
  { cat "$tmp/serial.out"; echo "FAIL: the serial run"; exit 1; }
start=$(date +%s%N)
timeout 240 "$mpiexec" "$np" "$ranks" "$tycho" run "$plan" --set zero="$zero" \
  --set log.metrics="$tmp/dp.jsonl" --set export.path="$tmp/export/model.safetensors" >"$tmp/out" 2>"$tmp/err"
rc=$?
echo "dp$ranks zero $zero: exit code $rc after $(( ($(date +%s%N) - start) / 1000000 )) ms"
[ "$rc" -eq 0 ] || fail "exit code $rc"
[ -s "$tmp/err" ] && fail "unexpected stderr"
[ "$(grep -c '^step 20/20 | loss ' "$tmp/out")" -eq 1 ] || fail "expected one progress line for step 20"
[ "$(grep -c '^eval at step 20: ' "$tmp/out")" -eq 1 ] || fail "expected one eval line for step 20"
grep -q "^data parallel: $ranks ranks, zero $zero, " "$tmp/out" || fail "no data-parallel line"
for ((r = 0; r < ranks; r++)); do
  grep -q "^memory peak, rank $r: params " "$tmp/out" || fail "no memory line for rank $r"
done
[ -s "$tmp/export/model.safetensors" ] || fail "no exported weights"
[ "$(grep -c '"loss"' "$tmp/dp.jsonl")" -eq 20 ] || fail "expected 20 step records"
[ "$(grep -c '"val_loss"' "$tmp/dp.jsonl")" -eq 2 ] || fail "expected 2 eval records"

# Field f of every record that has it, one per line.
field() { grep -o "\"$2\": [-0-9.eE+]*" "$1" | awk '{ print $2 }'; }
for f in loss grad_norm val_loss; do
  tol=$EQUIV_TOL
  [ $f = grad_norm ] && tol=$NORM_TOL
  verdict=$(paste <(field "$tmp/serial.jsonl" $f) <(field "$tmp/dp.jsonl" $f) | awk -v f=$f -v tol="$tol" '
    { d = ($2 - $1) / $1; d = d < 0 ? -d : d; worst = d > worst ? d : worst; n++ }
    END { if (n == 0 || worst > tol) print "FAIL " f ": worst relative difference " worst " over " n
          else printf "ok %s: %d values, worst relative difference %.3g (bound %g)\n", f, n, worst, tol }')
  echo "$verdict"
  case "$verdict" in ok*) ;; *) fail "$verdict" ;; esac
done
