#!/usr/bin/env bash
# plans/tiny.lua as shipped, with precision.compute = "bf16", learns the addition corpus: at least
# 95% exact match on its 1,024 held-out problems after its 6,000 steps (the bar for the
# CPU's bf16 mode). Measured 98.5% (OpenBLAS's Haswell kernel) and 98.4% (Cooperlake) in about
# 2 minutes on 2 cores, and 99.9% (val loss 1.2528) with the attention's products in bf16 too; where the model finds the digits moves with any change of rounding, so the
# plan trains long enough past it (at 4,000 steps the same runs gave 91.9-99.8%). The float64
# build refuses bf16, so there this test checks the refusal only.
# usage: run_tiny_bf16.sh TYCHO   (run from the source folder)
set -u
tycho=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if "$tycho" --version | grep -q "float64 kernels"; then
  "$tycho" run plans/tiny.lua --set precision.compute=bf16 >/dev/null 2>"$tmp/err"
  rc=$?
  [ "$rc" -eq 2 ] && grep -q 'no bf16 compute' "$tmp/err" || { echo "FAIL: float64 bf16 exit $rc"; cat "$tmp/err"; exit 1; }
  echo "float64 build: bf16 refused"
  exit 0
fi

# the whole machine: the result does not depend on the thread count
OMP_NUM_THREADS=$(nproc) "$tycho" run plans/tiny.lua --set precision.compute=bf16 >"$tmp/out" 2>"$tmp/err" ||
  { echo "FAIL: the bf16 run failed"; cat "$tmp/err"; exit 1; }
line=$(grep '^eval at step 6000:' "$tmp/out") || { echo "FAIL: no final evaluation"; tail -5 "$tmp/out"; exit 1; }
echo "$line"
acc=$(printf '%s\n' "$line" | sed -n 's/.*accuracy \([0-9.]*\)%.*/\1/p')
awk -v a="$acc" 'BEGIN { exit !(a >= 95.0) }' || { echo "FAIL: accuracy $acc% < 95%"; exit 1; }
