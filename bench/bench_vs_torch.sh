#!/usr/bin/env bash
# tycho against PyTorch eager on the same model, on this machine's CPU, in one run.
#
# usage: bash bench/bench_vs_torch.sh [--steps N] [--threads "1 2"]      (from the repository root)
#   --steps N      timed steps per run (default 40), after 5 warm-up steps that are dropped
#   --threads L    the thread counts tried on each side (default "1 2"); the best is reported
#   TYCHO=PATH     the tycho binary (default build/tycho, built with cmake when missing)
#
# The model (bench/plans/vs_torch.lua; bench/torch_bench.py builds the same one from
# tests/reference/llama_ref.py): Llama, 4 layers, dim 256, 8 heads (8 kv heads), ffn 688,
# vocab 512, untied head, no dropout; 8 sequences x 128 tokens a step; fp32; AdamW lr 3e-4,
# betas 0.9/0.95, eps 1e-8, weight decay 0.1 (2-D tensors), grad clip 1.0. Both read the same
# random token file (raw uint16, written into a temp folder) through tycho's unshuffled windows.
#
# tycho runs `tycho run` and reads the per-step tokens_per_sec of its metrics file; PyTorch
# (Debian's /usr/bin/python3 with python3-torch 1.13, installed with apt-get when missing) times
# each step (batch, forward, backward, clip, AdamW) with perf_counter, in fp32 and under
# torch.autocast("cpu", dtype=torch.bfloat16). tycho bf16 (precision.compute = "bf16": the
# linears' products in bf16 through oneDNN) is run too, and reported n/a with tycho's message
# where the build or CPU refuses it (the float64 build, no oneDNN, no AVX-512 BF16 or AMX).
# Thread settings, n from --threads: tycho gets OMP_NUM_THREADS=n (its count fixed: it does not
# fall while other programs use the CPUs) and OPENBLAS_NUM_THREADS=1 (what `tycho run` sets for
# itself: its products run in row tiles shared by the OpenMP threads; host/runtime/README.md
# "Threads"); PyTorch gets torch.set_num_threads(n), OMP_NUM_THREADS=n and
# OPENBLAS_NUM_THREADS=n (Debian's torch calls OpenBLAS for fp32 matrix products, oneDNN for bf16).
# With n > 1 each side runs with OMP_WAIT_POLICY=passive and =active (threads spin between
# parallel regions) and keeps its faster; the table says which. (Where neither variable is set,
# tycho sets GOMP_SPINCOUNT=30000, a spin of under a millisecond then sleep, and libgomp's own
# default is a spin of 300,000 rounds; the explicit settings here measure each side at its faster
# policy.) OPENBLAS_CORETYPE is left as the environment has it, for both sides.
# Statistics (torch_bench.py): median = tokens per step / median step time; slow tail = tokens
# per step / 90th-percentile step time (the 10th percentile of per-step tokens/s); spread =
# slow tail / median. A benchmark, not a test: nothing here is run by ctest.
set -euo pipefail
cd "$(dirname "$0")/.."

steps=40
warmup=5
threads_list="1 2"
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    --steps=*) steps=${1#--steps=}; shift ;;
    --threads) threads_list=${2:?--threads needs a list such as \"1 2\"}; shift 2 ;;
    --threads=*) threads_list=${1#--threads=}; shift ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "bench_vs_torch.sh: unknown argument '$1' (usage: bash bench/bench_vs_torch.sh [--steps N] [--threads \"1 2\"])" >&2; exit 2 ;;
  esac
done
case "$steps" in ''|*[!0-9]*|0) echo "bench_vs_torch.sh: --steps must be a positive integer, not '$steps'" >&2; exit 2 ;; esac

py=/usr/bin/python3   # Debian's python and python3-torch, not a pyenv or venv python on PATH
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "bench_vs_torch.sh: installing python3-torch for $py (apt-get)"
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3-torch
fi

if [ -n "${TYCHO:-}" ]; then
  tycho=$TYCHO
  [ -x "$tycho" ] || { echo "bench_vs_torch.sh: TYCHO=$tycho is not an executable" >&2; exit 2; }
else
  tycho=build/tycho
  if [ ! -x "$tycho" ]; then
    echo "bench_vs_torch.sh: building $tycho"
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j"$(nproc)"
  fi
fi

tmp=$(mktemp -d /tmp/bench_vs_torch.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
tokens=$tmp/tokens.bin
"$py" - "$tokens" <<'EOF'
import array, random, sys
r = random.Random(20240520)
a = array.array("H", (r.getrandbits(9) for _ in range(1 << 20)))  # ids < 512 (the vocab)
open(sys.argv[1], "wb").write(a.tobytes())
EOF

plan=bench/plans/vs_torch.lua
total=$((steps + warmup))
stat_busy() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat; }
busy0=$(stat_busy); t_start=$(date +%s.%N)

echo "bench_vs_torch: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "  $("$tycho" --version 2>&1 | head -1) ($tycho), torch $("$py" -c 'import torch; print(torch.__version__)'), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}"
echo "  $steps timed steps after $warmup warm-up steps per run, threads tried: $threads_list"

