#!/usr/bin/env bash
# tycho and PyTorch training beside busy processes, in one run: tokens/s alone, beside one and
# beside two busy processes (`yes > /dev/null`, pinned nowhere), and each one's ratio to alone.
#
# usage: bash bench/bench_load.sh [--rounds R] [--limit S] [--waits "default ..."] [--models "tiny vs_torch"] [--no-torch]
#   --rounds R     rounds (default 2); each round runs every row at every load, the rows alternating;
#                  a cell is the median of its rounds' figures
#   --limit S      seconds a tycho run may take (default 40): one that takes longer is stopped and
#                  its steps so far counted (a wait that starves under load would take minutes);
#                  PyTorch's run may take 4 S, else it is shown as at most 45 steps in that time
#   --waits L      tycho's OpenMP wait settings, one row each (default "default"):
#                    default   the environment untouched: what `tycho run` chooses for itself
#                    active    OMP_WAIT_POLICY=active (threads spin between parallel regions)
#                    passive   OMP_WAIT_POLICY=passive (threads sleep at once)
#                    spin:N    GOMP_SPINCOUNT=N with OMP_WAIT_POLICY=active (spin N rounds, then sleep)
#                    fixed:W   W with OMP_NUM_THREADS=nproc: the thread count set by hand, so it does
#                              not fall while other work uses the CPUs (as before that existed)
#   --models L     tycho's plans (default "tiny vs_torch"): plans/tiny.lua (150 steps) and
#                  bench/plans/vs_torch.lua (45 steps), the model PyTorch trains (bench_vs_torch.sh)
#   --no-torch     leave PyTorch out
#   TYCHO=PATH     the tycho binary (default build/tycho, built with cmake when missing)
#
# Threads: tycho sizes itself (OMP_NUM_THREADS unset, OPENBLAS_NUM_THREADS=1 as it sets for
# itself); PyTorch gets torch.set_num_threads(nproc) and libgomp's defaults. A run's tokens/s is
# its timed steps' tokens over their summed time (the steps after the warm-up: 15 of tiny's, 5 of
# the others'; per-step times from tycho's metrics and from bench/torch_bench.py), so stalls count
# as a user sees them, where a median step would hide them. The ratios are each row's loaded /
# alone. The run ends
# with how busy the machine was besides this script and its busy processes. A benchmark, not a test.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=2
limit=40
waits="default"
models="tiny vs_torch"
torch=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
    --limit) limit=${2:?--limit needs a number of seconds}; shift 2 ;;
    --waits) waits=${2:?--waits needs a list}; shift 2 ;;
    --models) models=${2:?--models needs a list}; shift 2 ;;
    --no-torch) torch=0; shift ;;
    -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
    *) echo "bench_load.sh: unknown argument '$1' (bash bench/bench_load.sh --help)" >&2; exit 2 ;;
  esac
done
case "$rounds" in ''|*[!0-9]*|0) echo "bench_load.sh: --rounds must be a positive integer, not '$rounds'" >&2; exit 2 ;; esac
for w in $waits; do
  case "${w#fixed:}" in default|active|passive) ;; spin:*[0-9]) ;;
    *) echo "bench_load.sh: --waits: '$w' is none of default, active, passive, spin:N, each perhaps after fixed:" >&2; exit 2 ;; esac
done
for m in $models; do
  case "$m" in tiny|vs_torch) ;; *) echo "bench_load.sh: --models: '$m' is neither tiny nor vs_torch" >&2; exit 2 ;; esac
done

py=/usr/bin/python3   # Debian's python and python3-torch, as bench_vs_torch.sh
if [ "$torch" = 1 ] && ! "$py" -c 'import torch' 2>/dev/null; then
  echo "bench_load.sh: installing python3-torch for $py (apt-get)"
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch
fi
if [ -n "${TYCHO:-}" ]; then
  tycho=$TYCHO
  [ -x "$tycho" ] || { echo "bench_load.sh: TYCHO=$tycho is not an executable" >&2; exit 2; }
