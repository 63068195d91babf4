#!/usr/bin/env bash
# What goes wrong with checkpoints is said, not survived silently: on one rank, the dp_small plan
# checkpoints every 2 steps keeping 2; then a corrupt byte, a truncated shard file, a broken
# manifest, another model, a checkpoint of the other build's element type, and a crash's
# leftover .tmp folder.
# usage: ckpt_errors.sh TYCHO   (run from the source folder)
set -u
tycho=$1
. "$(dirname "$0")/../lib/build.sh" "$tycho"
plan=tests/plans/good/dp_small.lua
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fail() { echo "--- stdout"; cat "$tmp/out" 2>/dev/null; echo "--- stderr"; cat "$tmp/err" 2>/dev/null; echo "FAIL: $*"; exit 1; }
run() { "$tycho" run "$plan" --set train.eval_every=0 "$@" >"$tmp/out" 2>"$tmp/err"; }
expect_fail() { # expect_fail CODE TEXT: the last command's exit code and the text on stderr
  [ "$rc" -eq "$1" ] || fail "exit code $rc, expected $1"
  grep -qF -- "$2" "$tmp/err" || fail "expected on stderr: $2"
}

# keep = 2 of the checkpoints at steps 2, 4, 6, 8, 10
run --set train.steps=10 --set checkpoint.dir="$tmp/ck" --set checkpoint.every=2 --set checkpoint.keep=2 ||
  fail "the run that saves"
[ "$(ls "$tmp/ck" | tr '\n' ' ')" = "step_00000008 step_00000010 " ] || fail "keep 2 left: $(ls "$tmp/ck")"
"$tycho" ckpt inspect "$tmp/ck" >"$tmp/out" || fail "inspect"
grep -q "^checkpoint $tmp/ck/step_00000010: step 10 of plan dp-small" "$tmp/out" || fail "inspect's first line"
grep -q "^saved on 1 ranks: tp 1, pp 1, dp 1, zero 0" "$tmp/out" || fail "inspect's mesh line"

# a crash's leftover: an unfinished step_00000012.tmp is not a checkpoint
mkdir "$tmp/ck/step_00000012.tmp" && cp "$tmp/ck/step_00000010/rank_00000.bin" "$tmp/ck/step_00000012.tmp/"
run --set train.steps=11 --set checkpoint.dir="$tmp/ck" || fail "resume next to a .tmp folder"
grep -q "^resumed from $tmp/ck/step_00000010: step 10" "$tmp/out" || fail "did not resume from step 10"
rm -rf "$tmp/ck/step_00000012.tmp" "$tmp/ck/step_00000011"

# another model
run --set train.steps=12 --set checkpoint.dir="$tmp/ck" --set model.ffn_dim=96
rc=$?; expect_fail 1 "/step_00000010: its model has ffn_dim = 64, the plan's 96"

# one flipped byte in the shard file
cp -r "$tmp/ck/step_00000010" "$tmp/bad"
printf '\x7f' | dd of="$tmp/bad/rank_00000.bin" bs=1 seek=5000 conv=notrunc status=none
"$tycho" ckpt verify "$tmp/bad" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect_fail 1 "rank_00000.bin is corrupt: model.embed_tokens.weight's param piece at byte 0 fails its checksum"
mkdir "$tmp/bad_dir" && mv "$tmp/bad" "$tmp/bad_dir/step_00000010"
run --set train.steps=12 --set checkpoint.dir="$tmp/bad_dir"
rc=$?; expect_fail 1 "is corrupt: model.embed_tokens.weight's param piece at byte 0 fails its checksum"

# a truncated shard file
cp -r "$tmp/ck/step_00000010" "$tmp/short"
truncate -s 100000 "$tmp/short/rank_00000.bin"
"$tycho" ckpt verify "$tmp/short" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect_fail 1 "rank_00000.bin is truncated: "

# a manifest cut short, and a folder that is no checkpoint
cp -r "$tmp/ck/step_00000010" "$tmp/cut"
head -c 300 "$tmp/ck/step_00000010/manifest.json" >"$tmp/cut/manifest.json"
"$tycho" ckpt verify "$tmp/cut" >"$tmp/out" 2>"$tmp/err"
# where the cut falls (inside a string or between values) moves with the manifest's content: the
# error names the file and a byte within the 300 kept
rc=$?; expect_fail 1 "/cut/manifest.json: bad JSON at byte "
at=$(sed -n 's/.*bad JSON at byte \([0-9]*\):.*/\1/p' "$tmp/err")
[ -n "$at" ] && [ "$at" -le 300 ] || fail "the bad JSON's byte ($at) is not within the 300 kept"
mkdir "$tmp/empty"
"$tycho" ckpt inspect "$tmp/empty" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect_fail 1 "/empty: not a checkpoint (no manifest.json) and holds no step_N checkpoint"
"$tycho" ckpt frobnicate "$tmp/ck" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect_fail 2 "usage: tycho ckpt inspect|verify DIR"

# a piece dropped from the manifest: verify finds the gap, resuming finds the rank's hole
sed 's/{"kind":"exp_avg","file":0,"offset":[0-9]*,"block":\[0,0,64,32\],"range":\[0,2048\],"fnv1a64":"[0-9a-f]*"},//' \
  "$tmp/ck/step_00000010/manifest.json" >"$tmp/m.json"
cmp -s "$tmp/m.json" "$tmp/ck/step_00000010/manifest.json" && fail "the sed did not drop a piece"
mkdir -p "$tmp/gap" && cp -r "$tmp/ck/step_00000010" "$tmp/gap/" && cp "$tmp/m.json" "$tmp/gap/step_00000010/manifest.json"
"$tycho" ckpt verify "$tmp/gap" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect_fail 1 "element [0, 0] of model.embed_tokens.weight (exp_avg) is in no piece"
run --set train.steps=12 --set checkpoint.dir="$tmp/gap"
rc=$?; expect_fail 1 "the exp_avg pieces of model.embed_tokens.weight cover 0 of the 2048 elements this rank needs"
# a checkpoint the other build wrote (F32 in the float64 build, F64 in the fp32 one): refused,
# naming the tensor, both types and the build that reads it
if [ "$REAL_BYTES" -eq 8 ]; then mine=F64 other=F32; else mine=F32 other=F64; fi
mkdir -p "$tmp/other" && cp -r "$tmp/ck/step_00000010" "$tmp/other/"
sed "s/\"dtype\":\"$mine\"/\"dtype\":\"$other\"/g" "$tmp/ck/step_00000010/manifest.json" \
  >"$tmp/other/step_00000010/manifest.json"
cmp -s "$tmp/other/step_00000010/manifest.json" "$tmp/ck/step_00000010/manifest.json" && fail "the sed changed no dtype"
run --set train.steps=12 --set checkpoint.dir="$tmp/other"
rc=$?; expect_fail 1 "tensor model.embed_tokens.weight is $other, and this build of tycho computes in $REAL_NAME ($mine)"
echo ok
