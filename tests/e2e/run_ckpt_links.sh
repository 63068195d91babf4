#!/usr/bin/env bash
# Removing checkpoints never follows a symbolic link: a step folder in checkpoint.dir that is a
# link into another run's checkpoints — pruned by checkpoint.keep, or a step_N.tmp that a save
# makes afresh — loses the link itself, and the other run's files stay byte for byte.
# usage: run_ckpt_links.sh TYCHO   (run from the source folder)
set -u
tycho=$1
plan=tests/plans/good/dp_small.lua
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fail() { echo "--- stdout"; cat "$tmp/out" 2>/dev/null; echo "--- stderr"; cat "$tmp/err" 2>/dev/null; echo "FAIL: $*"; exit 1; }
run() { "$tycho" run "$plan" --set train.eval_every=0 "$@" >"$tmp/out" 2>"$tmp/err"; }

# Run b's checkpoint; run a's folder holds a step folder that is a link to it, older than a's own,
# so keep = 1 prunes it: the link is unlinked, and b's files stay as they were (before, they were
# deleted, then "cannot remove the old checkpoint").
run --set train.steps=2 --set checkpoint.dir="$tmp/b" || fail "run b"
cp -a "$tmp/b" "$tmp/b_before"
run --set train.steps=2 --set checkpoint.dir="$tmp/a" || fail "run a"
ln -s "$tmp/b/step_00000002" "$tmp/a/step_00000001"
run --set train.steps=4 --set checkpoint.dir="$tmp/a" --set checkpoint.every=2 --set checkpoint.keep=1 ||
  fail "run a with a linked step folder"
[ "$(ls "$tmp/a" | tr '\n' ' ')" = "step_00000004 " ] || fail "run a's folder holds: $(ls -l "$tmp/a")"
diff -r "$tmp/b" "$tmp/b_before" >/dev/null || fail "pruning changed run b's checkpoint: $(ls -lR "$tmp/b")"
# a step_N.tmp link to b's checkpoint: a's save of step N makes that folder afresh, unlinking the
# link (before: b's files deleted, then "cannot prepare"); b restored first, so this case stands
# on its own
rm -rf "$tmp/b" && cp -a "$tmp/b_before" "$tmp/b"
ln -s "$tmp/b/step_00000002" "$tmp/a/step_00000006.tmp"
run --set train.steps=6 --set checkpoint.dir="$tmp/a" --set checkpoint.keep=1 || fail "run a with a .tmp link"
[ "$(ls "$tmp/a" | tr '\n' ' ')" = "step_00000006 " ] || fail "run a's folder holds: $(ls -l "$tmp/a")"
[ -f "$tmp/a/step_00000006/manifest.json" ] && [ ! -L "$tmp/a/step_00000006" ] || fail "run a's step 6"
diff -r "$tmp/b" "$tmp/b_before" >/dev/null || fail "saving changed run b's checkpoint: $(ls -lR "$tmp/b")"
echo ok
