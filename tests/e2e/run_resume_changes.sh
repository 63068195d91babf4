#!/usr/bin/env bash
# A resume continues the run its checkpoint saved: a plan that changes what the run computes
# (batch.global, seeds, data.shuffle, the optimizer, the lr schedule — lr_schedule.decay_steps
# moving with train.steps when it follows it — norm_eps) is refused with exit 2
# naming every changed field, its new value and where it was set, and the checkpoint's value,
# with no step run and the checkpoint left as it was; checkpoint.allow_changes lets the named
# fields (or the parent a derived field follows: seeds.global, train.steps) change; a layout
# change (batch.micro) and a longer run with a fixed decay_steps need no permission; a name that
# is not compared is refused with the list and a suggestion; `ckpt inspect` prints what is
# compared; a checkpoint from before the comparison (no "computes") still resumes.
# usage: run_resume_changes.sh TYCHO   (run from the source folder)
set -u
tycho=$1
plan=tests/plans/good/train_small.lua
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$tmp/out"; echo "--- stderr"; cat "$tmp/err"; exit 1; }
base=(--set train.eval_every=0 --set log.every=1 --set checkpoint.dir="$tmp/ck")
run() { "$tycho" run "$plan" "${base[@]}" "$@" >"$tmp/out" 2>"$tmp/err"; }
refused() { # refused ARGS... : exit 2, no step, the checkpoint unchanged
  run "$@"
  local rc=$?
  [ $rc -eq 2 ] || fail "$*: exit code $rc, expected 2"
  grep -q '^step' "$tmp/out" && fail "$*: a step ran before the refusal"
  grep -q "the plan changes what the run computes" "$tmp/err" || fail "$*: no refusal message"
  [ "$(ls "$tmp/ck")" = "step_00000003" ] || fail "$*: the checkpoint folder changed: $(ls "$tmp/ck")"
  return 0
}
has() { grep -qF -- "$1" "$tmp/err" || fail "stderr lacks: $1"; }

run --set train.steps=3 || fail "the first run failed"
[ -d "$tmp/ck/step_00000003" ] || fail "no checkpoint after 3 steps"
"$tycho" ckpt inspect "$tmp/ck" >"$tmp/out" 2>"$tmp/err" || fail "ckpt inspect failed"
grep -q '^computes: .*batch.global=16 .*seeds.data=[0-9]* .*lr_schedule.decay_steps=60 ' "$tmp/out" ||
  fail "ckpt inspect does not print what a resume compares"

refused --set train.steps=5 --set batch.global=32
has "(1 field):"
has "batch.global = 32 (--set batch.global=32); the checkpoint's run had 16"
has 'checkpoint = { allow_changes = { "batch.global" } }'

refused --set train.steps=5 --set seeds.global=8 --set optimizer.lr=1e-3 --set data.shuffle=true
has "(5 fields):"
has "seeds.model = "
has "(follows seeds.global, --set seeds.global=8); the checkpoint's run had "
has "optimizer.lr = 0.001 (--set optimizer.lr=1e-3); the checkpoint's run had 0.003"
has "data.shuffle = true (--set data.shuffle=true); the checkpoint's run had false"
has 'allow_changes = { "data.shuffle", "seeds.global", "optimizer.lr" } }'

refused --set train.steps=5 --set model.norm_eps=1e-6
has "model.norm_eps = 1e-06"
refused --set train.steps=5 --set lr_schedule.decay=linear --set lr_schedule.min_lr=0
has 'lr_schedule.decay = "linear"'
has "lr_schedule.min_lr = 0 (--set lr_schedule.min_lr=0); the checkpoint's run had 0.0003"

# a name a resume does not compare
run --set train.steps=5 --set checkpoint.allow_changes=batch.micro
[ $? -eq 2 ] || fail "allow_changes=batch.micro: not refused with exit 2"
has 'checkpoint.allow_changes = "batch.micro" (the fields a resume compares): must be one of "model.norm_eps"'
run --set train.steps=5 --set checkpoint.allow_changes=batch.globl
has '(did you mean "batch.global"?)'

# permitted: the layout, a longer run with decay_steps fixed, and what allow_changes names
run --set train.steps=4 --set batch.micro=4 || fail "a layout change (batch.micro) was refused"
grep -q "^resumed from $tmp/ck/step_00000003: step 3" "$tmp/out" || fail "the layout change did not resume"
run --set train.steps=5 --set batch.global=32 --set seeds.global=8 \
  --set checkpoint.allow_changes=batch.global,seeds.global || fail "allow_changes did not permit its fields"
grep -q "^resumed from $tmp/ck/step_00000004: step 4" "$tmp/out" || fail "allow_changes: no resume"
grep -q "^step 5/5" "$tmp/out" || fail "allow_changes: step 5 did not run"

# lr_schedule.decay_steps following train.steps (not written): a longer run moves the schedule
rm -rf "$tmp/ck"
free=(--set lr_schedule.decay_steps=nil --set lr_schedule.warmup=1)
run --set train.steps=3 "${free[@]}" || fail "the first run without decay_steps failed"
refused --set train.steps=6 "${free[@]}"
has "lr_schedule.decay_steps = 6 (follows train.steps, --set train.steps=6); the checkpoint's run had 3"
has 'allow_changes = { "train.steps" } }'
run --set train.steps=6 "${free[@]}" --set checkpoint.allow_changes=train.steps ||
  fail "allow_changes = train.steps did not let decay_steps follow it"
grep -q "^resumed from $tmp/ck/step_00000003: step 3" "$tmp/out" || fail "train.steps allowed: no resume"

# a manifest from before the comparison holds no "computes": it resumes as before
rm -rf "$tmp/ck"
run --set train.steps=3 || fail "the run for the old manifest failed"
m="$tmp/ck/step_00000003/manifest.json"
sed 's/"computes":{[^}]*},//' "$m" >"$tmp/m" && cat "$tmp/m" >"$m"
grep -q '"computes"' "$m" && fail "could not remove computes from the manifest"
run --set train.steps=4 --set batch.global=32 || fail "a manifest without computes did not resume"
grep -q "^resumed from $tmp/ck/step_00000003: step 3" "$tmp/out" || fail "old manifest: no resume"
echo "ok: resume refuses changes to what the run computes, allows layout changes and allow_changes"