else
  tycho=build/tycho
  if [ ! -x "$tycho" ]; then
    echo "bench_load.sh: building $tycho"
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j"$(nproc)"
  fi
fi

tmp=$(mktemp -d /tmp/bench_load.XXXXXX)
busy_pids=()
stop_busy() {
  local p
  for p in "${busy_pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  busy_pids=()
}
trap 'stop_busy; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
start_busy() {
  local i
  for ((i = 0; i < $1; i++)); do yes > /dev/null & busy_pids+=($!); done
}

tokens=$tmp/tokens.bin
"$py" - "$tokens" <<'EOF'
import array, random, sys
r = random.Random(20240520)
a = array.array("H", (r.getrandbits(9) for _ in range(1 << 20)))  # ids < 512 (vs_torch's vocab)
open(sys.argv[1], "wb").write(a.tobytes())
EOF

stat_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
busy0=$(stat_busy); t_start=$(date +%s.%N)
echo "bench_load: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  $("$tycho" --version 2>&1 | head -1) ($tycho)$([ "$torch" = 1 ] && echo ", torch $("$py" -c 'import torch; print(torch.__version__)')"), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
echo "  $rounds round(s); tycho waits: $waits; models: $models"

wait_env() {
  case "$1" in
    fixed:*) echo "OMP_NUM_THREADS=$(nproc) $(wait_env "${1#fixed:}")" ;;
    default) ;;
    active|passive) echo "OMP_WAIT_POLICY=$1" ;;
    spin:*) echo "OMP_WAIT_POLICY=active GOMP_SPINCOUNT=${1#spin:}" ;;
  esac
}
# one row at one load in one round: its tokens/s into $tmp/cells
run_row() {
  local row=$1 load=$2 round=$3 id model wait rc=0
  id=$(echo "$row" | tr ' :/' '___')_${load}_$round
  case "$row" in
    "PyTorch vs_torch")
      env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT OMP_NUM_THREADS="$(nproc)" OPENBLAS_NUM_THREADS="$(nproc)" \
        timeout $((4 * limit)) "$py" bench/torch_bench.py torch --tokens "$tokens" --threads "$(nproc)" --steps 40 \
        --warmup 5 --out "$tmp/$id.json" > "$tmp/$id.log" 2>&1 || rc=$?
      if [ "$rc" = 124 ]; then # its 45 steps did not fit: fewer tokens/s than 45 steps in that time
        local tps=$((45 * 1024 / (4 * limit)))
        echo "  (stopped after $((4 * limit)) s)"
        printf '%s\t%s\t%s\t%s\n' "$row" "$load" "$round" "$tps" >> "$tmp/cells"
        printf '  round %d, beside %d busy: %-28s %8.0f tokens/s (at most)\n' "$round" "$load" "$row" "$tps"
        return 0
      fi ;;
    *)
      model=${row#tycho }; model=${model% *}; wait=${row##* }
      local plan=plans/tiny.lua steps=150 skip=15 data=()
      [ "$model" = vs_torch ] && { plan=bench/plans/vs_torch.lua; steps=45; skip=5; data=(--set "data.train=$tokens"); }
      # shellcheck disable=SC2046
      env -u OMP_NUM_THREADS -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u TYCHO_THREAD_SETTINGS OPENBLAS_NUM_THREADS=1 \
        $(wait_env "$wait") timeout "$limit" "$tycho" run "$plan" "${data[@]}" --set "log.metrics=$tmp/$id.jsonl" \
        --set "train.steps=$steps" --set train.eval_every=0 > "$tmp/$id.log" 2>&1 || rc=$?
      if [ "$rc" = 124 ]; then
        # stopped: its steps so far, the warm-up shortened to half of them where it took more
        local done_steps; done_steps=$(grep -c tokens_per_sec "$tmp/$id.jsonl" || true)
        echo "  (stopped after $limit s, at step $done_steps)"
        if [ "$done_steps" -lt 2 ]; then # too few to time: the tokens over the limit
          local tps=$((done_steps * 1024 / limit))
          printf '%s\t%s\t%s\t%s\n' "$row" "$load" "$round" "$tps" >> "$tmp/cells"
          printf '  round %d, beside %d busy: %-28s %8.0f tokens/s (at most)\n' "$round" "$load" "$row" "$tps"
          return 0
        fi
        rc=0
        [ "$skip" -lt "$done_steps" ] || skip=$((done_steps / 2))
      fi
      [ "$rc" = 0 ] && { "$py" bench/torch_bench.py tycho --metrics "$tmp/$id.jsonl" --threads 0 --label "$row" \
        --skip "$skip" --out "$tmp/$id.json" > /dev/null || rc=$?; } ;;
  esac
  if [ "$rc" != 0 ]; then
    echo "bench_load.sh: $row beside $load busy failed (exit $rc):" >&2
    tail -20 "$tmp/$id.log" >&2
    exit 1
  fi
  local tps
  tps=$("$py" -c 'import json, sys; s = json.load(open(sys.argv[1]))["step_seconds"]; print(1024 * len(s) / sum(s))' "$tmp/$id.json")
  printf '%s\t%s\t%s\t%s\n' "$row" "$load" "$round" "$tps" >> "$tmp/cells"
  printf '  round %d, beside %d busy: %-28s %8.0f tokens/s\n' "$round" "$load" "$row" "$tps"
}

