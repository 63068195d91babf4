#!/usr/bin/env bash
# checkpoint.async: a snapshot at the step boundary, the files written on a thread while the next
# step trains, the commit (manifest, rename, keep) at a later step boundary. The checkpoints are
# byte for byte those of the synchronous run (every rank file of every kept step), the step after
# a snapshot runs before its commit, the last step's is written before the run ends, `keep`
# holds, a resume from an async checkpoint continues as the synchronous one does, SIGINT commits
# the stop's checkpoint (exit 130), and a write that fails on the thread (File too large) ends
# the run with exit 1 naming the shard, leaving no step_N.tmp.
# usage: run_async_checkpoint.sh TYCHO   (run from the source folder)
set -u
tycho=$1
plan=tests/plans/good/train_small.lua
tmp=$(mktemp -d)
bg=
trap '[ -n "$bg" ] && kill -KILL "$bg" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$tmp/out"; echo "--- stderr"; cat "$tmp/err"; exit 1; }
common=(--set train.eval_every=0 --set log.every=1 --set checkpoint.every=2 --set checkpoint.keep=2)

"$tycho" run "$plan" "${common[@]}" --set train.steps=7 --set checkpoint.dir="$tmp/sync" >"$tmp/out" 2>"$tmp/err" ||
  fail "the synchronous run failed"
"$tycho" run "$plan" "${common[@]}" --set train.steps=7 --set checkpoint.dir="$tmp/async" \
  --set checkpoint.async=true --set log.metrics="$tmp/m.jsonl" >"$tmp/out" 2>"$tmp/err" || fail "the async run failed"
grep -q "^checkpoints: .*, async (a snapshot in host memory" "$tmp/out" || fail "the header does not say async"
[ "$(ls "$tmp/async")" = "$(printf 'step_00000006\nstep_00000007')" ] || fail "keep = 2: $(ls "$tmp/async")"
for s in step_00000006 step_00000007; do
  for f in "$tmp/sync/$s"/rank_*.bin; do
    cmp -s "$f" "$tmp/async/$s/$(basename "$f")" || fail "$s/$(basename "$f") differs from the synchronous run's"
  done
  "$tycho" ckpt verify "$tmp/async/$s" >/dev/null 2>&1 || fail "$s does not verify"
done
# the order of events: snapshot after step 2, step 3 trained, then the commit
snap=$(grep -n "step_00000002: snapshot in .* writing in the background" "$tmp/out" | cut -d: -f1)
step3=$(grep -n "^step 3/7 " "$tmp/out" | cut -d: -f1)
commit=$(grep -n "step_00000002 written in .* (async)" "$tmp/out" | cut -d: -f1)
[ -n "$snap" ] && [ -n "$step3" ] && [ -n "$commit" ] || fail "missing snapshot, step 3 or commit line"
[ "$snap" -lt "$step3" ] && [ "$step3" -lt "$commit" ] || fail "snapshot $snap, step 3 $step3, commit $commit: out of order"
grep -q "step_00000007 written in .* (async)" "$tmp/out" || fail "the last step's checkpoint was not committed"
[ "$(tail -n 2 "$tmp/out" | head -n 1 | cut -c1-5)" = "done:" ] || fail "the run did not end after the last commit"
grep -q '"checkpoint": [1-9]' "$tmp/m.jsonl" || fail "the memory record has no checkpoint snapshot"

# a resume from an async checkpoint: the same losses as from the synchronous one
"$tycho" run "$plan" "${common[@]}" --set train.steps=9 --set checkpoint.dir="$tmp/sync" \
  --set log.metrics="$tmp/ms.jsonl" >"$tmp/out" 2>"$tmp/err" || fail "the synchronous resume failed"
"$tycho" run "$plan" "${common[@]}" --set train.steps=9 --set checkpoint.dir="$tmp/async" --set checkpoint.async=true \
  --set log.metrics="$tmp/ma.jsonl" >"$tmp/out" 2>"$tmp/err" || fail "the async resume failed"
grep -q "^resumed from $tmp/async/step_00000007: step 7" "$tmp/out" || fail "no resume from the async checkpoint"
[ "$(grep -o '"loss": [^,]*' "$tmp/ms.jsonl")" = "$(grep -o '"loss": [^,]*' "$tmp/ma.jsonl")" ] ||
  fail "the resumed losses differ: $(grep -o '"loss": [^,]*' "$tmp/ms.jsonl" | tr '\n' ' ') vs $(grep -o '"loss": [^,]*' "$tmp/ma.jsonl" | tr '\n' ' ')"

# SIGINT: the stop's checkpoint is committed before exit 130
"$tycho" run "$plan" --set train.steps=1000000 --set checkpoint.dir="$tmp/int" --set checkpoint.every=5 \
  --set checkpoint.async=true --set log.metrics="$tmp/mi.jsonl" >"$tmp/out" 2>"$tmp/err" &
bg=$!
for _ in $(seq 1200); do [ "$(grep -c '"loss"' "$tmp/mi.jsonl" 2>/dev/null)" -ge 12 ] 2>/dev/null && break; sleep 0.1; done
kill -INT "$bg"
wait "$bg"
rc=$?
bg=
[ "$rc" -eq 130 ] || fail "SIGINT: exit code $rc, expected 130"
steps=$(grep -c '"loss"' "$tmp/mi.jsonl")
ckpt=$(printf '%s/int/step_%08d' "$tmp" "$steps")
[ "$(cat "$tmp/err")" = "tycho: interrupted by SIGINT after step $steps: checkpoint $ckpt written" ] ||
  fail "SIGINT: stderr '$(cat "$tmp/err")'"
"$tycho" ckpt verify "$ckpt" >/dev/null 2>&1 || fail "SIGINT: $ckpt does not verify"
ls -d "$tmp"/int/step_*.tmp >/dev/null 2>&1 && fail "SIGINT left $(ls -d "$tmp"/int/step_*.tmp)"

# a write that fails on the writer thread (a file-size limit below one shard)
if command -v prlimit >/dev/null; then
  (trap '' XFSZ; exec "$tycho" run "$plan" --set train.steps=1000000 --set checkpoint.dir="$tmp/big" \
    --set checkpoint.every=1 --set checkpoint.async=true) >"$tmp/out" 2>"$tmp/err" &
  bg=$!
  for _ in $(seq 1200); do ls -d "$tmp"/big/step_[0-9]*[0-9] >/dev/null 2>&1 && break; sleep 0.1; done
  prlimit --pid "$bg" --fsize=65536 || fail "prlimit failed"
  wait "$bg"
  rc=$?
  bg=
  [ "$rc" -eq 1 ] || fail "async write failure: exit code $rc, expected 1"
  grep -q '^tycho: checkpoint: cannot write .*/rank_00000.bin: File too large' "$tmp/err" ||
    fail "async write failure: no 'cannot write ... File too large'"
  ls -d "$tmp"/big/step_*.tmp >/dev/null 2>&1 && fail "a failed async write left $(ls -d "$tmp"/big/step_*.tmp)"
fi
echo "ok: checkpoint.async writes the synchronous run's bytes behind the next step, commits at stops and the end, fails cleanly"
