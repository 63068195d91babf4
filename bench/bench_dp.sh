#!/usr/bin/env bash
# Step time of the tiny plan (or PLAN) on 1, 2 and 4 data-parallel ranks for each ZeRO stage,
# with the speed-up over one rank: runs build/bench/bench_dp under mpirun.
# usage: bench/bench_dp.sh [SECONDS per run, default 5] [extra bench_dp arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-5}
shift || true
exe=build/bench/bench_dp
[ -x "$exe" ] || { echo "build first: cmake --build build (missing $exe)"; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader} OMPI_MCA_mpi_yield_when_idle=1
echo "bench_dp: $(nproc) cores, OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset} (unset: the cores shared among the ranks)"
for zero in 0 1 2 3; do
  base=$(mpirun -np 1 "$exe" --zero "$zero" --seconds "$seconds" "$@")
  echo "$base"
  base_ms=$(echo "$base" | sed -E 's/.* ([0-9.]+) ms\/step.*/\1/')
  for ranks in 2 4; do
    mpirun -np "$ranks" "$exe" --zero "$zero" --seconds "$seconds" --base-ms "$base_ms" "$@"
  done
done
