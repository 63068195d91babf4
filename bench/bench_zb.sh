#!/usr/bin/env bash
# 1F1B against ZB-H1 on CPU ranks: bench/plans/zb_pp4.lua (pp 4, 2 layers a stage, compute-bound
# stages, 16 micro-batches a step) run with schedule.kind = "1f1b" and "zb-h1", alternately,
# ROUNDS times each. A step's time is the plan's tokens over the run's own tokens/s of that step
# (log.metrics); each run gives the median of its steps after the first WARMUP, each schedule the
# median of its runs. Prints both and the ratio ZB-H1 / 1F1B of step times, with what the bubble
# check predicts for the same plan (`tycho check`: the simulator's idle time over the busy time).
# Each rank runs one thread; with fewer cores than ranks the ranks share them and an idle rank's
# core goes to a busy one, which hides a bubble (the machine's core count is printed). A
# benchmark, not a test: nothing is asserted.
# usage: bench/bench_zb.sh [TYCHO]      (run from the source folder; default build/tycho)
# environment: STEPS (default 12), WARMUP (default 2), ROUNDS (default 2), MPIRUN (default mpirun)
set -u
tycho=${1:-build/tycho}
[ -x "$tycho" ] || { echo "bench_zb: no tycho binary at $tycho (give its path)"; exit 2; }
mpirun=${MPIRUN:-mpirun}
steps=${STEPS:-12}
warmup=${WARMUP:-2}
rounds=${ROUNDS:-2}
plan=bench/plans/zb_pp4.lua
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
tokens=$(( $(sed -n 's/.*global = \([0-9]*\), micro = [0-9]*, seq = \([0-9]*\).*/\1 * \2/p' "$plan") ))
step_ms() { # step_ms METRICS: the median step time (ms) after the warm-up
  grep '"tokens_per_sec"' "$1" | sed 's/.*"tokens_per_sec": \([0-9.]*\).*/\1/' | tail -n +$((warmup + 1)) |
    awk -v t="$tokens" '$1 > 0 { print 1000 * t / $1 }' | median
}
echo "bench_zb: $plan, 4 ranks (pp 4), $steps steps a run after $warmup warm-up, $rounds rounds; $(nproc --all) cores, load $(cut -d' ' -f1 /proc/loadavg) at start"
for kind in 1f1b zb-h1; do
  bubble=$("$tycho" check "$plan" --json --set schedule.kind=$kind | grep -o '"bubble_over_ideal":[0-9.e+-]*' | cut -d: -f2)
  printf '  check predicts %-6s bubble %.1f%% of the busy time\n' "$kind" "$(awk -v b="$bubble" 'BEGIN { print 100 * b }')"
done
for ((r = 1; r <= rounds; r++)); do
  for kind in 1f1b zb-h1; do
    f="$tmp/$kind.$r"
    "$mpirun" -np 4 "$tycho" run "$plan" --set schedule.kind=$kind --set train.steps="$steps" \
      --set log.metrics="$f.jsonl" >"$f.out" 2>&1 || { echo "$kind: the run failed"; tail -5 "$f.out"; exit 1; }
    ms=$(step_ms "$f.jsonl")
    echo "$ms" >>"$tmp/$kind.all"
    printf '  round %d %-6s %8.1f ms/step\n' "$r" "$kind" "$ms"
  done
done
a=$(median <"$tmp/1f1b.all") b=$(median <"$tmp/zb-h1.all")
printf '1f1b %.1f ms/step, zb-h1 %.1f ms/step: zb-h1 / 1f1b = %.3f\n' "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { print b / a }')"
