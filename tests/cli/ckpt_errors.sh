#!/usr/bin/env bash
# What goes wrong with checkpoints is said, not survived silently: on one rank, the dp_small plan
# checkpoints every 2 steps keeping 2; then a corrupt byte, a truncated shard file, a broken
# manifest, another model, a checkpoint of the other build's element type, a crash's leftover
# .tmp folder, and crafted manifests (each refused alike by `ckpt verify` and by a resume: the one
# manifest reader). Each is an input error: exit 2 (they exited 1, as a machine's failure does).
# usage: ckpt_errors.sh TYCHO   (run from the source folder)
set -u
tycho=$1
. "$(dirname "$0")/../lib/build.sh" "$tycho"
plan=tests/plans/good/dp_small.lua
if [ "$REAL_BYTES" -eq 8 ]; then mine=F64 other=F32; else mine=F32 other=F64; fi
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
rc=$?; expect_fail 2 "/step_00000010: its model has ffn_dim = 64, the plan's 96"

# one flipped byte in the shard file
cp -r "$tmp/ck/step_00000010" "$tmp/bad"
printf '\x7f' | dd of="$tmp/bad/rank_00000.bin" bs=1 seek=5000 conv=notrunc status=none
"$tycho" ckpt verify "$tmp/bad" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect_fail 2 "rank_00000.bin is corrupt: model.embed_tokens.weight's param piece at byte 0 fails its checksum"
mkdir "$tmp/bad_dir" && mv "$tmp/bad" "$tmp/bad_dir/step_00000010"
run --set train.steps=12 --set checkpoint.dir="$tmp/bad_dir"
rc=$?; expect_fail 2 "is corrupt: model.embed_tokens.weight's param piece at byte 0 fails its checksum"

# a truncated shard file
cp -r "$tmp/ck/step_00000010" "$tmp/short"
truncate -s 100000 "$tmp/short/rank_00000.bin"
"$tycho" ckpt verify "$tmp/short" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect_fail 2 "rank_00000.bin is truncated: "

# a manifest cut short, and a folder that is no checkpoint
cp -r "$tmp/ck/step_00000010" "$tmp/cut"
head -c 300 "$tmp/ck/step_00000010/manifest.json" >"$tmp/cut/manifest.json"
"$tycho" ckpt verify "$tmp/cut" >"$tmp/out" 2>"$tmp/err"
# where the cut falls (inside a string or between values) moves with the manifest's content: the
# error names the file and a byte within the 300 kept
rc=$?; expect_fail 2 "/cut/manifest.json: bad JSON at byte "
at=$(sed -n 's/.*bad JSON at byte \([0-9]*\):.*/\1/p' "$tmp/err")
[ -n "$at" ] && [ "$at" -le 300 ] || fail "the bad JSON's byte ($at) is not within the 300 kept"
mkdir "$tmp/empty"
"$tycho" ckpt inspect "$tmp/empty" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect_fail 2 "/empty: not a checkpoint (no manifest.json) and holds no step_N checkpoint"
"$tycho" ckpt frobnicate "$tmp/ck" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect_fail 2 "usage: tycho ckpt inspect|verify DIR"

# a piece dropped from the manifest: verify finds the gap, resuming finds the rank's hole
sed 's/{"kind":"exp_avg","file":0,"offset":[0-9]*,"block":\[0,0,64,32\],"range":\[0,2048\],"fnv1a64":"[0-9a-f]*"},//' \
  "$tmp/ck/step_00000010/manifest.json" >"$tmp/m.json"
cmp -s "$tmp/m.json" "$tmp/ck/step_00000010/manifest.json" && fail "the sed did not drop a piece"
mkdir -p "$tmp/gap" && cp -r "$tmp/ck/step_00000010" "$tmp/gap/" && cp "$tmp/m.json" "$tmp/gap/step_00000010/manifest.json"
"$tycho" ckpt verify "$tmp/gap" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect_fail 2 "element [0, 0] of model.embed_tokens.weight (exp_avg) is in no piece"
run --set train.steps=12 --set checkpoint.dir="$tmp/gap"
rc=$?; expect_fail 2 "/step_00000010: element [0, 0] of model.embed_tokens.weight (exp_avg) is in no piece"
# a checkpoint the other build wrote (F32 in the float64 build, F64 in the fp32 one): refused,
# naming the tensor, both types and the build that reads it
mkdir -p "$tmp/other" && cp -r "$tmp/ck/step_00000010" "$tmp/other/"
sed "s/\"dtype\":\"$mine\"/\"dtype\":\"$other\"/g" "$tmp/ck/step_00000010/manifest.json" \
  >"$tmp/other/step_00000010/manifest.json"
cmp -s "$tmp/other/step_00000010/manifest.json" "$tmp/ck/step_00000010/manifest.json" && fail "the sed changed no dtype"
run --set train.steps=12 --set checkpoint.dir="$tmp/other"
rc=$?; expect_fail 2 "tensor model.embed_tokens.weight is $other, and this build of tycho computes in $REAL_NAME ($mine)"
"$tycho" ckpt verify "$tmp/other" >"$tmp/out" 2>"$tmp/err"
rc=$?; expect_fail 2 "tensor model.embed_tokens.weight is $other, and this build of tycho computes in $REAL_NAME ($mine)"

