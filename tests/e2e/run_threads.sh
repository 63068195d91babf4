#!/usr/bin/env bash
# `tycho run`'s thread count comes from the CPUs the process is given, and its header says
# where from: one thread under `taskset -c 0` ("affinity mask: 1 CPU"), OMP_NUM_THREADS as the
# explicit override (under taskset too), the whole mask for one rank, the mask shared by two
# ranks that mpirun did not bind, and one CPU for a rank it bound (a one-layer tiny plan, one step:
# only the header matters). The weights do not depend on the count: 1, 2 and 3 threads train the
# same bits; and beside busy processes on its CPUs a run takes fewer threads, says so, and still
# trains those bits.
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
  out=$(timeout 300 "$@" run plans/tiny.lua --set train.steps=1 --set train.eval_every=0 --set train.eval_batches=1 --set model.n_layers=1 2>&1)
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
  out=$(timeout 300 mpirun --bind-to core -np 2 "$tycho" run plans/tiny.lua --set train.steps=1 --set train.eval_batches=1 --set model.n_layers=1 \
    --set train.eval_every=0 2>&1) || fail "mpirun --bind-to core: $out"
  line=$(printf '%s\n' "$out" | head -1)
  case "$line" in *" bound to this rank)") echo "ok: bound: ${line##*, }" ;;
    *) fail "mpirun --bind-to core: header '$line' does not say the mask is bound to the rank" ;; esac
fi

# the products' engine, as the second line of the header says; a wrong TYCHO_GEMM is named
one=(run plans/tiny.lua --set train.steps=1 --set train.eval_every=0 --set train.eval_batches=1 --set model.n_layers=1)
out=$(TYCHO_GEMM=openblas timeout 300 "$tycho" "${one[@]}" 2>&1) || fail "TYCHO_GEMM=openblas: $out"
printf '%s\n' "$out" | grep -q "^kernels: .*, products on OpenBLAS's sgemm in row tiles, " ||
  fail "TYCHO_GEMM=openblas: the header does not say OpenBLAS computes the products: $out"
out=$(TYCHO_GEMM=bogus timeout 300 "$tycho" "${one[@]}" 2>&1) || fail "TYCHO_GEMM=bogus: $out"
printf '%s\n' "$out" | grep -q "^tycho: TYCHO_GEMM=bogus: not one of openblas, onednn; the products use " ||
  fail "TYCHO_GEMM=bogus is not named: $out"
echo "ok: TYCHO_GEMM"

tmp=$(mktemp -d /tmp/tycho-threads.XXXXXX)
busy=()
cleanup() { local p; for p in "${busy[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
short=(run plans/tiny.lua --set model.n_layers=2 --set train.eval_every=0 --set train.eval_batches=1)
for t in 1 2 3; do
  out=$(OMP_NUM_THREADS=$t timeout 300 "$tycho" "${short[@]}" --set train.steps=6 --set export.path="$tmp/w$t.bin" 2>&1) ||
    fail "OMP_NUM_THREADS=$t: $out"
done
cmp -s "$tmp/w1.bin" "$tmp/w2.bin" || fail "2 threads trained other weights than 1"
cmp -s "$tmp/w1.bin" "$tmp/w3.bin" || fail "3 threads trained other weights than 1"
echo "ok: 1, 2 and 3 threads train the same weights"

if [ "$cpus" -ge 2 ]; then
  # busy processes on this process's CPUs (they inherit its mask): more than the CPUs can hold
  for _ in $(seq $((cpus + 1))); do yes > /dev/null & busy+=($!); done
  out=$(timeout 300 "$tycho" "${short[@]}" --set train.steps=150 --set log.every=1000 --set export.path="$tmp/busy.bin" \
    --set log.metrics="$tmp/busy.jsonl" 2>&1) || fail "beside busy processes: $out"
  for p in "${busy[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  busy=()
  printf '%s\n' "$out" | grep -q "^threads: fewer while other programs use this rank's $cpus CPUs" ||
    fail "the header does not say the count follows the load: $out"
  printf '%s\n' "$out" | grep -Eq "^step [0-9]+: [0-9]+ threads? from here: other programs are using [0-9.]+ of the $cpus CPUs" ||
    fail "beside $((cpus + 1)) busy processes the run did not take fewer threads: $out"
  grep -o '"threads": [0-9]*' "$tmp/busy.jsonl" | awk -v c="$cpus" '$2 < c { f = 1 } END { exit !f }' ||
    fail "no step of the metrics ran with fewer threads: $(head -3 "$tmp/busy.jsonl")"
  out=$(OMP_NUM_THREADS=1 timeout 300 "$tycho" "${short[@]}" --set train.steps=150 --set log.every=1000 \
    --set export.path="$tmp/one.bin" 2>&1) || fail "150 steps on one thread: $out"
  cmp -s "$tmp/busy.bin" "$tmp/one.bin" || fail "the run whose thread count changed trained other weights than one thread"
  echo "ok: beside busy processes, steps by thread count:$(grep -o '"threads": [0-9]*' "$tmp/busy.jsonl" | sort | uniq -c | tr -s ' \n' ' '); the same weights as one thread"
fi
echo "run_threads: ok"
