#!/usr/bin/env bash
# `tycho run` end to end with the real binary: trains tests/plans/good/train_small.lua (60 steps
# on the addition corpus) and checks the exit code, the progress lines, one JSON metrics record
# per step (steps 0..59 in order, cumulative tokens), two eval records, a falling loss (the mean
# of the last 10 steps below 0.7 × the mean of the first 10) and the exported weights.
# usage: run_train_small.sh TYCHO   (run from the source folder)
set -u
tycho=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
metrics=$tmp/runs/small/metrics.jsonl   # the folders do not exist yet
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$tmp/stdout"; echo "--- stderr"; cat "$tmp/stderr"; exit 1; }

"$tycho" run tests/plans/good/train_small.lua --set log.metrics="$metrics" \
  --set export.path="$tmp/out/model.safetensors" >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
[ "$rc" -eq 0 ] || fail "exit code $rc"
[ -s "$tmp/stderr" ] && fail "unexpected stderr"
grep -q '^step 60/60 | loss ' "$tmp/stdout" || fail "no progress line for step 60"
grep -q '^eval at step 60: val loss .*, accuracy .* (256 held-out problems)' "$tmp/stdout" || fail "no final eval line"
grep -q '^memory peak: params ' "$tmp/stdout" || fail "no memory bill"
[ -f "$metrics" ] || fail "no metrics file at $metrics"
[ -s "$tmp/out/model.safetensors" ] || fail "no exported weights"

n_steps=$(grep -c '"loss"' "$metrics")
n_evals=$(grep -c '"val_loss"' "$metrics")
[ "$n_steps" -eq 60 ] || fail "$n_steps step records, expected 60"
[ "$n_evals" -eq 2 ] || fail "$n_evals eval records, expected 2"
verdict=$(awk '
  /"loss"/ {
    match($0, /"step": [0-9]+/); step = substr($0, RSTART + 8, RLENGTH - 8) + 0
    match($0, /"loss": [0-9.eE+-]+/); loss = substr($0, RSTART + 8, RLENGTH - 8) + 0
    match($0, /"tokens": [0-9]+/); tokens = substr($0, RSTART + 10, RLENGTH - 10) + 0
    if (step != n) { print "step " step " where " n " was due"; bad = 1 }
    if (tokens != (n + 1) * 512) { print "tokens " tokens " at step " step; bad = 1 }
    if (n < 10) first += loss / 10
    if (n >= 50) last += loss / 10
    n++
  }
  END {
    if (!bad && !(last < 0.7 * first)) { print "loss did not fall: first 10 " first ", last 10 " last; bad = 1 }
    if (!bad) printf "ok: loss %.3f over the first 10 steps, %.3f over the last 10\n", first, last
  }' "$metrics")
case "$verdict" in
  ok:*) echo "$verdict" ;;
  *) fail "$verdict" ;;
esac
