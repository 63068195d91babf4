#!/usr/bin/env bash
# train.max_loss_jump: a step whose loss is more than that many times the mean of the recent
# applied steps is not applied and the run says so. A token file that repeats a period-8 pattern
# except for one step of random tokens (progress step 26): with the guard, that step is reported
# and marked "skipped" in the metrics, and the checkpoint after it is byte for byte the one
# before it (weights and AdamW's moments unchanged); without it, the step is applied. A resume
# across the spike decides as the uninterrupted run does (the recent losses are in the
# checkpoint). Random tokens from step 26 on stop the run after TRAIN_MAX_SKIPS (10) skips in
# a row with exit 1. max_loss_jump ≤ 1 is refused with exit 2.
# usage: run_loss_spike.sh TYCHO   (run from the source folder)
set -u
tycho=$1
plan=tests/plans/good/train_small.lua
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$tmp/out"; echo "--- stderr"; cat "$tmp/err"; exit 1; }
# tokens: step s (0-based) reads tokens [512 s, 512 (s + 1)] (batch 16 × 32, unshuffled)
perl -e 'srand(5); print pack("v*", map { int($_ / 512) == 25 ? int(rand(64)) : ($_ % 8) + 10 } 0 .. 40 * 512)' >"$tmp/one.bin"
perl -e 'srand(5); print pack("v*", map { int($_ / 512) >= 25 ? int(rand(64)) : ($_ % 8) + 10 } 0 .. 60 * 512)' >"$tmp/all.bin"
common=(--set data.synthetic=nil --set data.train="$tmp/one.bin" --set train.eval_every=0 --set log.every=1)

"$tycho" run "$plan" "${common[@]}" --set train.steps=30 --set train.max_loss_jump=2 --set log.metrics="$tmp/g.jsonl" \
  --set checkpoint.dir="$tmp/ck" --set checkpoint.every=1 --set checkpoint.keep=100 >"$tmp/out" 2>"$tmp/err" ||
  fail "the guarded run failed"
grep -qE '^step 26: loss [0-9.]+ is [0-9.]+× the mean of the last 20 applied steps \([0-9.]+\): not applied \(train.max_loss_jump = 2\)$' \
  "$tmp/out" || fail "no skip line for step 26"
[ "$(grep -c ': not applied (train.max_loss_jump' "$tmp/out")" -eq 1 ] || fail "more than one step skipped"
grep -q '^{"step": 25, .*"skipped": true}$' "$tmp/g.jsonl" || fail "the metrics do not mark step 26 skipped"
cmp -s "$tmp/ck/step_00000025/rank_00000.bin" "$tmp/ck/step_00000026/rank_00000.bin" ||
  fail "the skipped step changed the weights or moments"
cmp -s "$tmp/ck/step_00000026/rank_00000.bin" "$tmp/ck/step_00000027/rank_00000.bin" &&
  fail "step 27 did not change the state"

"$tycho" run "$plan" "${common[@]}" --set train.steps=30 --set log.metrics="$tmp/u.jsonl" >"$tmp/out" 2>"$tmp/err" ||
  fail "the unguarded run failed"
grep -q "not applied" "$tmp/out" && fail "a step was skipped without the guard"
[ "$(grep '"step": 26,' "$tmp/u.jsonl" | grep -o '"loss": [^,]*')" != "$(grep '"step": 26,' "$tmp/g.jsonl" | grep -o '"loss": [^,]*')" ] ||
  fail "step 27's loss is the same with and without the guard"

# resume across the spike: the checkpoint of step 22 holds the recent losses
rm -rf "$tmp/ck2" && mkdir "$tmp/ck2" && cp -r "$tmp/ck/step_00000022" "$tmp/ck2/"
"$tycho" run "$plan" "${common[@]}" --set train.steps=30 --set train.max_loss_jump=2 --set log.metrics="$tmp/r.jsonl" \
  --set checkpoint.dir="$tmp/ck2" >"$tmp/out" 2>"$tmp/err" || fail "the resumed run failed"
grep -q "^resumed from $tmp/ck2/step_00000022: step 22" "$tmp/out" || fail "no resume from step 22"
grep -q "^step 26: loss .* not applied" "$tmp/out" || fail "the resumed run did not skip step 26"
[ "$(grep -o '"loss": [^,]*' "$tmp/r.jsonl")" = "$(grep -E '"step": (2[2-9])[,]' "$tmp/g.jsonl" | grep -o '"loss": [^,]*')" ] ||
  fail "the resumed run's losses differ from the uninterrupted run's"

# a lasting jump stops the run
"$tycho" run "$plan" "${common[@]}" --set data.train="$tmp/all.bin" --set train.steps=60 --set train.max_loss_jump=2 \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc -eq 1 ] || fail "a lasting jump: exit code $rc, expected 1"
[ "$(grep -c ': not applied (train.max_loss_jump' "$tmp/out")" -eq 10 ] || fail "a lasting jump: not 10 skips"
grep -qE '^tycho: step 36: the loss \([0-9.e+-]+\) has been above train.max_loss_jump = 2 × the recent mean \([0-9.e+-]+\) for 11 steps in a row; the run stops' \
  "$tmp/err" || fail "a lasting jump: no stop message at step 36"

"$tycho" run "$plan" --set train.max_loss_jump=1 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] || fail "max_loss_jump = 1: not refused with exit 2"
grep -q "train.max_loss_jump = 1: must be above 1" "$tmp/err" || fail "max_loss_jump = 1: message"
echo "ok: train.max_loss_jump skips a spike without touching the state, resumes alike, stops a lasting jump"
