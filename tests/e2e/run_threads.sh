#!/usr/bin/env bash
# `tycho run`'s thread count comes from the CPUs the process is given, and its header says
# where from: one thread under `taskset -c 0` ("affinity mask: 1 CPU"), OMP_NUM_THREADS as the
# explicit override (under taskset too), the whole mask for one rank, the mask shared by two
# ranks that mpirun did not bind, and one CPU for a rank it bound (a one-layer tiny plan, one step:
# only the header matters).
# usage: run_threads.sh TYCHO   (run from the source folder)
set -u
tycho=$1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
unset OMP_NUM_THREADS SLURM_CPUS_PER_TASK
fail() { echo "FAIL: $*"; exit 1; }
# header EXPECTED COMMAND...: the run's first line ends with EXPECTED
header() {
  local want=$1 out rc line
  shift
  out=$(timeout 100 "$@" run plans/tiny.lua --set train.steps=1 --set train.eval_every=0 --set train.eval_batches=1 --set model.n_layers=1 2>&1)
  rc=$?
  [ "$rc" -eq 0 ] || fail "$*: exit $rc: $out"
  line=$(printf '%s\n' "$out" | head -1)
  case "$line" in *"$want") ;; *) fail "$*: header '$line' does not end with '$want'" ;; esac
  echo "ok: $* -> ...$want"
}
header ", 1 thread (affinity mask: 1 CPU)" taskset -c 0 "$tycho"
header ", 3 threads (OMP_NUM_THREADS=3, an explicit override)" env OMP_NUM_THREADS=3 "$tycho"
header ", 2 threads (OMP_NUM_THREADS=2, an explicit override)" taskset -c 0 env OMP_NUM_THREADS=2 "$tycho"
cpus=$(nproc) # the CPUs in this process's mask
s=s; [ "$cpus" -eq 1 ] && s=""
header ", $cpus thread$s (affinity mask: $cpus CPU$s)" "$tycho"
if [ "$cpus" -ge 2 ]; then
  half=$((cpus / 2)); hs=s; [ "$half" -eq 1 ] && hs=""
  header ", $half thread$hs (affinity mask: $cpus CPUs shared by 2 ranks on the node)" \
    mpirun --bind-to none -np 2 "$tycho"
  # bound to a core each: one CPU, or the core's hardware threads
  out=$(timeout 100 mpirun --bind-to core -np 2 "$tycho" run plans/tiny.lua --set train.steps=1 --set train.eval_batches=1 --set model.n_layers=1 \
    --set train.eval_every=0 2>&1) || fail "mpirun --bind-to core: $out"
  line=$(printf '%s\n' "$out" | head -1)
  case "$line" in *" bound to this rank)") echo "ok: bound: ${line##*, }" ;;
    *) fail "mpirun --bind-to core: header '$line' does not say the mask is bound to the rank" ;; esac
fi
echo "run_threads: ok"
