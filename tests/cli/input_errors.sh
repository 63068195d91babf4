#!/usr/bin/env bash
# Exit codes by class: bad content in an input the user gave exits 2 with one line naming the
# file and what is wrong, one case per kind of input — weights (init.from), token files
# (data.train, data.val), a checkpoint's manifest, a cluster file — and a lock held by another
# run. These exited 1, the code of a failure of the machine or a peer.
# usage: input_errors.sh TYCHO   (run from the source folder)
set -u
tycho=$1
plan=tests/golden/llama_ref_plan.lua
tmp=$(mktemp -d)
holder=
trap '[ -n "$holder" ] && kill "$holder" 2>/dev/null; rm -rf "$tmp"' EXIT
failed=0
# expect CODE TEXT COMMAND ARGS...: `tycho COMMAND ARGS` exits with CODE within 60 s, TEXT in its
# only stderr line
expect() {
  local code=$1 text=$2
  shift 2
  local stderr rc
  stderr=$(timeout 60 "$tycho" "$@" 2>&1 >/dev/null </dev/null)
  rc=$?
  if [ "$rc" -ne "$code" ]; then
    echo "FAIL: $* exited $rc, expected $code (124: it hung); stderr: $stderr"; failed=1; return
  fi
  if [ "$(printf '%s\n' "$stderr" | wc -l)" -ne 1 ]; then
    echo "FAIL: $*: more than one line on stderr: $stderr"; failed=1; return
  fi
  case "$stderr" in
    *"$text"*) echo "ok   $*" ;;
    *) echo "FAIL: $*: stderr '$stderr' lacks '$text'"; failed=1 ;;
  esac
}
# st FILE HEADER DATA_BYTES: a safetensors file with that JSON header and DATA_BYTES zero bytes
st() {
  local n=${#2}
  printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8 & 255)) \
    $((n >> 16 & 255)) $((n >> 24 & 255)))" >"$1"
  printf '%s' "$2" >>"$1"
  head -c "$3" /dev/zero >>"$1"
}

# weights: offsets past the data, overlapping tensors, a tensor the model lacks, one missing, a
# dtype tycho does not read
st "$tmp/past.safetensors" '{"model.embed_tokens.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}}' 8
expect 2 "tycho: init.from: $tmp/past.safetensors: tensor 'model.embed_tokens.weight': data_offsets [0, 16] run past the end of the 8-byte data area" \
  run $plan --set init.from="$tmp/past.safetensors"
st "$tmp/overlap.safetensors" '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}' 12
expect 2 "tycho: init.from: $tmp/overlap.safetensors: tensors 'a' [0, 8] and 'b' [4, 12] overlap" \
  run $plan --set init.from="$tmp/overlap.safetensors"
st "$tmp/foreign.safetensors" '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' 8
expect 2 "tycho: init.from $tmp/foreign.safetensors: tensor 'a' is not a parameter of this model" \
  run $plan --set init.from="$tmp/foreign.safetensors"
st "$tmp/empty.safetensors" '{}' 0
expect 2 "tycho: init.from $tmp/empty.safetensors: tensor 'model.embed_tokens.weight' is missing" \
  run $plan --set init.from="$tmp/empty.safetensors"

st "$tmp/dtype.safetensors" '{"model.embed_tokens.weight":{"dtype":"I32","shape":[64,32],"data_offsets":[0,8192]}}' 8192
expect 2 "tycho: init.from $tmp/dtype.safetensors: tensor 'model.embed_tokens.weight' is I32; F32, F16, BF16 and F64 are read" \
  run $plan --set init.from="$tmp/dtype.safetensors"
# a Hugging Face folder (exported by a 1-step run) whose index names a file outside it, or
# whose shard is a FIFO
timeout 60 "$tycho" run $plan --set train.steps=1 --set export.path="$tmp/hf" --set export.format=hf \
  --set export.shard_mb=0.05 >/dev/null 2>&1 || { echo "FAIL: the export run"; failed=1; }