results=()
bf16_note=""
bf16_refused=0
# one tycho run: precision (fp32, bf16), threads, OpenMP wait policy; 0 when it ran, else tycho's exit code
run_tycho() {
  local prec=$1 th=$2 wait=$3 id=tycho_$1_$2_$3 rc=0
  local extra=(); [ "$prec" = bf16 ] && extra=(--set precision.compute=bf16 --set precision.grads=fp32)
  env OMP_NUM_THREADS="$th" OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY="$wait" \
    "$tycho" run "$plan" --set "data.train=$tokens" --set "log.metrics=$tmp/$id.jsonl" \
    --set "train.steps=$total" "${extra[@]}" > "$tmp/$id.log" 2>&1 || rc=$?
  [ "$rc" = 0 ] || return "$rc"
  "$py" bench/torch_bench.py tycho --metrics "$tmp/$id.jsonl" --threads "$th" --setting "$(setting "$th" "$wait")" \
    --label "tycho $prec" --skip "$warmup" --out "$tmp/r_$id.json"
  results+=("$tmp/r_$id.json")
}
setting() { if [ "$1" = 1 ]; then echo "1 thread"; else echo "$1 threads, $2 wait"; fi; }

for th in $threads_list; do
  # With one thread the wait policy does not matter; with more, libgomp's threads either sleep
  # between parallel regions (passive, what tycho sets for itself) or spin (active, libgomp's
  # default): each side gets both and keeps its faster.
  waits="passive"; [ "$th" -gt 1 ] && waits="passive active"
  for wait in $waits; do
    if ! run_tycho fp32 "$th" "$wait"; then
      echo "bench_vs_torch.sh: tycho fp32 failed ($(setting "$th" "$wait")):" >&2
      tail -20 "$tmp/tycho_fp32_${th}_$wait.log" >&2
      exit 1
    fi
    # tycho bf16: n/a where this build or CPU refuses it
    if [ "$bf16_refused" = 0 ]; then
      rc=0; run_tycho bf16 "$th" "$wait" || rc=$?
      if [ "$rc" != 0 ]; then
        log=$tmp/tycho_bf16_${th}_$wait.log
        msg=$(grep -m1 'tycho:' "$log" || head -1 "$log")
        if [ "$rc" = 2 ]; then
          bf16_note="tycho bf16 is not available on this build: $msg"
        else
          bf16_note="tycho bf16 failed (exit $rc): $msg"
        fi
        echo "  tycho bf16, $(setting "$th" "$wait"): not run (exit $rc; see the note below)"
        bf16_refused=1
      fi
    fi
    # PyTorch eager, fp32 and bf16 autocast
    for mode in fp32 bf16; do
      flag=(); [ "$mode" = bf16 ] && flag=(--bf16)
      id=torch_${mode}_${th}_$wait
      env OMP_NUM_THREADS="$th" OPENBLAS_NUM_THREADS="$th" OMP_WAIT_POLICY="$wait" \
        "$py" bench/torch_bench.py torch --tokens "$tokens" --threads "$th" --setting "$(setting "$th" "$wait")" \
        "${flag[@]}" --steps "$steps" --warmup "$warmup" --out "$tmp/r_$id.json"
      results+=("$tmp/r_$id.json")
    done
  done
done

# the best thread setting of each side and mode, by median tokens/s
best=()
for label in "tycho fp32" "tycho bf16" "PyTorch fp32" "PyTorch bf16 autocast"; do
  b=$("$py" - "$label" "${results[@]}" <<'EOF'
import json, sys
rows = [(json.load(open(p)), p) for p in sys.argv[2:]]
rows = [(r["median_tps"], p) for r, p in rows if r["label"] == sys.argv[1]]
print(max(rows)[1] if rows else "")
EOF
)
  [ -n "$b" ] && best+=("$b")
done

busy1=$(stat_busy); t_end=$(date +%s.%N)
# CPU time of everything on the machine during the run against this script's own: what other work
# there was (a shared machine makes both sides slower and their spreads wider)
times > "$tmp/times"   # in this shell: its own and its children's user and system time
ours=$(tr '\n' ' ' < "$tmp/times" | sed 's/[ms]/ /g' | awk '{print $1*60 + $2 + $3*60 + $4 + $5*60 + $6 + $7*60 + $8}')
other=$(awk -v b0="$busy0" -v b1="$busy1" -v t0="$t_start" -v t1="$t_end" -v hz="$(getconf CLK_TCK)" -v ours="$ours" \
  'BEGIN { o = ((b1 - b0) / hz - ours) / (t1 - t0); printf "%.2f", (o < 0 ? 0 : o) }')
"$py" bench/torch_bench.py report --seconds "$(awk -v a="$t_start" -v b="$t_end" 'BEGIN { printf "%.0f", b - a }')" \
  --other-cores "$other" "${best[@]}"
[ -z "$bf16_note" ] || echo "note: $bf16_note"