# Crafted manifests: `ckpt verify` and a resume read them through the same checked reader, so
# each is refused by both with the same message (before, some crashed verify, some verify called
# "ok", and a resume judged coverage by counting, so an overlap and a gap of the same size passed).
good=$tmp/ck/step_00000010/manifest.json
shard_bytes=$(stat -c %s "$tmp/ck/step_00000010/rank_00000.bin")
emb='"model.embed_tokens.weight","dtype":"'$mine'","shape":\[64,32\],"pieces":\[{"kind":"param","file":0,"offset":0,"block":\[0,0,64,32\],"range":\[0,2048\],"fnv1a64":"[0-9a-f]*"'
norm_piece=$(grep -o '{"kind":"param","file":0,"offset":[0-9]*,"block":\[0,0,32,1\],"range":\[0,32\],"fnv1a64":"[0-9a-f]*"}' "$good" | head -1)
[ -n "$norm_piece" ] || fail "no norm weight's piece in the manifest"
crafted() { # crafted NAME SED: $tmp/c_NAME/step_00000010, the good checkpoint with its manifest edited
  mkdir -p "$tmp/c_$1" && cp -r "$tmp/ck/step_00000010" "$tmp/c_$1/"
  sed "$2" "$good" >"$tmp/c_$1/step_00000010/manifest.json"
  cmp -s "$tmp/c_$1/step_00000010/manifest.json" "$good" && fail "crafted $1: the sed changed nothing"
}
refused() { # refused NAME TEXT: verify and a resume both exit 1 with TEXT
  "$tycho" ckpt verify "$tmp/c_$1" >"$tmp/out" 2>"$tmp/err"
  rc=$?; expect_fail 2 "$2"
  run --set train.steps=12 --set checkpoint.dir="$tmp/c_$1"
  rc=$?; expect_fail 2 "$2"
}
# a first column near 2^63 (verify: SIGSEGV before)
crafted c0 's/"offset":0,"block":\[0,0,64,32\]/"offset":0,"block":[0,9223372036854775807,64,32]/'
refused c0 "manifest.json: tensor model.embed_tokens.weight, piece 0: block [0, 9223372036854775807, 64, 32] is outside the tensor's 32 columns or over 2^60 rows or elements"
# a block of 2^62 elements whose byte count wraps to 0 with a matching empty checksum (SIGSEGV before)
crafted wrap "s/$emb/\"model.embed_tokens.weight\",\"dtype\":\"$mine\",\"shape\":[64,2147483648],\"pieces\":[{\"kind\":\"param\",\"file\":0,\"offset\":0,\"block\":[0,0,2147483648,2147483648],\"range\":[0,4611686018427387904],\"fnv1a64\":\"cbf29ce484222325\"/"
refused wrap "tensor model.embed_tokens.weight, piece 0: block [0, 0, 2147483648, 2147483648] is outside the tensor's 2147483648 columns or over 2^60 rows or elements"
# a tensor whose shape's product overflows to 0, with no pieces (verify: "ok" before)
crafted shape 's/\]}\]}$/]},{"name":"x","dtype":"'$mine'","shape":[4,4611686018427387904],"pieces":[]}]}/'
refused shape "manifest.json: tensor x: shape [4, 4611686018427387904] has more than 2^60 elements"
# a tensor listed twice (verify: "ok" before; a resume read the first)
crafted twice 's/{"name":"model.norm.weight","dtype":"[A-Z0-9]*","shape":\[32\],"pieces":\[\({[^}]*},\?\)*\]}/&,&/'
refused twice "manifest.json: tensor model.norm.weight is listed twice (tensors["
# an offset near 2^63, and a negative one
crafted huge 's/"offset":0,"block"/"offset":9223372036854775800,"block"/'
refused huge "tensor model.embed_tokens.weight, piece 0: offset 9223372036854775800 is not a multiple of $REAL_BYTES, or its $((2048 * REAL_BYTES)) bytes would end past 2^63"
crafted negative 's/"offset":0,"block"/"offset":-8,"block"/'
refused negative "tensor model.embed_tokens.weight, piece 0: needs \"kind\" (param, exp_avg or exp_avg_sq), \"file\", \"offset\""
# a piece past the end of its shard file
crafted past 's/"offset":0,"block"/"offset":'$((shard_bytes - REAL_BYTES))',"block"/'
refused past "rank_00000.bin is truncated: model.embed_tokens.weight's param piece needs bytes [$((shard_bytes - REAL_BYTES)), $((shard_bytes + 2047 * REAL_BYTES))) of $shard_bytes"
# an exp_avg piece listed twice: every element in two pieces
crafted overlap 's/{"kind":"exp_avg","file":0,"offset":[0-9]*,"block":\[0,0,64,32\][^}]*}/&,&/'
refused overlap "/step_00000010: element [0, 0] of model.embed_tokens.weight (exp_avg) is in two pieces"
# a gap (row 0) and an overlap (row 5) of the same 32 elements, every checksum right: a resume
# that counted the elements copied resumed from it with row 0 zero
crafted cancel 's/\({"kind":"exp_avg","file":0,"offset":[0-9]*,"block":\[\)0\(,0,64,32\][^}]*}\)/\11\2,'"$(echo "$norm_piece" | sed 's/"param"/"exp_avg"/; s/\[0,0,32,1\]/[5,0,1,32]/')"'/'
refused cancel "/step_00000010: element [0, 0] of model.embed_tokens.weight (exp_avg) is in no piece"

echo ok