cp -r "$tmp/hf" "$tmp/hf_up"
sed -i '0,/"model-00001-of-00002.safetensors"/s//"..\/model-00001-of-00002.safetensors"/' "$tmp/hf_up/model.safetensors.index.json"
expect 2 "tycho: init.from: $tmp/hf_up/model.safetensors.index.json: weight_map entry 'model.embed_tokens.weight' must be a file name inside the index's folder" \
  run $plan --set init.from="$tmp/hf_up"
cp -r "$tmp/hf" "$tmp/hf_fifo"
rm "$tmp/hf_fifo/model-00002-of-00002.safetensors" && mkfifo "$tmp/hf_fifo/model-00002-of-00002.safetensors"
expect 2 "tycho: init.from: $tmp/hf_fifo/model-00002-of-00002.safetensors: is a FIFO, not a regular file" \
  run $plan --set init.from="$tmp/hf_fifo"

# token files: a count the file does not hold, an odd length, a token id not below the vocab, an
# empty file, one for data.val
{ head -c 8 tests/golden/llama_ref_tokens.bin; printf '\x88\x13\x00\x00'; tail -c +13 tests/golden/llama_ref_tokens.bin; } \
  >"$tmp/count.bin" # the header says 5000 tokens, 3000 follow
expect 2 "tycho: data.train: $tmp/count.bin: header says 5000 tokens but the file holds 6000 bytes of uint16 tokens after the header (3000 tokens)" \
  run $plan --set data.train="$tmp/count.bin"
head -c 7001 tests/golden/llama_ref_tokens.bin | tail -c 6001 >"$tmp/odd.bin"
expect 2 "tycho: data.train: $tmp/odd.bin: 6001 bytes is odd and the magic 20240520 is absent" \
  run $plan --set data.train="$tmp/odd.bin"
printf '\x01\x00\x02\x00\xff\x00' >"$tmp/vocab.bin"
head -c 200 /dev/zero >>"$tmp/vocab.bin"
expect 2 "tycho: data.train: $tmp/vocab.bin: token 255 at index 2 (byte offset 4) is not below vocab 64" \
  run $plan --set data.train="$tmp/vocab.bin"
: >"$tmp/empty.bin"
expect 2 "tycho: data.train: $tmp/empty.bin: 0 tokens, shorter than one window of seq_len + 1 = 17 tokens" \
  run $plan --set data.train="$tmp/empty.bin"
expect 2 "tycho: data.val: $tmp/odd.bin: 6001 bytes is odd" \
  run $plan --set data.val="$tmp/odd.bin" --set train.eval_every=4

# a checkpoint whose manifest is not one: the resume refuses it
mkdir -p "$tmp/ck/step_00000002"
printf '{"format": "other"}' >"$tmp/ck/step_00000002/manifest.json"
expect 2 "$tmp/ck/step_00000002/manifest.json: not a tycho checkpoint manifest (\"format\" is not \"tycho-checkpoint\")" \
  run $plan --set checkpoint.dir="$tmp/ck"
expect 2 "$tmp/ck/step_00000002/manifest.json: not a tycho checkpoint manifest" ckpt verify "$tmp/ck/step_00000002"

# a cluster file that is not one
printf 'return { name = "x" }\n' >"$tmp/cluster.lua"
expect 2 "tycho: cluster error: $tmp/cluster.lua" check $plan --cluster "$tmp/cluster.lua"

# checkpoint.dir locked by another run (its lock held, as a running job holds it)
mkdir -p "$tmp/locked"
printf '4242 otherhost\n' >"$tmp/locked/.lock"
bash -c 'exec 9>>"$1" && flock 9 && exec sleep 120' _ "$tmp/locked/.lock" >/dev/null 2>&1 </dev/null &
holder=$! # the lock's holder, sleep itself after the execs
for _ in $(seq 100); do flock -n "$tmp/locked/.lock" true || break; sleep 0.1; done
expect 2 "tycho: checkpoint.dir $tmp/locked: in use by another run (pid 4242 on host otherhost; lock $tmp/locked/.lock)" \
  run $plan --set checkpoint.dir="$tmp/locked"
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
holder=

[ "$failed" -eq 0 ] || exit 1
echo "ok: input errors exit 2"
