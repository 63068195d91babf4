#!/usr/bin/env bash
# The step-time model against real runs on this machine: for plans/tiny.lua and
# bench/plans/predict_10m.lua (~10.7M parameters), `tycho calibrate` measures the machine at the
# plan's shapes and writes a cluster file; then each layout below trains a few steps, its step
# time is the median of the run's own per-step figures (log.metrics: the step's tokens over its
# tokens_per_sec, the first WARMUP steps left out), and the prediction is `tycho check --world N
# --cluster FILE --json`'s cost.step_seconds for the same plan and settings. Printed side by side
# with the relative error (predicted / measured − 1) and the 1-minute load average at the start of
# each of the layout's runs (other work on the cores shows there: on a quiet machine it stays
# near the ranks' own count).
#
# Every rank runs one thread (OMP_NUM_THREADS=1): a device of the calibrated file is one core
# running one rank. Layouts of at most CORES ranks are held to the goal (|error| <= 15%); the
# oversubscribed ones (more ranks than cores) are reported with the model's treatment of shared
# cores: every rank's compute, pointwise and optimizer time × ranks / cores, the collectives at
# their calibrated cost (host/check/cost.h). A benchmark, not a test: nothing is asserted.
#
# usage: bench/bench_predict.sh [TYCHO]       (run from the source folder; default build/tycho)
# environment: CLUSTER=FILE  use this cluster file for both plans instead of calibrating
#              STEPS_TINY (default 30), STEPS_10M (default 8), WARMUP (default 3),
#              ROUNDS (default 2: every layout runs once per round, the rounds' steps pooled),
#              REPS (calibrate's --reps, default 10), MPIRUN (default mpirun), KEEP=DIR (keep files),
#              PLANS (default "tiny 10m": which of the two plans to run)
# Open MPI as root needs OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; oversubscribed
# layouts need OMPI_MCA_rmaps_base_oversubscribe=1 (set here when unset).
set -u
tycho=${1:-build/tycho}
[ -x "$tycho" ] || { echo "bench_predict: no tycho binary at $tycho (give its path)"; exit 2; }
mpirun=${MPIRUN:-mpirun}
steps_tiny=${STEPS_TINY:-30}
steps_10m=${STEPS_10M:-8}
warmup=${WARMUP:-3}
rounds=${ROUNDS:-2}
reps=${REPS:-10}
cores=$(getconf _NPROCESSORS_ONLN)
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=${OMPI_MCA_rmaps_base_oversubscribe:-1}
if [ -n "${KEEP:-}" ]; then dir=$KEEP; mkdir -p "$dir"; else dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT; fi
start=$(date +%s)

echo "bench_predict: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $cores cores, load at start:$(cut -d' ' -f1-3 /proc/loadavg | sed 's/^/ /')"
echo "  $("$tycho" --version); one thread per rank; step = median over steps $((warmup + 1))..N of each run"

# measured step seconds: median of G / tokens_per_sec over training records with step >= warmup
measure() { # measure METRICS...
  python3 - "$warmup" "$@" <<'PY'
import json, statistics, sys
skip = int(sys.argv[1]); t = []
for path in sys.argv[2:]:
    for line in open(path):
        r = json.loads(line)
        if "tokens_per_sec" in r and r["step"] >= skip:
            t.append(r["tokens"] / (r["step"] + 1) / r["tokens_per_sec"])
if not t:
    print("nan nan nan"); sys.exit()
t.sort()
q = lambda f: t[min(len(t) - 1, int(f * len(t)))]
print("%.6f %.6f %.6f" % (statistics.median(t), q(0.1), q(0.9)))
PY
}

predict() { # predict PLAN WORLD CLUSTER SETS...
  local plan=$1 world=$2 cluster=$3
  shift 3
  "$tycho" check "$plan" --world "$world" --cluster "$cluster" --json "$@" |
    python3 -c 'import json,sys; print("%.6f" % json.load(sys.stdin)["cost"]["step_seconds"])'
}

layouts=(
  "serial|1|"
  "dp 2|2|--set mesh.dp=2"
  "tp 2, sequence parallel|2|--set mesh.tp=2 --set sequence_parallel=true"
  "pp 2, 1F1B|2|--set mesh.pp=2 --set schedule.kind=1f1b"
  "dp 2, zero 3|2|--set mesh.dp=2 --set zero=3"
  "dp 4 (oversubscribed)|4|--set mesh.dp=4"
  "tp 2 x dp 2 (oversubscribed)|4|--set mesh.tp=2 --set mesh.dp=2"
)

