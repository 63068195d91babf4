#!/usr/bin/env bash
# Hugging Face model folders through `tycho run`: export.format = "hf" with a small shard_mb writes
# several shards, their index and config.json; a run from that folder (init.from) gives the same
# losses and gradient norms, to the bit, as a run from the same weights exported as one file; a
# plan whose model differs from config.json is refused (2) naming the field and both values;
# tycho.models.from_hf of the written config.json compiles to the plan's own model; a config
# with a field tycho lacks is refused by from_hf (2), naming it; an export path that is a link
# is refused (2). A run from an init.from folder holding tokenizer.json exports its tokenizer files
# byte for byte and a generation_config.json with its bos and eos ids, a data.text run its
# data.tokenizer; a run without a tokenizer, neither.
# Where python3 can import torch and transformers, transformers' from_pretrained loads the folder
# and its loss on the reference batch equals tycho's; where the transformers venv can be had,
# AutoTokenizer, AutoModelForCausalLM and GenerationConfig load the export with its tokenizer and
# the tokenizer's ids are tycho tokenize's (else: skipped, saying why).
# usage: run_hf_folder.sh TYCHO   (run from the source folder)
set -u
tycho=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/err" ] && cat "$tmp/err"; exit 1; }
plan=tests/plans/good/train_small.lua
run() { "$tycho" run "$plan" --set train.eval_every=0 "$@" >"$tmp/out" 2>"$tmp/err"; }
expect() { # expect CODE TEXT COMMAND...: exit code CODE and TEXT as the first stderr line
  local code=$1 text=$2
  shift 2
  "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  [ "$rc" -eq "$code" ] || fail "$* exited $rc, expected $code"
  [ "$(head -n 1 "$tmp/err")" = "$text" ] || fail "$*: '$(head -n 1 "$tmp/err")', expected '$text'"
}

# the same weights (the same run, twice) as a folder of 0.05 MB shards and as one file
run --set train.steps=3 --set export.path="$tmp/F" --set export.format=hf --set export.shard_mb=0.05 || fail "hf export"
grep -q "^exported $tmp/F after step 3\$" "$tmp/out" || fail "no export line"
run --set train.steps=3 --set export.path="$tmp/s.safetensors" || fail "file export"
shards=$(ls "$tmp/F" | grep -c '^model-000[0-9][0-9]-of-000[0-9][0-9]\.safetensors$')
[ "$shards" -gt 2 ] || fail "$shards shards"
[ -f "$tmp/F/model.safetensors.index.json" ] && [ -f "$tmp/F/config.json" ] || fail "no index or config"
for f in "$tmp"/F/model-*.safetensors; do
  [ "$(stat -c %s "$f")" -le 50000 ] || fail "$f is larger than 0.05 MB"
done
grep -q '"architectures":\["LlamaForCausalLM"\]' "$tmp/F/config.json" || fail "config: $(cat "$tmp/F/config.json")"
echo "ok: $shards shards of at most 50000 bytes, the index and config.json"

field() { grep -o "\"$2\": [-0-9.eE+]*" "$1" | awk '{ print $2 }'; }
run --set train.steps=4 --set init.from="$tmp/F" --set log.metrics="$tmp/f.jsonl" || fail "run from the folder"
run --set train.steps=4 --set init.from="$tmp/s.safetensors" --set log.metrics="$tmp/s.jsonl" || fail "run from the file"
for k in loss grad_norm; do
  [ "$(field "$tmp/f.jsonl" $k | wc -l)" -eq 4 ] && [ "$(field "$tmp/f.jsonl" $k)" = "$(field "$tmp/s.jsonl" $k)" ] ||
    fail "$k from the folder and from the file differ"
done
echo "ok: init.from the folder and from the file: the same losses and gradient norms"

expect 2 "tycho: plan error: init.from $tmp/F: model.n_layers = 3 in the plan, but $tmp/F/config.json has num_hidden_layers = 2" \
  "$tycho" run "$plan" --set init.from="$tmp/F" --set model.n_layers=3
expect 2 "tycho: plan error: init.from $tmp/F: model.n_kv_heads = 4 in the plan, but $tmp/F/config.json has num_key_value_heads = 2" \
  "$tycho" run "$plan" --set init.from="$tmp/F" --set model.n_kv_heads=4
expect 2 "tycho: plan error: init.from $tmp/F: model.tie_embeddings = true in the plan, but $tmp/F/config.json has tie_word_embeddings = false" \
  "$tycho" run "$plan" --set init.from="$tmp/F" --set model.tie_embeddings=true
ln -s "$tmp/F" "$tmp/L"
expect 2 "tycho: plan error: export.path $tmp/L: is a symbolic link; give the folder itself" \
  "$tycho" run "$plan" --set train.steps=1 --set export.path="$tmp/L" --set export.format=hf
echo "ok: refusals"