rows=()
for m in $models; do
  [ "$m" = tiny ] && m=tiny.lua
  for w in $waits; do rows+=("tycho $m $w"); done
done
[ "$torch" = 1 ] && rows+=("PyTorch vs_torch")
for ((round = 1; round <= rounds; round++)); do
  for load in 0 1 2; do
    start_busy "$load"
    sleep 0.5
    # the rows alternate their order from round to round, so no row always runs first
    if (( round % 2 )); then order=("${rows[@]}"); else order=(); for ((i = ${#rows[@]} - 1; i >= 0; i--)); do order+=("${rows[$i]}"); done; fi
    for row in "${order[@]}"; do run_row "$row" "$load" "$round"; done
    stop_busy
  done
done

busy1=$(stat_busy); t_end=$(date +%s.%N)
times > "$tmp/times"
ours=$(tr '\n' ' ' < "$tmp/times" | sed 's/[ms]/ /g' | awk '{print $1*60 + $2 + $3*60 + $4 + $5*60 + $6 + $7*60 + $8}')
"$py" - "$tmp/cells" "$busy0" "$busy1" "$t_start" "$t_end" "$(getconf CLK_TCK)" "$ours" <<'EOF'
import statistics, sys
cells, rows = {}, []
for line in open(sys.argv[1]):
    row, load, _, tps = line.rstrip("\n").split("\t")
    if row not in rows:
        rows.append(row)
    cells.setdefault((row, int(load)), []).append(float(tps))
print()
print(f"{'tokens/s (ratio to alone)':32} {'alone':>9} {'beside 1 busy':>22} {'beside 2 busy':>22}")
for row in rows:
    med = [statistics.median(cells[(row, l)]) for l in range(3)]
    spread = lambda l: f"{min(cells[(row, l)]):,.0f}-{max(cells[(row, l)]):,.0f}"
    print(f"{row:32} {med[0]:>9,.0f} {med[1]:>9,.0f} ({med[1] / med[0]:4.0%}) {'':6} {med[2]:>9,.0f} ({med[2] / med[0]:4.0%})")
    label = "  range over the rounds"
    print(f"{label:32} {spread(0):>9} {spread(1):>22} {spread(2):>22}")
print("goals on 2 cores: beside one busy process >= 45% of alone, beside two >= 30%")
b0, b1, t0, t1, hz, ours = map(float, sys.argv[2:])
# the busy processes are the script's children too, so what is left is other work
other = max(0.0, ((b1 - b0) / hz - ours) / (t1 - t0))
print(f"run took {t1 - t0:.0f} s; other work on the machine meanwhile: {other:.2f} cores busy on average")
EOF