bad=0
summary=()
specs=()
for w in ${PLANS:-tiny 10m}; do
  case $w in
    tiny) specs+=("plans/tiny.lua|$steps_tiny") ;;
    10m) specs+=("bench/plans/predict_10m.lua|$steps_10m") ;;
    *) echo "bench_predict: PLANS holds '$w'; the plans are tiny and 10m"; exit 2 ;;
  esac
done
for spec in "${specs[@]}"; do
  plan=${spec%%|*}
  steps=${spec#*|}
  name=$(basename "$plan" .lua)
  cluster=${CLUSTER:-$dir/cluster_$name.lua}
  if [ -z "${CLUSTER:-}" ]; then
    echo
    echo "== calibrate at $plan's shapes: $mpirun -np $cores $tycho calibrate $plan --out $cluster --reps $reps"
    if ! timeout 300 "$mpirun" -np "$cores" "$tycho" calibrate "$plan" --out "$cluster" --reps "$reps" >"$dir/cal.log" 2>&1; then
      cat "$dir/cal.log"; echo "bench_predict: calibrate failed"; exit 1
    fi
    grep '^calibrated' "$dir/cal.log" | sed 's/^/   /'
  fi
  echo
  echo "== $plan, $rounds rounds of $steps steps per layout, cluster $cluster"
  # the runs, round by round (each round runs every layout once, so a burst of load on the
  # machine spreads over the layouts instead of falling on one)
  declare -A files=() loads=()
  for ((r = 1; r <= rounds; r++)); do
    for i in "${!layouts[@]}"; do
      l=${layouts[$i]}
      rest=${l#*|}
      n=${rest%%|*}
      sets=${rest#*|}
      m=$dir/m_${name}_${i}_${r}.jsonl
      rm -f "$m"
      loads[$i]="${loads[$i]:-}$(cut -d' ' -f1 /proc/loadavg) "
      # shellcheck disable=SC2086
      if ! timeout 600 "$mpirun" -np "$n" "$tycho" run "$plan" --set train.steps="$steps" --set train.eval_every=0 \
           --set log.every=100000 --set log.metrics="$m" $sets >"$dir/run.log" 2>&1; then
        tail -5 "$dir/run.log"; echo "   ${l%%|*}: the run failed"; bad=1; continue
      fi
      files[$i]="${files[$i]:-} $m"
    done
  done
  printf '   %-30s %5s  %12s  %12s  %-17s  %8s  %s\n' layout ranks "predicted ms" "measured ms" "(p10-p90)" error \
    "load at each run's start"
  for i in "${!layouts[@]}"; do
    l=${layouts[$i]}
    label=${l%%|*}
    rest=${l#*|}
    n=${rest%%|*}
    sets=${rest#*|}
    [ -n "${files[$i]:-}" ] || continue
    # shellcheck disable=SC2086
    pred=$(predict "$plan" "$n" "$cluster" $sets) || { echo "   $label: check failed"; bad=1; continue; }
    # shellcheck disable=SC2086
    read -r med p10 p90 < <(measure ${files[$i]})
    over=""
    [ "$n" -gt "$cores" ] && over=" (shared cores)"
    line=$(python3 -c 'import sys
p, m, a, b = map(float, sys.argv[1:5])
print("%12.1f  %12.1f  (%6.1f-%6.1f)  %+7.1f%%" % (1e3 * p, 1e3 * m, 1e3 * a, 1e3 * b, 100 * (p / m - 1)))' "$pred" "$med" "$p10" "$p90")
    printf '   %-30s %5s  %s  %s%s\n' "$label" "$n" "$line" "${loads[$i]% }" "$over"
    summary+=("$name|$label|$n|$pred|$med")
  done
  unset files loads
done

echo
python3 - "$cores" "${summary[@]}" <<'PY'
import sys
cores = int(sys.argv[1]); rows = [r.split("|") for r in sys.argv[2:]]
inside = [(r, float(r[3]) / float(r[4]) - 1) for r in rows if int(r[2]) <= cores]
over = [(r, float(r[3]) / float(r[4]) - 1) for r in rows if int(r[2]) > cores]
if inside:
    worst = max(inside, key=lambda x: abs(x[1]))
    ok = sum(1 for _, e in inside if abs(e) <= 0.15)
    print("ranks <= cores: %d of %d layouts within 15%%; worst %+.1f%% (%s, %s)" %
          (ok, len(inside), 100 * worst[1], worst[0][0], worst[0][1]))
if over:
    print("oversubscribed (model: compute x ranks/cores, collectives as calibrated): errors %s" %
          ", ".join("%+.1f%%" % (100 * e) for _, e in over))
PY
echo "load at end:$(cut -d' ' -f1-3 /proc/loadavg | sed 's/^/ /'); $(( $(date +%s) - start )) s in all"
exit $bad