# from_hf: the plan with its model read from the written config.json is the plan
cat >"$tmp/from_hf.lua" <<'EOF'
local tycho = require "tycho"
return tycho.extend(require "train_small", { model = tycho.models.from_hf(os.getenv("HF_DIR")) })
EOF
TYCHO_PATH=tests/plans/good HF_DIR="$tmp/F" "$tycho" check "$tmp/from_hf.lua" >"$tmp/c1" 2>"$tmp/err" || fail "from_hf check"
"$tycho" check "$plan" >"$tmp/c2" || fail "check"
diff <(tail -n +2 "$tmp/c1") <(tail -n +2 "$tmp/c2") >/dev/null || fail "from_hf's plan differs: $(diff "$tmp/c1" "$tmp/c2")"
mkdir "$tmp/G"
printf '{"model_type":"llama","num_hidden_layers":2,"hidden_size":64,"num_attention_heads":4,"intermediate_size":192,"vocab_size":64,"rope_scaling":{"rope_type":"llama3","factor":8.0}}\n' >"$tmp/G/config.json"
TYCHO_PATH=tests/plans/good HF_DIR="$tmp/G" expect 2 \
  "tycho: plan error: $tmp/from_hf.lua:2: tycho.models.from_hf: $tmp/G/config.json: rope_scaling of type 'llama3' is not one tycho implements: tycho's RoPE is unscaled" \
  "$tycho" check "$tmp/from_hf.lua"
echo "ok: tycho.models.from_hf"

# an init.from folder with a tokenizer: the export carries its files byte for byte and a
# generation_config.json with its ids; the export of a run without one has neither
for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
  [ ! -e "$tmp/F/$f" ] || fail "the export without a tokenizer holds $f"
done
run --set model.vocab=1000 --set train.steps=1 --set export.path="$tmp/I" --set export.format=hf || fail "vocab-1000 export"
cp tests/golden/tokenizer/bytelevel.json "$tmp/I/tokenizer.json"
printf '{"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"}\n' \
  >"$tmp/I/tokenizer_config.json"
printf '{"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}\n' >"$tmp/I/special_tokens_map.json"
tokexport() { # tokexport FROM TO: two steps from the folder FROM, exported to the folder TO
  run --set model.vocab=1000 --set train.steps=2 --set init.from="$1" --set export.path="$2" --set export.format=hf
}
tokexport "$tmp/I" "$tmp/E" || fail "export from a folder with a tokenizer"
for f in tokenizer.json tokenizer_config.json special_tokens_map.json; do
  cmp -s "$tmp/I/$f" "$tmp/E/$f" || fail "$f is not init.from's, byte for byte"
done
gen='{"_from_model_config":true,"bos_token_id":0,"eos_token_id":0,"transformers_version":"4.40.2"}'
[ "$(cat "$tmp/E/generation_config.json")" = "$gen" ] || fail "generation_config.json: $(cat "$tmp/E/generation_config.json")"
tokexport "$tmp/I" "$tmp/E" || fail "a second export over the first (its tokenizer files are an export's)"
rm "$tmp/I/tokenizer_config.json" "$tmp/I/special_tokens_map.json"
tokexport "$tmp/I" "$tmp/E" || fail "export from a folder with tokenizer.json alone"
[ -f "$tmp/E/tokenizer.json" ] && [ ! -e "$tmp/E/tokenizer_config.json" ] && [ ! -e "$tmp/E/special_tokens_map.json" ] ||
  fail "the export from tokenizer.json alone: $(ls "$tmp/E")"
gen='{"_from_model_config":true,"eos_token_id":0,"transformers_version":"4.40.2"}' # no bos: none is known, none is said
[ "$(cat "$tmp/E/generation_config.json")" = "$gen" ] ||
  fail "generation_config.json (eos the tokenizer's <|endoftext|>): $(cat "$tmp/E/generation_config.json")"
echo "ok: the export carries init.from's tokenizer files and a generation_config.json"
# data.tokenizer (a tokenizer.json by another name) is the one exported, over init.from's; the run
# works in a folder of its own, where data.text's cache is made
mkdir "$tmp/T"
printf '{"bos_token": "<|endoftext|>"}\n' >"$tmp/E/tokenizer_config.json" # init.from's differs from data.tokenizer's
for i in $(seq 1 240); do echo "The quick brown fox $i jumps over the lazy dog, said the king."; done >"$tmp/T/a.txt"
sed -e 's/vocab = 64/vocab = 1000/' -e "s|synthetic = \"addition\"|text = { \"a.txt\" }, tokenizer = \"$PWD/tests/golden/tokenizer/bytelevel.json\"|" \
  "$plan" >"$tmp/T/text.lua"
(cd "$tmp/T" && "$tycho" run text.lua --set train.steps=2 --set train.eval_every=0 --set data.val_fraction=0.3 --set init.from="$tmp/E" \
  --set export.path="$tmp/D" --set export.format=hf >"$tmp/out" 2>"$tmp/err") || fail "export of a data.text run"
cmp -s tests/golden/tokenizer/bytelevel.json "$tmp/D/tokenizer.json" || fail "tokenizer.json is not data.tokenizer's"
[ ! -e "$tmp/D/tokenizer_config.json" ] && [ "$(cat "$tmp/D/generation_config.json")" = "$gen" ] ||
  fail "the data.tokenizer export: $(ls "$tmp/D"), $(cat "$tmp/D/generation_config.json")"
