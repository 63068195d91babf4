#!/usr/bin/env bash
# `tycho run` under mpirun when something is wrong: every rank stops, within seconds, with one
# message (printed by rank 0 alone) and the documented exit code. Modes:
#   world_mismatch  --set mesh.dp=4 on 2 ranks: the plan error naming the world size (exit 2)
#   hash_mismatch   two ranks compiled with different --set: the plan-hash error naming both (2)
#   rank_dependent  a plan whose seed comes from os.getenv(rank): the same error, naming the cause (2)
#   bf16_refused    --set precision.compute=bf16 with precision.grads = "fp16": the bf16 mode keeps
#                   gradients in fp32 or bf16, said by name on one line (2)
#   data_one_rank   data.train is relative and only rank 0's working folder has it: every rank
#                   stops after set-up with "rank 1: data.train: ..." (1)
#   export_fails    export.path cannot be written (in /proc; export.every 5, zero 3): tried before
#                   step 1, every rank stops with rank 0's message naming export.path (1)
#   leave_early     rank 1 leaves after step 3 (TYCHO_TEST_LEAVE_AFTER_STEP) and waits for the others
#                   in comm_finalize: the comm watchdog (TYCHO_COMM_TIMEOUT=3) ends the job with its
#                   diagnosis, rank 1 answering where it waits (1)
#   leave_early_pp  the same with two pipeline stages: rank 0's sends and receives to the stage
#                   that left are diagnosed (1)
# usage: run_errors.sh MODE MPIEXEC NUMPROC_FLAG TYCHO   (run from the source folder)
set -u
mode=$1 mpiexec=$2 np=$3 tycho=$4
src=$PWD
plan=$src/tests/plans/good/dp_small.lua
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fail() { echo "--- stdout"; cat "$tmp/out"; echo "--- stderr"; cat "$tmp/err"; echo "FAIL: $*"; exit 1; }

start=$(date +%s%N)
case $mode in
  world_mismatch)
    timeout 240 "$mpiexec" "$np" 2 "$tycho" run "$plan" --set mesh.dp=4 ;;
  hash_mismatch)
    timeout 240 "$mpiexec" "$np" 1 "$tycho" run "$plan" --set seeds.global=1 : \
      "$np" 1 "$tycho" run "$plan" --set seeds.global=2 ;;
  rank_dependent)
    printf 'local p = dofile("%s")\np.seeds = { global = tonumber(os.getenv("OMPI_COMM_WORLD_RANK") or "0") }\nreturn p\n' \
      "$plan" >"$tmp/rank_plan.lua"
    timeout 240 "$mpiexec" "$np" 2 "$tycho" run --unsafe "$tmp/rank_plan.lua" ;;
  bf16_refused)
    timeout 240 "$mpiexec" "$np" 2 "$tycho" run "$plan" --set precision.compute=bf16 --set precision.grads=fp16 ;;
  data_one_rank)
    mkdir -p "$tmp/a" "$tmp/b" && cp tests/golden/llama_ref_tokens.bin "$tmp/a/train.bin"
    sets=(--set data.train=train.bin --set init.from="$src/tests/golden/llama_ref_init.safetensors"
          --set batch.micro=2)
    ref=$src/tests/golden/llama_ref_plan.lua
    timeout 240 "$mpiexec" "$np" 1 -wdir "$tmp/a" "$tycho" run "$ref" "${sets[@]}" : \
      "$np" 1 -wdir "$tmp/b" "$tycho" run "$ref" "${sets[@]}" ;;
  export_fails)
    timeout 240 "$mpiexec" "$np" 2 "$tycho" run "$plan" --set zero=3 --set export.every=5 \
      --set export.path=/proc/tycho-test/model.safetensors ;;
  leave_early)
    TYCHO_COMM_TIMEOUT=3 timeout 240 "$mpiexec" "$np" 1 "$tycho" run "$plan" --set train.steps=1000 : \
      "$np" 1 env TYCHO_TEST_LEAVE_AFTER_STEP=3 "$tycho" run "$plan" --set train.steps=1000 ;;
  leave_early_pp)
    TYCHO_COMM_TIMEOUT=3 timeout 240 "$mpiexec" "$np" 1 "$tycho" run "$plan" --set train.steps=1000 --set mesh.pp=2 : \
      "$np" 1 env TYCHO_TEST_LEAVE_AFTER_STEP=3 "$tycho" run "$plan" --set train.steps=1000 --set mesh.pp=2 ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac >"$tmp/out" 2>"$tmp/err"
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "--- mode $mode: exit code $rc after $elapsed_ms ms"
[ "$rc" -ne 124 ] || fail "the job hung until timeout 240 killed it"
[ "$elapsed_ms" -lt 20000 ] || fail "the job took $elapsed_ms ms"

