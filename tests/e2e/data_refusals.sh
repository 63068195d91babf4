#!/usr/bin/env bash
# `tycho run` refuses data it cannot use, at once and naming the field: a FIFO as data.train (its
# open waited for a writer forever; now exit 2, a plan error), an llm.c file with a wrong magic
# (it was read as raw tokens and refused for "token 24910 ... is not below vocab 64"; now exit 2,
# an input error, where it was 1), evaluation asked for without a validation set (it was skipped
# without a word; now a plan error naming train.eval_every and data.val), and train.eval_batches
# beyond the validation set (it was unbounded; now exit 2 naming the largest allowed). A token
# file truncated while a run reads it ends the run with one line (exit 1).
# usage: data_refusals.sh TYCHO   (run from the source folder)
set -u
tycho=$1
plan=tests/golden/llama_ref_plan.lua
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
# expect CODE TEXT ARGS...: `tycho run ARGS` exits with CODE within 240 s, TEXT in its first stderr line
expect() {
  local code=$1 text=$2
  shift 2
  local stderr rc first
  stderr=$(timeout 240 "$tycho" run "$@" 2>&1 >/dev/null </dev/null)
  rc=$?
  first=$(printf '%s\n' "$stderr" | head -n 1)
  if [ "$rc" -ne "$code" ]; then
    echo "FAIL: run $* exited $rc, expected $code (124: it hung); stderr: $stderr"; failed=1; return
  fi
  case "$first" in
    *"$text"*) echo "ok   run $*" ;;
    *) echo "FAIL: run $*: first stderr line '$first' lacks '$text'"; failed=1 ;;
  esac
}

mkfifo "$tmp/train.fifo"
expect 2 "tycho: plan error: data.train $tmp/train.fifo: is a FIFO, not a regular file" \
  $plan --set data.train="$tmp/train.fifo"
expect 2 "tycho: plan error: data.val $tmp/train.fifo: is a FIFO, not a regular file" \
  $plan --set data.val="$tmp/train.fifo"

# the reference tokens with the magic 12345678 in place of 20240520
cp tests/golden/llama_ref_tokens.bin "$tmp/bad.bin"
printf '\x4e\x61\xbc\x00' | dd of="$tmp/bad.bin" conv=notrunc status=none
expect 2 "tycho: data.train: $tmp/bad.bin: a bad llm.c header: magic 12345678 where llm.c writes 20240520" \
  $plan --set data.train="$tmp/bad.bin"

expect 2 'tycho: plan error: --set train.eval_every=4: train.eval_every = 4: evaluation needs a validation set, and data.train = "tests/golden/llama_ref_tokens.bin" comes without data.val; give data.val' \
  $plan --set train.eval_every=4
# train.eval_batches beyond the validation set (it wrapped round and evaluated on with no bound):
# refused naming the field, the value and the largest allowed, for a token file and for the
# synthetic addition corpus (whose held-out set is what the evaluator reads)
expect 2 "tycho: --set train.eval_batches=47: train.eval_batches = 47 is more than the validation set holds: data.val tests/golden/llama_ref_tokens.bin gives 187 windows of batch.seq + 1 = 17 tokens, 4 (batch.global) to a batch; at most 46" \
  $plan --set data.val=tests/golden/llama_ref_tokens.bin --set train.eval_batches=47
expect 2 "tycho: --set train.eval_batches=1270: train.eval_batches = 1270 is more than the validation set holds: the synthetic addition's held-out set of 100000 problems gives 40624 windows of batch.seq + 1 = 33 tokens, 32 (batch.global) to a batch; at most 1269" \
  plans/tiny.lua --set train.eval_batches=1270
# with data.val it evaluates
if timeout 60 "$tycho" run $plan --set train.eval_every=4 --set data.val=tests/golden/llama_ref_tokens.bin \
     >"$tmp/out" 2>&1 && grep -q 'eval at step 4: val loss' "$tmp/out"; then
  echo "ok   run with data.val evaluates"
else
  echo "FAIL: run with data.val:"; cat "$tmp/out"; failed=1
fi

# A token file truncated under a running job: reading a window past the new end faulted
# (SIGBUS, exit 135 with Open MPI's backtrace); now one line naming the file and exit 1.
# big.bin: the reference tokens three times under one llm.c header (9000 tokens, 562 windows).
g=tests/golden/llama_ref_tokens.bin
{ head -c 8 $g; printf '\x28\x23\x00\x00'; head -c 1012 /dev/zero; for i in 1 2 3; do tail -c +1025 $g; done; } \
  >"$tmp/big.bin"
timeout 120 "$tycho" run $plan --set data.train="$tmp/big.bin" --set train.steps=1000000 \
  >"$tmp/trunc.out" 2>"$tmp/trunc.err" </dev/null &
pid=$!
for _ in $(seq 1200); do grep -q '^step' "$tmp/trunc.out" 2>/dev/null && break; sleep 0.1; done
truncate -s 4096 "$tmp/big.bin"
wait $pid
rc=$?
if [ "$rc" -eq 1 ] && [ "$(wc -l <"$tmp/trunc.err")" -eq 1 ] &&
   grep -q "^tycho: $tmp/big.bin: the file shrank while the run had it mapped (truncated or rewritten in place): byte [0-9]* of the 19024 mapped is gone$" "$tmp/trunc.err"; then
  echo "ok   run with data.train truncated under it: exit 1, one line"
else
  echo "FAIL: run with data.train truncated under it exited $rc (expected 1); stderr:"; cat "$tmp/trunc.err"; failed=1
fi

[ "$failed" -eq 0 ] || exit 1
echo "ok: data refusals"
