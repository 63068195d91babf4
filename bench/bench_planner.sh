#!/usr/bin/env bash
# The planner's speed targets (issue figures: check of the 70B plan for 4096 ranks with JSON in
# well under half a second; tune of the 70B model for 1024 ranks in under 2 seconds). Measures,
# asserts nothing: best of 5 runs each, in milliseconds.
# usage: bench/bench_planner.sh [build/tycho]   (from the source folder)
set -u
tycho=${1:-build/tycho}
best() {
  local b=999999 t0 t1 ms
  for _ in 1 2 3 4 5; do
    t0=$(date +%s%N); "$@" >/dev/null || return 1; t1=$(date +%s%N)
    ms=$(( (t1 - t0) / 1000000 )); [ "$ms" -lt "$b" ] && b=$ms
  done
  echo "$b"
}
out=$(mktemp) && trap 'rm -f "$out"' EXIT
echo "check 70b --world 4096 --json:                 $(best "$tycho" check plans/llama2_70b.lua --world 4096 --json) ms"
echo "check 70b --world 4096 --json --cluster h100:  $(best "$tycho" check plans/llama2_70b.lua --world 4096 --json --cluster plans/clusters/h100_80g_ib.lua) ms"
echo "check 70b --world 64 (text, with the timeline): $(best "$tycho" check plans/llama2_70b.lua --world 64) ms"
echo "tune 70b --world 1024 --cluster h100:          $(best "$tycho" tune plans/llama2_70b.lua --world 1024 --cluster plans/clusters/h100_80g_ib.lua --out "$out") ms"
