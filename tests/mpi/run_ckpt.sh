#!/usr/bin/env bash
# Checkpoints across layouts. The dp_small plan runs 10 steps on one rank without interruption
# (the reference). Then a run on SAVE_RANKS ranks with the --save layout trains 5 steps and
# checkpoints (checkpoint.dir); `tycho ckpt verify` must accept it; a run on LOAD_RANKS ranks with
# the --load layout resumes from it to step 10. Its losses for steps 6-10 must equal the
# reference's within EQUIV_TOL relative (tests/lib/build.sh: 1e-5 in fp32, 1e-10 in the float64
# build; bit for bit when both layouts are serial), and the checkpoint it writes at step 10 must
# verify too.
# --plan PATH runs another plan (tests/plans/good/ep_small.lua for the expert-parallel cases, whose
# ranks hold only their ep rank's experts: each expert is written once, by one of the ranks holding
# it, and read back by whichever ranks hold it in the resuming layout).
# --tol X holds the losses to X in place of EQUIV_TOL: a bf16 run (--both precision.compute=bf16)
# against its bf16 serial run, held to the bf16 equivalence tests' loss bound, 1e-4
# (tests/mpi/mpi_dp_equiv.c, bf16_bounds, argues it).
# usage: run_ckpt.sh SAVE_RANKS LOAD_RANKS MPIEXEC NUMPROC_FLAG TYCHO [--plan PATH] [--tol X] [--both f=v]... [--save f=v]... [--load f=v]...
set -u
save_ranks=$1 load_ranks=$2 mpiexec=$3 np=$4 tycho=$5
shift 5
. "$(dirname "$0")/../lib/build.sh" "$tycho"
both=() save=() load=()
plan=tests/plans/good/dp_small.lua
while [ $# -gt 0 ]; do
  case $1 in
    --plan) plan=$2 ;;
    --tol) EQUIV_TOL=$2 ;;
    --both) both+=(--set "$2") ;;
    --save) save+=(--set "$2") ;;
    --load) load+=(--set "$2") ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
  shift 2
done
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fail() { echo "--- stdout"; cat "$tmp/out" 2>/dev/null; echo "--- stderr"; cat "$tmp/err" 2>/dev/null; echo "FAIL: $*"; exit 1; }
field() { grep -o "\"$2\": [-0-9.eE+]*" "$1" | awk '{ print $2 }'; }
launch() { # launch RANKS ARGS...: one rank without mpirun, more under it
  local ranks=$1
  shift
  if [ "$ranks" -eq 1 ]; then "$tycho" run "$plan" "$@"; else timeout 240 "$mpiexec" "$np" "$ranks" "$tycho" run "$plan" "$@"; fi
}
common=(--set train.eval_every=0 "${both[@]}")

launch 1 --set train.steps=10 "${common[@]}" --set log.metrics="$tmp/ref.jsonl" >"$tmp/out" 2>"$tmp/err" ||
  fail "the reference run"
launch "$save_ranks" --set train.steps=5 "${common[@]}" "${save[@]}" --set checkpoint.dir="$tmp/ck" \
  >"$tmp/out" 2>"$tmp/err" || fail "the run that saves"
grep -q "checkpoint $tmp/ck/step_00000005 written" "$tmp/out" || fail "no checkpoint line"
# every element once and no padding: weight, AdamW m and v, REAL_BYTES each, per parameter
n_params=$(sed -n 's/^run [^:]*: \([0-9]*\) parameters.*/\1/p' "$tmp/out")
bytes=$(cat "$tmp"/ck/step_00000005/rank_*.bin | wc -c)
per=$((3 * REAL_BYTES))
[ -n "$n_params" ] && [ "$bytes" -eq $((per * n_params)) ] ||
  fail "shard files hold $bytes bytes, expected $per × ${n_params:-?} parameters"
echo "shard files: $bytes bytes = $per × $n_params parameters ($REAL_NAME)"
"$tycho" ckpt verify "$tmp/ck" >"$tmp/out" 2>"$tmp/err" || fail "ckpt verify of the saved checkpoint"
grep -q "^ok: checkpoint $tmp/ck/step_00000005, step 5: " "$tmp/out" || fail "ckpt verify said no ok"
cat "$tmp/out"
launch "$load_ranks" --set train.steps=10 "${common[@]}" "${load[@]}" --set checkpoint.dir="$tmp/ck" \
  --set log.metrics="$tmp/res.jsonl" >"$tmp/out" 2>"$tmp/err" || fail "the run that resumes"
grep -q "^resumed from $tmp/ck/step_00000005: step 5" "$tmp/out" || fail "the run did not say it resumed"
[ "$(field "$tmp/res.jsonl" step | head -n 1)" = 5 ] || fail "the resumed run's first step is not 5 (0-based)"

ref=$(field "$tmp/ref.jsonl" loss | tail -n 5)
got=$(field "$tmp/res.jsonl" loss)
[ "$(echo "$got" | wc -l)" -eq 5 ] || fail "expected 5 resumed steps, got: $got"
if [ "$save_ranks" -eq 1 ] && [ "$load_ranks" -eq 1 ] && [ ${#save[@]} -eq 0 ] && [ ${#load[@]} -eq 0 ]; then
  [ "$ref" = "$got" ] || fail "serial resume is not bit for bit: $ref / $got"
  echo "serial save and resume: losses of steps 6-10 equal to the uninterrupted run's, digit for digit"
else
  v=$(paste <(echo "$ref") <(echo "$got") | awk -v tol="$EQUIV_TOL" '{ d = ($2 - $1) / $1; d = d < 0 ? -d : d;
    w = d > w ? d : w; n++ } END { if (n != 5 || w > tol) print "FAIL " n " " w; else printf "ok %d %.3g (bound %g)", n, w, tol }')
  echo "resumed on $load_ranks rank(s) ${load[*]} from $save_ranks rank(s) ${save[*]}: $v"
  case "$v" in ok*) ;; *) fail "losses differ from the uninterrupted run: $v" ;; esac
fi
"$tycho" ckpt verify "$tmp/ck/step_00000010" >"$tmp/out" 2>"$tmp/err" || fail "ckpt verify of the resumed run's checkpoint"
echo ok