echo "ok: a data.text run exports data.tokenizer"

# transformers, where it is there (nothing is installed for it)
if why=$(python3 -c 'import torch, transformers' 2>&1); then
  ref=tests/golden/llama_ref_plan.lua
  "$tycho" run "$ref" --set export.path="$tmp/R" --set export.format=hf >/dev/null 2>"$tmp/err" || fail "reference export"
  "$tycho" run "$ref" --set init.from="$tmp/R" --set train.steps=1 --set log.metrics="$tmp/r.jsonl" >/dev/null 2>"$tmp/err" ||
    fail "run from the reference export"
  python3 - "$tmp/R" "$(field "$tmp/r.jsonl" loss)" <<'EOF' || fail "transformers"
import struct, sys
import torch
from transformers import AutoModelForCausalLM
folder, tycho_loss = sys.argv[1], float(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
raw = open("tests/golden/llama_ref_tokens.bin", "rb").read()
n = struct.unpack("<3i", raw[:12])[2]  # llm.c token file: 256 int32 of header, then uint16 tokens
tokens = torch.tensor(struct.unpack(f"<{n}H", raw[1024:1024 + 2 * n]), dtype=torch.long)
seq, batch = 16, 4  # step 0's windows, as tests/reference/llama_ref.py draws them
rows = [(w * seq) % (n - seq - 1) for w in range(batch)]
x = torch.stack([tokens[o:o + seq] for o in rows])
y = torch.stack([tokens[o + 1:o + seq + 1] for o in rows])
with torch.no_grad():
    logits = model(x).logits
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
print(f"transformers: loss {loss:.8f}, tycho {tycho_loss:.8f}")
assert abs(loss - tycho_loss) <= 1e-5 * abs(tycho_loss), "the losses differ"
EOF
  echo "ok: transformers loads the folder; its loss is tycho's"
else
  echo "skipped: transformers' from_pretrained check (python3 cannot import torch and transformers: $(printf '%s' "$why" | tail -n 1))"
fi

# the folder whole through transformers, in the venv e2e.generate makes (made here when missing)
venv=${XDG_CACHE_HOME:-$HOME/.cache}/tycho-test-venv-transformers
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, transformers, safetensors' 2>/dev/null; then
  { /usr/bin/python3 -m venv --system-site-packages "$venv" &&
    "$venv/bin/pip" install -q --timeout 20 --retries 1 transformers==4.40.2 safetensors; } >"$tmp/pip.txt" 2>&1
fi
if why=$("$venv/bin/python" -c 'import torch, transformers, safetensors' 2>&1); then
  # merges as "a b" strings, which the tokenizers that transformers 4.40.2 pins (0.19) reads too
  "$venv/bin/python" -c '
import json, sys
spec = json.load(open(sys.argv[1]))
spec["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
json.dump(spec, open(sys.argv[1], "w"), ensure_ascii=False)' "$tmp/I/tokenizer.json" || fail "merges"
  printf '{"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"}\n' \
    >"$tmp/I/tokenizer_config.json"
  tokexport "$tmp/I" "$tmp/E" || fail "export for transformers"
  printf 'Hello, world! 3.14159 of  spaces\n\tΚαλημέρα κόσμε, 日本語 <|endoftext|> naïve café\n' >"$tmp/t.txt"
  "$tycho" tokenize "$tmp/E/tokenizer.json" "$tmp/t.txt" --out "$tmp/t.bin" --no-eos >/dev/null 2>"$tmp/err" ||
    fail "tycho tokenize"
  "$venv/bin/python" - "$tmp/E" "$tmp/t.bin" "$tmp/t.txt" <<'EOF' || fail "transformers on the export"
import struct, sys
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
folder, ids = sys.argv[1], open(sys.argv[2], "rb").read()
n = struct.unpack("<3i", ids[:12])[2]
tycho = list(struct.unpack(f"<{n}H", ids[1024:1024 + 2 * n]))
tok = AutoTokenizer.from_pretrained(folder)
text = open(sys.argv[3], "rb").read().decode("utf-8")
got = tok(text, add_special_tokens=False).input_ids
assert got == tycho, f"AutoTokenizer's ids differ from tycho tokenize's ({len(got)} and {len(tycho)} ids)"
model = AutoModelForCausalLM.from_pretrained(folder)
g = GenerationConfig.from_pretrained(folder)
assert (g.bos_token_id, g.eos_token_id) == (0, 0), (g.bos_token_id, g.eos_token_id)
assert model.generation_config.eos_token_id == 0, model.generation_config
print(f"ok: transformers loads the export whole: AutoTokenizer's {len(got)} ids are tycho tokenize's, "
      f"the model, generation config bos {g.bos_token_id} eos {g.eos_token_id}")
EOF
else
  echo "skipped: transformers on the export with its tokenizer (no venv with torch and transformers 4.40.2: $(printf '%s' "$why" | tail -n 1; tail -n 1 "$tmp/pip.txt" 2>/dev/null))"
fi
echo "ok: hf folders"
