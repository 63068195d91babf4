#!/usr/bin/env bash
# Mixture of experts on this machine: plans/tiny_moe.lua (layers 1 and 3 sparse, 4 experts, top 2)
# against plans/tiny.lua (the same model dense), one rank; then tiny_moe on 2 ranks as dp 2
# (every rank computes every expert for its half of the batch) and as ep 2 inside dp 2 (each rank
# computes 2 of the 4 experts for both ranks' tokens, exchanged by all-to-all). Tokens/s is the
# median of the run's own per-step figures (log.metrics), the first WARMUP steps left out; each
# rank runs one thread. A benchmark, not a test: nothing is asserted.
# usage: bench/bench_moe.sh [TYCHO]      (run from the source folder; default build/tycho)
# environment: STEPS (default 60), WARMUP (default 5), MPIRUN (default mpirun)
set -u
tycho=${1:-build/tycho}
[ -x "$tycho" ] || { echo "bench_moe: no tycho binary at $tycho (give its path)"; exit 2; }
mpirun=${MPIRUN:-mpirun}
steps=${STEPS:-60}
warmup=${WARMUP:-5}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--set train.steps="$steps" --set train.eval_batches=0 --set log.every=1000)

median_tps() { # the median tokens/s of a metrics file's steps after the warm-up
  grep '"tokens_per_sec"' "$1" | sed 's/.*"tokens_per_sec": \([0-9.]*\).*/\1/' | tail -n +$((warmup + 1)) |
    sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
run() { # run NAME RANKS PLAN ARGS...
  local name=$1 ranks=$2 plan=$3 file
  shift 3
  file=$(printf '%s' "$name" | tr -c 'A-Za-z0-9_' '_')
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  if [ "$ranks" -eq 1 ]; then
    "$tycho" run "$plan" "${common[@]}" --set log.metrics="$tmp/$file.jsonl" "$@" >"$tmp/$file.out" 2>&1
  else
    "$mpirun" -np "$ranks" "$tycho" run "$plan" "${common[@]}" --set log.metrics="$tmp/$file.jsonl" "$@" \
      >"$tmp/$file.out" 2>&1
  fi || { echo "$name: the run failed"; tail -5 "$tmp/$file.out"; return 1; }
  printf '%-28s %5d ranks  %10.0f tokens/s   (load %s at start)\n' "$name" "$ranks" "$(median_tps "$tmp/$file.jsonl")" "$load"
}
echo "bench_moe: $steps steps each, median tokens/s after $warmup, on $(nproc --all) cores"
run "tiny (dense)" 1 plans/tiny.lua
run "tiny_moe" 1 plans/tiny_moe.lua
run "tiny_moe dp 2" 2 plans/tiny_moe.lua
run "tiny_moe dp 2, ep 2" 2 plans/tiny_moe.lua --set mesh.ep=2
run "tiny_moe dp 2, ep 2 dropless" 2 plans/tiny_moe.lua --set mesh.ep=2 --set model.moe.capacity_factor=0
