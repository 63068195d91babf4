#!/usr/bin/env bash
# `tycho run` refuses what it cannot do, with one clear first line and the documented exit
# code: a plan for a CUDA device or fp16 compute (2, naming the field), a token file that is not
# there (1, naming it), init.from a file that is not there (1, naming it), a log.trace that
# cannot be written (1, before any step), --world that is not the MPI world (2), a zero-bubble
# schedule where the split backward does not run (zb-h1 with sparse layers, ZeRO 2 or 3 with
# zero_every "micro_batch"; 2, by run and rehearse).
# usage: run_refusals.sh TYCHO   (run from the source folder)
set -u
tycho=$1
expect() { # expect CODE TEXT ARGS...: exit code CODE and TEXT in the first stderr line
  local code=$1 text=$2
  shift 2
  local stderr rc first
  stderr=$("$tycho" run "$@" 2>&1 >/dev/null)
  rc=$?
  first=$(printf '%s\n' "$stderr" | head -n 1)
  [ "$rc" -eq "$code" ] || { echo "FAIL: $* exited $rc, expected $code; stderr: $stderr"; exit 1; }
  case "$first" in
    *"$text"*) ;;
    *) echo "FAIL: $*: first stderr line '$first' lacks '$text'"; exit 1 ;;
  esac
}
cuda_refusal='this build of tycho has no CUDA backend' # run_device.sh holds both messages whole
"$tycho" --version | grep -q ', with the CUDA backend)' && cuda_refusal='no CUDA device visible'
"$tycho" check tests/plans/good/train_small.lua | grep -q '^device  *auto → cpu here (' ||
  expect 2 "tycho: plan error: --set device=cuda: device = \"cuda\": $cuda_refusal" \
    tests/plans/good/train_small.lua --set device=cuda
expect 2 'tycho: plan error: --set precision.compute=fp16: precision.compute = "fp16": the CPU backend computes in fp32 or bf16' \
  tests/plans/good/train_small.lua --set precision.compute=fp16
expect 1 'tycho: data.train: /nonexistent/train.bin' \
  tests/golden/llama_ref_plan.lua --set data.train=/nonexistent/train.bin
expect 1 'tycho: init.from: /nonexistent/model.safetensors' tests/plans/good/train_small.lua --set init.from=/nonexistent/model.safetensors
expect 1 'tycho: log.trace /proc/nope/trace.json: cannot create the folder /proc/nope' tests/plans/good/train_small.lua \
  --set log.trace=/proc/nope/trace.json
expect 2 'tycho: --world 4: tycho run takes the world from MPI (1 rank here); start 4 ranks with mpirun -np 4' \
  tests/plans/good/train_small.lua --world 4
# zb-h1 runs on dense layers, under ZeRO 2 and 3 with zero_every "step" (the default with stages;
# one stage defaults to "micro_batch"); the rest is refused by name
zb='schedule.kind = "zb-h1" with zero = 2 and zero_every.grads = "micro_batch": a unit'"'"'s gradients are final only after its W'
expect 2 "tycho: plan error: --set schedule.kind=zb-h1: $zb" tests/plans/good/train_small.lua --set schedule.kind=zb-h1 \
  --set zero=2
rehearse_refuses() { # rehearse_refuses TEXT ARGS...: exit 2 and TEXT in what it prints
  local text=$1 out rc
  shift
  out=$("$tycho" rehearse "$@" 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || { echo "FAIL: rehearse $* exited $rc, expected 2: $out"; exit 1; }
  printf '%s\n' "$out" | grep -qF "$text" || { echo "FAIL: rehearse $* does not say why: $out"; exit 1; }
}
rehearse_refuses 'schedule.kind = "zb-h1" with model.moe (layer 1 is sparse): the split backward runs dense layers only' \
  tests/plans/good/moe_small.lua --world 2 --set mesh.pp=2 --set schedule.kind=zb-h1
rehearse_refuses 'schedule.kind = "zb-h1" with zero = 3 and zero_every.params = "micro_batch": every piece gathers the units it reads' \
  tests/plans/good/train_small.lua --world 2 --set mesh.pp=2 --set schedule.kind=zb-h1 --set zero=3 \
  --set zero_every.params=micro_batch
echo "ok: refusals"
