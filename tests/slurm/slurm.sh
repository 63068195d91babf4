#!/usr/bin/env bash
# tycho under a real Slurm: a one-node cluster of the test's own (tests/slurm/cluster.sh; Debian's
# slurm-wlm and munge installed first when missing, the test skipped with the reason where they
# cannot be) runs
#   - `srun --mpi=pmix -n 4 tycho run` of tests/plans/good/dp_small.lua as dp 4 with ZeRO-3 and as
#     tp 2 x dp 2 with ZeRO-1: every metrics record (loss, lr, grad norm, tokens, evals) equal to
#     the same plan's under mpirun, bit for bit, the ranks' threads from --cpus-per-task 1;
#   - the REPL front-end with --launcher 'srun --mpi=pmix -n {n}': each rank's t.rank is Slurm's
#     SLURM_PROCID and, on one node, its SLURM_LOCALID; a step trains;
#   - `tycho rehearse --launcher 'srun --mpi=pmix -n {n}'` of tiny.lua at tp 2 x dp 2: the layout holds;
#   - the script of `tycho check --sbatch` submitted with sbatch: the job completes and its
#     metrics equal the mpirun run's.
# Debian's Open MPI starts under srun through PMIx only (srun --mpi=pmix; without it, or with
# pmi2, MPI_Init fails). The daemons are stopped at the end, also on failure.
# usage: slurm.sh TYCHO   (run from the source folder)
set -u
tycho=$(readlink -f "$1")
here=$(dirname "$0")
. "$here/cluster.sh"
slurm_install || exit $?
tmp=$(mktemp -d)
trap 'slurm_stop; rm -rf "$tmp"' EXIT
fail() { echo "--- output"; cat "$tmp/out" 2>/dev/null; echo "FAIL: $*"; exit 1; }
start=$(date +%s)
slurm_start "$tmp/slurm" 8 || fail "the test cluster did not start"
echo "cluster up in $(( $(date +%s) - start )) s: $(sinfo -h -N -o '%N %c CPUs %t')"

export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1
plan=tests/plans/good/dp_small.lua
launcher="srun --mpi=pmix -n {n}"

# The metrics without their clock fields: what two runs of one layout must agree on.
records() { sed -e 's/, "tokens_per_sec": [-0-9.eE+]*//' -e 's/, "model_tflops": [-0-9.eE+]*//' -e 's/, "elapsed_s": [-0-9.eE+]*//' "$1"; }
same_metrics() { # NAME A B
  [ -s "$2" ] || fail "$1: no metrics at $2"
  [ "$(grep -c '"loss"' "$3")" -eq 20 ] || fail "$1: $(grep -c '"loss"' "$3") step records in $3, expected 20"
  diff <(records "$2") <(records "$3") >"$tmp/diff" || { cat "$tmp/diff"; fail "$1: the metrics differ from mpirun's (above)"; }
}

# 1. tycho run under srun against mpirun
for layout in "dp4_zero3 --set zero=3" "tp2_dp2 --set mesh.tp=2 --set zero=1"; do
  read -r name sets <<<"$layout"
  # shellcheck disable=SC2086
  timeout 60 mpirun -np 4 "$tycho" run "$plan" $sets --set log.metrics="$tmp/$name.mpirun.jsonl" >"$tmp/out" 2>&1 ||
    fail "$name: mpirun run failed"
  # shellcheck disable=SC2086
  timeout 60 env -u OMP_NUM_THREADS srun --mpi=pmix -n 4 --cpus-per-task=1 "$tycho" run "$plan" $sets \
    --set log.metrics="$tmp/$name.srun.jsonl" >"$tmp/out" 2>&1 || fail "$name: srun run failed"
  grep -q '^run dp-small: .*, 1 thread\( (.*)\)\?$' "$tmp/out" || fail "$name: the header does not say 1 thread"
  grep -q '^step 20/20 | loss ' "$tmp/out" || fail "$name: no progress line for step 20"
  for ((r = 0; r < 4; r++)); do
    grep -q "^memory peak, rank $r: " "$tmp/out" || fail "$name: no memory line for rank $r (a world of 4?)"
  done
  same_metrics "$name" "$tmp/$name.mpirun.jsonl" "$tmp/$name.srun.jsonl"
  echo "ok $name: srun -n 4 equals mpirun -np 4 (20 steps, 2 evals)"
done

# 2. the REPL front-end, its ranks started by srun
printf '%s\n' '=t.rank == tonumber(os.getenv("SLURM_PROCID"))' '=t.rank == tonumber(os.getenv("SLURM_LOCALID"))' \
  '=t.world .. " " .. os.getenv("SLURM_NTASKS")' '=t:step(2)' |
  timeout 60 "$tycho" repl "$plan" -n 4 --launcher "$launcher" --set zero=3 >"$tmp/out" 2>&1 ||
  fail "repl: exit code $?"
want='> =t.rank == tonumber(os.getenv("SLURM_PROCID"))
[0-3] true
> =t.rank == tonumber(os.getenv("SLURM_LOCALID"))
[0-3] true
> =t.world .. " " .. os.getenv("SLURM_NTASKS")
[0-3] 4 4
> =t:step(2)'
[ "$(head -n 7 "$tmp/out")" == "$want" ] || fail "repl: the session differs from: $want"
loss=$(grep -o '"loss": [-0-9.eE+]*' "$tmp/dp4_zero3.mpirun.jsonl" | sed -n 2p | awk '{ printf "%.14g", $2 }')
grep -qx "\[0-3\] $loss" "$tmp/out" || fail "repl: t:step(2) did not return step 2's loss $loss"
echo "ok repl: 4 ranks by srun, ranks and local ranks Slurm's, t:step(2) = $loss"

# 3. rehearse, its ranks started by srun
timeout 60 "$tycho" rehearse plans/tiny.lua --world 4 --launcher "$launcher" --set mesh.tp=2 --set zero=1 \
  >"$tmp/out" 2>&1 || fail "rehearse: exit code $?"
grep -Eq '^verdict +the layout holds$' "$tmp/out" || fail "rehearse: no verdict that the layout holds"
echo "ok rehearse: tp 2 x dp 2 under srun holds"

# 4. a batch script from check --sbatch, submitted and waited for
"$tycho" check "$plan" --world 4 --cluster "$here/local4.lua" --sbatch --set zero=3 \
  --set log.metrics="$tmp/job.jsonl" >"$tmp/job.sh" 2>"$tmp/out" || fail "check --sbatch: exit code $?"
job=$(sbatch --parsable --output="$tmp/job.out" "$tmp/job.sh" 2>"$tmp/out") || fail "sbatch refused the script"
for _ in $(seq 200); do
  [ -z "$(squeue -h -j "$job" 2>/dev/null)" ] && break
  sleep 0.2
done
scontrol show job "$job" >"$tmp/out" 2>&1
grep -q 'JobState=COMPLETED .*' "$tmp/out" || { cat "$tmp/job.out"; fail "job $job did not complete"; }
grep -q 'ExitCode=0:0' "$tmp/out" || { cat "$tmp/job.out"; fail "job $job: exit code not 0"; }
grep -q '^step 20/20 | loss ' "$tmp/job.out" || { cp "$tmp/job.out" "$tmp/out"; fail "job $job: no progress line for step 20"; }
same_metrics "sbatch job" "$tmp/dp4_zero3.mpirun.jsonl" "$tmp/job.jsonl"
echo "ok sbatch: job $job completed, its metrics equal mpirun's"
echo "ok: the slurm test in $(( $(date +%s) - start )) s"
