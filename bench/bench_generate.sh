#!/usr/bin/env bash
# `tycho generate` against transformers' generate: greedy, with the key/value cache, on the same
# random Llama folder (made by transformers' save_pretrained) on the same CPU with the same thread
# count; the ids checked equal (the script stops, exit 1, where they differ) and a table of the
# decode rate of each.
#
# usage: bash bench/bench_generate.sh [--threads T] [--tokens N] [--rounds R] [--dim D] [--layers L] [--vocab V]
#   --threads T  tycho's OMP_NUM_THREADS and torch.set_num_threads (default 1)
#   --tokens N   tokens generated after a 16-token prompt (default 128)
#   --rounds R   runs of each (default 3); a cell is the median of its rounds
#   --dim D, --layers L, --vocab V   the model (default 512, 8, 32000: 8 heads of 64, 4 key/value
#                heads, ffn 1376, untied head; about 56M parameters)
#   TYCHO=PATH   the tycho binary (default build/tycho)
#
# The decode rate is (N - 1) / (time for N tokens - time for 1 token), wall clock, so that what
# both spend once (loading the weights, tycho's process start, the prompt's forward) cancels:
# tycho's times are its whole process's, transformers' those of generate() on the loaded model.
# The model's lm_head is scaled by 30 (logits far apart), so that rounding differences between
# the two cannot turn an argmax; bos, eos and pad are null, so both run the N tokens. transformers
# 4.40.2 over Debian's torch, in the venv e2e.generate makes (${XDG_CACHE_HOME:-~/.cache}/
# tycho-test-venv-transformers, made here when missing). A benchmark, run by hand, not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=1 tokens=128 rounds=3 dim=512 layers=8 vocab=32000
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --tokens) tokens=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --dim) dim=$2; shift 2 ;;
    --layers) layers=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    *) echo "usage: bench/bench_generate.sh [--threads T] [--tokens N] [--rounds R] [--dim D] [--layers L] [--vocab V]" >&2
       exit 2 ;;
  esac
done
tycho=${TYCHO:-build/tycho}
[ -x "$tycho" ] || { echo "bench_generate: no tycho at $tycho (build it, or set TYCHO)" >&2; exit 2; }
venv=${XDG_CACHE_HOME:-$HOME/.cache}/tycho-test-venv-transformers
if ! "$venv/bin/python" -c 'import torch, transformers, safetensors' 2>/dev/null; then
  { /usr/bin/python3 -m venv --system-site-packages "$venv" &&
    "$venv/bin/pip" install -q transformers==4.40.2 safetensors; } ||
    { echo "bench_generate: cannot make a venv with torch and transformers at $venv" >&2; exit 1; }
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=1
prompt=$(seq 5 7 110 | head -n 16 | paste -sd,)

# the model and transformers' side: ids of N tokens, then the times of N and of 1, R rounds
"$venv/bin/python" - "$tmp/M" "$prompt" "$tokens" "$rounds" "$threads" "$dim" "$layers" "$vocab" <<'EOF' >"$tmp/hf.txt"
import json, statistics, sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM
folder, prompt, n, rounds, threads, dim, layers, vocab = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
torch.set_num_threads(threads)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=dim * 43 // 16, num_hidden_layers=layers,
                  num_attention_heads=dim // 64, num_key_value_heads=dim // 128, max_position_embeddings=1024,
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                  bos_token_id=None, eos_token_id=None, pad_token_id=None)
model = LlamaForCausalLM(cfg).float().eval()
with torch.no_grad():
    model.lm_head.weight.mul_(30.0)
model.save_pretrained(folder, safe_serialization=True)
x = torch.tensor([[int(i) for i in prompt.split(",")]])
def gen(k):
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(x, do_sample=False, max_new_tokens=k, min_new_tokens=k, attention_mask=torch.ones_like(x))
    return time.perf_counter() - t0, out[0, x.shape[1]:].tolist()
gen(2)  # warm-up
rates = []
for _ in range(rounds):
    tn, ids = gen(n)
    t1, _ = gen(1)
    rates.append((n - 1) / (tn - t1))
print(json.dumps({"ids": ids, "rate": statistics.median(rates), "params": sum(p.numel() for p in model.parameters())}))
EOF

now() { date +%s.%N; }
rates=()
for r in $(seq 1 "$rounds"); do
  t0=$(now)
  "$tycho" generate "$tmp/M" --prompt-ids "$prompt" --max-tokens "$tokens" --json >"$tmp/tycho.json" 2>"$tmp/err" ||
    { cat "$tmp/err" >&2; exit 1; }
  t1=$(now)
  "$tycho" generate "$tmp/M" --prompt-ids "$prompt" --max-tokens 1 --json >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
  t2=$(now)
  rates+=("$(awk -v n="$tokens" -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN { print (n - 1) / ((b - a) - (c - b)) }')")
done
"$venv/bin/python" - "$tmp/hf.txt" "$tmp/tycho.json" "$tokens" "$threads" "${rates[@]}" <<'EOF'
import json, statistics, sys
hf, tycho = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
n, threads, rates = int(sys.argv[3]), int(sys.argv[4]), [float(r) for r in sys.argv[5:]]
if tycho["ids"] != hf["ids"]:
    first = next((k for k in range(min(len(tycho["ids"]), len(hf["ids"]))) if tycho["ids"][k] != hf["ids"][k]), None)
    sys.exit(f"bench_generate: tycho's ids differ from transformers' ({len(tycho['ids'])} and {len(hf['ids'])} ids, first at {first})")
rate = statistics.median(rates)
print(f"\nmodel: random Llama, {hf['params'] / 1e6:.1f}M parameters; 16-token prompt, {n} tokens greedy, {threads} thread(s)")
print(f"{'':14} {'tokens/s':>10}")
print(f"{'tycho':14} {rate:10.1f}")
print(f"{'transformers':14} {hf['rate']:10.1f}")
print(f"ratio: {rate / hf['rate']:.2f}x; ids: equal ({len(hf['ids'])} tokens)")
EOF
echo "machine: $(getconf _NPROCESSORS_ONLN) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
