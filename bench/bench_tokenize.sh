#!/usr/bin/env bash
# `tycho tokenize` against the `tokenizers` library on one core each: the same corpus through the
# same tokenizer.json (tests/golden/tokenizer's byte-level BPE and Metaspace BPE), the ids checked
# equal (the script stops, exit 1, naming the tokenizer, where they differ), and a table of CPU
# seconds and tokens per second per CPU second for each.
#
# usage: bash bench/bench_tokenize.sh [--mb M] [--rounds R] [--tokenizer FILE]...
#   --mb M       corpus size in MB (default 8): paragraphs of the Python standard library's sources
#                and of /usr/share/common-licenses (English prose and code), one document a
#                paragraph, as .jsonl {"text": ...}; the golden text's lines mixed in
#   --rounds R   runs of each (default 3); a cell is the median of its rounds
#   --tokenizer FILE  a tokenizer.json to measure instead of the two golden ones (repeatable; the
#                real vocabularies tests/golden/tokenizer/real.py writes, for example)
#   TYCHO=PATH   the tycho binary (default build/tycho)
#
# One thread each: tycho --threads 1; tokenizers with RAYON_NUM_THREADS=1 and
# TOKENIZERS_PARALLELISM=false (encode_batch then runs serially). tycho's CPU seconds are its whole
# process's (user + system: reading the tokenizer and the .jsonl, writing the token file);
# tokenizers' are the process's CPU time around Tokenizer.from_file and encode_batch (the .jsonl
# read and parsed before, not counted), so the comparison leans against tycho. The Python side
# runs in the venv the tests use (${XDG_CACHE_HOME:-~/.cache}/tycho-test-venv, made with
# `pip install tokenizers` when missing). A benchmark, run by hand, not a test.
set -euo pipefail
cd "$(dirname "$0")/.."
mb=8 rounds=3
toks=()
while [ $# -gt 0 ]; do
  case "$1" in
    --mb) mb=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --tokenizer) toks+=("$2"); shift 2 ;;
    *) echo "usage: bench/bench_tokenize.sh [--mb M] [--rounds R] [--tokenizer FILE]..." >&2; exit 2 ;;
  esac
done
tycho=${TYCHO:-build/tycho}
[ -x "$tycho" ] || { echo "bench_tokenize: no tycho at $tycho (build it, or set TYCHO)" >&2; exit 2; }
venv=${XDG_CACHE_HOME:-$HOME/.cache}/tycho-test-venv
if ! "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
  /usr/bin/python3 -m venv --system-site-packages "$venv" && "$venv/bin/pip" install -q tokenizers ||
    { echo "bench_tokenize: cannot make a venv with tokenizers at $venv" >&2; exit 1; }
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# the corpus: deterministic (sorted files), valid UTF-8 (the golden text's bad bytes replaced)
"$venv/bin/python" - "$tmp/corpus.jsonl" "$mb" <<'EOF'
import glob, json, os, sys, sysconfig
out, limit = sys.argv[1], float(sys.argv[2]) * 1e6
golden = open("tests/golden/tokenizer/text.txt", encoding="utf-8", errors="replace").read().splitlines()
files = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob(sysconfig.get_paths()["stdlib"] + "/**/*.py", recursive=True))
n = docs = 0
with open(out, "w", encoding="utf-8") as f:
    for path in files:
        if n >= limit or not os.path.isfile(path):
            continue
        text = open(path, encoding="utf-8", errors="replace").read()
        for para in text.split("\n\n"):
            if not para.strip() or n >= limit:
                continue
            if docs % 50 == 0:
                para += "\n" + golden[(docs // 50) % len(golden)]
            line = json.dumps({"text": para}, ensure_ascii=False) + "\n"
            f.write(line)
            n += len(line.encode())
            docs += 1
print(f"corpus: {docs} documents, {n / 1e6:.1f} MB of .jsonl", file=sys.stderr)
EOF

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
printf '\n%-14s %10s %12s %16s %12s %16s %8s\n' tokenizer tokens "tycho CPU s" "tycho tok/s/core" "tokenizers s" "tokenizers tok/s" "ratio"
[ ${#toks[@]} -gt 0 ] || toks=(tests/golden/tokenizer/bytelevel.json tests/golden/tokenizer/sp.json)
for json in "${toks[@]}"; do
  tok=$(basename "$json" .json)
  : >"$tmp/tycho.s"
  : >"$tmp/lib.s"
  for r in $(seq 1 "$rounds"); do
    /usr/bin/time -f '%U %S' -o "$tmp/time" "$tycho" tokenize "$json" "$tmp/corpus.jsonl" --out "$tmp/$tok.bin" \
      --threads 1 --no-eos >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
    awk '{ print $1 + $2 }' "$tmp/time" >>"$tmp/tycho.s"
    "$venv/bin/python" - "$json" "$tmp/corpus.jsonl" "$tmp/$tok.bin" "$tok" <<'EOF' >>"$tmp/lib.s"
import json, struct, sys, time
from tokenizers import Tokenizer
path, corpus, tycho_file, name = sys.argv[1:5]
docs = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
t0 = time.process_time()
tok = Tokenizer.from_file(path)
ids = [i for e in tok.encode_batch(docs, add_special_tokens=False) for i in e.ids]
cpu = time.process_time() - t0
raw = open(tycho_file, "rb").read()
version, n = struct.unpack("<3i", raw[:12])[1:]
got = struct.unpack(f"<{n}{'H' if version == 1 else 'I'}", raw[1024:1024 + n * (2 if version == 1 else 4)])
if list(got) != ids:
    first = next((k for k in range(min(len(got), len(ids))) if got[k] != ids[k]), min(len(got), len(ids)))
    sys.exit(f"bench_tokenize: {name}: tycho's ids differ from tokenizers' ({len(got)} and {len(ids)} ids, first at {first})")
print(cpu, len(ids))
EOF
  done
  n=$(awk 'NR == 1 { print $2 }' "$tmp/lib.s")
  ts=$(median <"$tmp/tycho.s")
  ls=$(awk '{ print $1 }' "$tmp/lib.s" | median)
  awk -v t="$tok" -v n="$n" -v a="$ts" -v b="$ls" 'BEGIN {
    printf "%-14s %10d %12.2f %16.0f %12.2f %16.0f %7.2fx\n", t, n, a, n / a, b, n / b, (n / a) / (n / b) }'
done
echo "ids: equal for every tokenizer in every round; ratio: tycho's tokens/s per core over tokenizers'"
echo "machine: $(getconf _NPROCESSORS_ONLN) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