# The first line of stderr is tycho's (mpirun's own report comes after), and it comes once.
first=$(head -n 1 "$tmp/err")
expect_first() {
  case "$first" in "$1"*) ;; *) fail "first stderr line '$first', expected '$1...'" ;; esac
  [ "$(grep -c '^tycho: ' "$tmp/err")" -eq 1 ] || fail "expected one 'tycho:' line on stderr"
}
expect_rc() { [ "$rc" -eq "$1" ] || fail "exit code $rc, expected $1"; }
expect_err() { grep -qF -- "$1" "$tmp/err" || fail "expected on stderr: $1"; }

case $mode in
  world_mismatch)
    expect_rc 2
    expect_first 'tycho: plan error: --set mesh.dp=4: mesh.dp = 4: tp 1 × pp 1 × dp 4 = 4 ranks, but the world has 2; set dp = 2 or dp = "auto"' ;;
  hash_mismatch)
    expect_rc 2
    expect_first 'tycho: plan error: plan hash differs: rank 0 has '
    grep -qE '^tycho: plan error: plan hash differs: rank 0 has [0-9a-f]{16}, rank 1 has [0-9a-f]{16} \(compiled from ' "$tmp/err" ||
      fail "expected both ranks' hashes" ;;
  rank_dependent)
    expect_rc 2
    expect_first 'tycho: plan error: plan hash differs: rank 0 has '
    expect_err "the plan may not depend on what differs between ranks: os.getenv, os.time" ;;
  bf16_refused)
    expect_rc 2
    if "$tycho" --version | grep -q "float64 kernels"; then
      # the float64 build has no bf16 kernels: bf16 itself is refused, before the finer reason
      expect_first 'tycho: plan error: --set precision.compute=bf16: precision.compute = "bf16": this build'
    else
      expect_first 'tycho: plan error: --set precision.grads=fp16: precision.grads = "fp16": gradients are kept in fp32 or bf16 on the CPU'
    fi ;;
  data_one_rank)
    expect_rc 1
    expect_first 'tycho: rank 1: data.train: train.bin: cannot open: No such file or directory'
    grep -q '^step' "$tmp/out" && fail "a step ran" ;;
  export_fails)
    expect_rc 1
    expect_first 'tycho: rank 0: export.path /proc/tycho-test/model.safetensors: cannot create the folder /proc/tycho-test'
    grep -q '^step' "$tmp/out" && fail "a step ran before the refusal" ;;
  leave_early)
    expect_rc 1
    expect_err 'tycho: rank 1: leaving after step 3 (TYCHO_TEST_LEAVE_AFTER_STEP)'
    grep -qE '^tycho: rank 0: comm watchdog: [a-z-]+ on dp \(seq [0-9]+, [0-9]+ bytes, step 4, mb [0-9]+\) has not finished after 3\.[0-9] s \(TYCHO_COMM_TIMEOUT=3\); aborting the job' "$tmp/err" ||
      fail "expected the watchdog's diagnosis of step 4 on rank 0"
    grep -qE '^    rank 1: not in a dp operation; its last, [a-z-]+ seq [0-9]+, ended [0-9.]+ s ago; it waits in comm_finalize waiting for every rank to leave for [0-9.]+ s' "$tmp/err" ||
      fail "expected rank 1 to answer that it waits in comm_finalize" ;;
  leave_early_pp)
    expect_rc 1
    expect_err 'tycho: rank 1: leaving after step 3 (TYCHO_TEST_LEAVE_AFTER_STEP)'
    grep -qE '^tycho: rank 0: comm watchdog: (send|recv|broadcast|all-gather) on pp \(seq [0-9]+, [0-9]+ bytes, step 4, mb -?[0-9]+\) has not finished after 3\.[0-9] s' "$tmp/err" ||
      fail "expected the watchdog's diagnosis of step 4 on the pp group"
    grep -qE '^    rank 1: not in a pp operation; its last, [a-z-]+ seq [0-9]+, ended [0-9.]+ s ago; it waits in comm_finalize waiting for every rank to leave for [0-9.]+ s' "$tmp/err" ||
      fail "expected rank 1 to answer that it waits in comm_finalize" ;;
esac
echo "ok: $mode"
