#!/usr/bin/env bash
# tycho generate: the key/value-cache decode gives the token ids of recomputing the training
# forward over the whole sequence at every token (--no-cache), greedy and sampled, on tiny's
# initial weights and on a checkpoint of a 3-step run (which generate loads: its ids differ from
# the initial weights'); the same seed samples the same ids twice and another seed other ids;
# top_k 1 is greedy; the REPL's t:generate on the live trainer after the same 3 steps gives the
# checkpoint's ids, and on 2 and 4 ranks (tp 2, pp 2, dp 2 ZeRO 3, tp 2 × pp 2) every rank's
# t:generate gives one rank's ids from the same weights (where mpirun is); --json prints the ids
# as one line; --prompt TEXT through a model folder's tokenizer.json gives the ids of --prompt-ids
# of what `tycho tokenize` makes of the text, and streams the --json text, and so does the plan's
# data.tokenizer (command and t:generate, each making the plan's token cache where it is not yet
# there, as tycho run does), and t:generate(text) at
# tp 2 on that folder gives those ids and text, and stops after its tokenizer's eos id (not with
# opts.eos = -1); on plans/tiny_moe.lua (a mixture of experts) the
# cache gives the full forward's ids and t:generate --json's, on one rank and at mesh.ep = 2; bad
# input is refused with exit 2 naming the option. Where a venv with transformers 4.40.2 over
# Debian's torch can be made, the greedy ids
# on a random LlamaForCausalLM saved with save_pretrained equal transformers'
# generate(do_sample = False), token for token, stopping at config.json's eos_token_id as it
# does, and --prompt's ids and text those of the tokenizers library's encode and decode around it
# (else: skipped, saying why), and so do those on a random MixtralForCausalLM. Their lm_heads are
# scaled by 30 so that the top two logits of every step lie far apart compared with the rounding
# of either side.
# usage: generate.sh TYCHO   (run from the source folder)
set -u
tycho=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; [ -f "$tmp/err" ] && cat "$tmp/err"; exit 1; }
gen() { "$tycho" generate "$@" 2>"$tmp/err"; }
expect() { # expect CODE TEXT COMMAND...: exit code CODE and TEXT as the first stderr line
  local code=$1 text=$2
  shift 2
  "$@" >/dev/null 2>"$tmp/err"
  local rc=$?
  [ "$rc" -eq "$code" ] || fail "$* exited $rc, expected $code"
  [ "$(head -n 1 "$tmp/err")" = "$text" ] || fail "$*: '$(head -n 1 "$tmp/err")', expected '$text'"
}
plan=plans/tiny.lua
prompt=49,50,43,51,52,61   # "12+34="

# (1) the cache against the full forward, on the initial weights and on a checkpoint
init=$(gen "$plan" --prompt-ids $prompt --max-tokens 24) || fail "generate"
[ "$(echo "$init" | wc -w)" -eq 24 ] || fail "not 24 ids: $init"
grep -q "weights: random (seeds.model); greedy" "$tmp/err" || fail "header: $(cat "$tmp/err")"
full=$(gen "$plan" --prompt-ids $prompt --max-tokens 24 --no-cache) || fail "generate --no-cache"
[ "$init" = "$full" ] || fail "initial weights: the cache gives '$init', the full forward '$full'"
echo "ok: initial weights, cached = full forward: $init"

"$tycho" run "$plan" --set train.steps=3 --set train.eval_every=0 --set checkpoint.dir="$tmp/ck" \
  --set checkpoint.every=3 >/dev/null 2>"$tmp/err" || fail "the 3-step run"
ck=(--set checkpoint.dir="$tmp/ck")
trained=$(gen "$plan" "${ck[@]}" --prompt-ids $prompt --max-tokens 24) || fail "generate from the checkpoint"
grep -q "weights: checkpoint $tmp/ck/step_00000003 (step 3)" "$tmp/err" || fail "header: $(cat "$tmp/err")"
[ "$trained" != "$init" ] || fail "the checkpoint's ids are the initial weights'"
full=$(gen "$plan" "${ck[@]}" --prompt-ids $prompt --max-tokens 24 --no-cache) || fail "--no-cache from the checkpoint"
[ "$trained" = "$full" ] || fail "checkpoint: the cache gives '$trained', the full forward '$full'"
echo "ok: checkpoint, cached = full forward: $trained"

# (2) sampling
s7=$(gen "$plan" "${ck[@]}" --prompt-ids $prompt --max-tokens 24 --temperature 1 --seed 7) || fail "sampled"
s7b=$(gen "$plan" "${ck[@]}" --prompt-ids $prompt --max-tokens 24 --temperature 1 --seed 7) || fail "sampled again"
s8=$(gen "$plan" "${ck[@]}" --prompt-ids $prompt --max-tokens 24 --temperature 1 --seed 8) || fail "seed 8"
[ "$s7" = "$s7b" ] || fail "seed 7 twice: '$s7', '$s7b'"
[ "$s7" != "$s8" ] || fail "seeds 7 and 8 give the same ids: $s7"
[ "$s7" != "$trained" ] || fail "sampling at temperature 1 gave the greedy ids"
s7f=$(gen "$plan" "${ck[@]}" --prompt-ids $prompt --max-tokens 24 --temperature 1 --seed 7 --no-cache) ||
  fail "sampled --no-cache"
[ "$s7" = "$s7f" ] || fail "sampled: the cache gives '$s7', the full forward '$s7f'"
k1=$(gen "$plan" "${ck[@]}" --prompt-ids $prompt --max-tokens 24 --temperature 1.5 --top-k 1 --seed 3) || fail "top_k 1"
[ "$k1" = "$trained" ] || fail "top_k 1 gives '$k1', greedy '$trained'"
p0=$(gen "$plan" "${ck[@]}" --prompt-ids $prompt --max-tokens 24 --temperature 2 --top-p 1e-9 --seed 5) || fail "top_p"
[ "$p0" = "$trained" ] || fail "top_p 1e-9 gives '$p0', greedy '$trained'"
nk=$(gen "$plan" "${ck[@]}" --prompt-ids $prompt --max-tokens 24 --temperature 1 --top-k 5 --top-p 0.9 --seed 7) || fail "top_k 5 top_p 0.9"
[ "$nk" != "$s7" ] || fail "top_k 5, top_p 0.9 changed nothing: $nk"
json=$(gen "$plan" "${ck[@]}" --prompt-ids $prompt --max-tokens 24 --temperature 1 --seed 7 --json) || fail "--json"
[ "$json" = "{\"ids\": [$(echo "$s7" | sed 's/ /, /g')], \"text\": null}" ] || fail "--json: $json"
echo "ok: sampling: seed 7 twice '$s7', seed 8 '$s8'; top_k 1 and top_p 1e-9 are greedy; --json"

# the REPL's t:generate on the live trainer after the same 3 steps: the checkpoint's ids
printf '%s\n' 't:step(3)' 'print("greedy", table.concat(t:generate({49,50,43,51,52,61}, {max_tokens=24}), " "))' \
  'print("seed7", table.concat(t:generate({49,50,43,51,52,61}, {max_tokens=24, temperature=1, seed=7}), " "))' \
  't:generate({1, 64})' |
  "$tycho" repl "$plan" --set train.eval_every=0 >"$tmp/repl" 2>"$tmp/err"
[ "$(sed -n 's/^greedy\t//p' "$tmp/repl")" = "$trained" ] || fail "t:generate: $(cat "$tmp/repl")"
[ "$(sed -n 's/^seed7\t//p' "$tmp/repl")" = "$s7" ] || fail "t:generate sampled: $(cat "$tmp/repl")"
grep -qF 'stdin:1: t:generate: prompt_ids[2] is not a token id below the vocabulary (64)' "$tmp/repl" ||
  fail "t:generate's refusal: $(cat "$tmp/repl")"
echo "ok: t:generate in the REPL gives the checkpoint's ids, greedy and sampled"

# t:generate on a multi-rank trainer: collective, every rank returns the one-rank ids of the same
# weights — the initial weights (bitwise those of one rank on every layout), greedy and sampled,
# at tp 2, pp 2, dp 2 with ZeRO 3 and tp 2 × pp 2; after t:step(2) at tp 2, the ids `tycho
# generate` gives from the checkpoint t:save wrote (the same weights, so no near-tie can differ)
if command -v mpirun >/dev/null 2>&1; then
  export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1
  si7=$(gen "$plan" --prompt-ids $prompt --max-tokens 24 --temperature 1 --seed 7) || fail "sampled, initial weights"
  cat >"$tmp/gen.lua" <<'LUA'
g = t:generate({49,50,43,51,52,61}, {max_tokens=24})
s = t:generate({49,50,43,51,52,61}, {max_tokens=24, temperature=1, seed=7})
io.write(string.format("rank%d greedy %s\nrank%d seed7 %s\n", t.rank, table.concat(g, " "), t.rank, table.concat(s, " ")))
@0 t:generate({49})
LUA
  mrepl() { # mrepl NP SCRIPT SETS...: every rank's lines "rankR greedy|seed7 IDS"
    local np=$1 script=$2
    shift 2
    mpirun -np "$np" "$tycho" repl "$plan" "$script" --set train.eval_every=0 "$@" >"$tmp/mrepl" 2>&1
  }
  mcheck() { # mcheck NP WHAT GREEDY SAMPLED: each of NP ranks printed those ids
    for r in $(seq 0 $(($1 - 1))); do
      [ "$(sed -n "s/.*rank$r greedy //p" "$tmp/mrepl")" = "$3" ] || fail "$2, rank $r greedy: $(cat "$tmp/mrepl")"
      [ "$(sed -n "s/.*rank$r seed7 //p" "$tmp/mrepl")" = "$4" ] || fail "$2, rank $r seed 7: $(cat "$tmp/mrepl")"
    done
  }
  for layout in "2 mesh.tp=2" "2 mesh.pp=2" "2 mesh.dp=2 zero=3" "4 mesh.tp=2 mesh.pp=2"; do
    set -- $layout
    np=$1
    shift
    sets=() # mesh.dp is the plan's "auto": the ranks the others leave
    for s in "$@"; do sets+=(--set "$s"); done
    mrepl "$np" "$tmp/gen.lua" "${sets[@]}"
    mcheck "$np" "$*" "$init" "$si7"
    grep -q 't:generate: generation on group world needs ranks .*, so it is refused' "$tmp/mrepl" ||
      fail "$*: t:generate on part of the job was not refused by name: $(cat "$tmp/mrepl")"
  done
  sed -i '1i t:step(2)' "$tmp/gen.lua"
  sed -i '$d' "$tmp/gen.lua"
  echo "t:save('$tmp/mck')" >>"$tmp/gen.lua"
  mrepl 2 "$tmp/gen.lua" --set mesh.tp=2
  [ -d "$tmp/mck/step_00000002" ] || fail "t:save wrote no step 2: $(cat "$tmp/mrepl")"
  sg=$(gen "$plan" --set checkpoint.dir="$tmp/mck" --prompt-ids $prompt --max-tokens 24) || fail "generate, tp 2 checkpoint"
  ss=$(gen "$plan" --set checkpoint.dir="$tmp/mck" --prompt-ids $prompt --max-tokens 24 --temperature 1 --seed 7) ||
    fail "generate sampled, tp 2 checkpoint"
  [ "$sg" != "$init" ] || fail "two steps left the greedy ids those of the initial weights: $sg"
  mcheck 2 "tp 2 after t:step(2)" "$sg" "$ss"
  echo "ok: t:generate at tp 2, pp 2, dp 2 ZeRO 3, tp 2 × pp 2 = one rank's ids; after 2 steps at tp 2 = the checkpoint's"
else
  echo "skipped: t:generate on several ranks (no mpirun)"
fi

# text: --prompt through the folder's tokenizer.json gives the ids of --prompt-ids of what
# `tycho tokenize` makes of the same text, and the text streamed is the --json text
"$tycho" run "$plan" --set model.vocab=1000 --set train.steps=1 --set train.eval_every=0 \
  --set export.path="$tmp/B" --set export.format=hf >/dev/null 2>"$tmp/err" || fail "the vocab-1000 export"
cp tests/golden/tokenizer/bytelevel.json "$tmp/B/tokenizer.json"
text='Hello, wörld! 12+34='
printf '%s' "$text" >"$tmp/prompt.txt"
"$tycho" tokenize "$tmp/B" "$tmp/prompt.txt" --out "$tmp/prompt.bin" --no-eos >/dev/null 2>"$tmp/err" || fail "tokenize"
ids=$(od -An -tu2 -j1024 -v "$tmp/prompt.bin" | xargs | tr ' ' ,)
[ -n "$ids" ] || fail "no ids from tokenize"
jt=$(gen "$tmp/B" --prompt "$text" --max-tokens 16 --json) || fail "--prompt --json"
ji=$(gen "$tmp/B" --prompt-ids "$ids" --max-tokens 16 --json) || fail "--prompt-ids $ids --json"
[ "$jt" = "$ji" ] || fail "--prompt gives '$jt', --prompt-ids $ids '$ji'"
case $jt in *'"text": null'*|*'"text": ""'*) fail "no text: $jt" ;; esac
streamed=$(gen "$tmp/B" --prompt "$text" --max-tokens 16) || fail "--prompt"
[ "$(grep '^ids: ' "$tmp/err")" = "ids: $(echo "$jt" | sed 's/.*"ids": \[\([^]]*\)\].*/\1/; s/,//g')" ] ||
  fail "the ids on stderr: $(cat "$tmp/err"), --json: $jt"
jtext=$(printf '%s' "$jt" | sed 's/.*"text": "\(.*\)"}$/\1/')
case $jtext in
  *\\*) ;; # escapes in the JSON: the Python part compares the text
  *) [ "$streamed" = "$jtext" ] || fail "streamed '$streamed', --json's text '$jtext'" ;;
esac
echo "ok: --prompt through tokenizer.json = --prompt-ids $ids; text: $jt"
# a plan's own data.tokenizer serves --prompt (the weights from a folder without a tokenizer.json)
mkdir -p "$tmp/D" && cp "$tmp/B"/*.json "$tmp/B"/*.safetensors "$tmp/D"/ 2>/dev/null; rm -f "$tmp/D/tokenizer.json"
printf 'some text to train on\n' >"$tmp/D.txt"
dt=(--set model.vocab=1000 --set init.from="$tmp/D" --set data.synthetic=nil --set "data.text={\"$tmp/D.txt\"}"
    --set data.tokenizer="$PWD/tests/golden/tokenizer/bytelevel.json" --set data.val_fraction=0 --set train.eval_every=0
    --set batch.seq=4)
jd=$(cd "$tmp" && "$tycho" generate "$OLDPWD/$plan" "${dt[@]}" --prompt "$text" --max-tokens 16 --json 2>"$tmp/err") ||
  fail "--prompt through data.tokenizer"
[ "$jd" = "$jt" ] || fail "--prompt through data.tokenizer gives '$jd', through the folder's '$jt'"
echo "ok: --prompt through the plan's data.tokenizer = through the folder's tokenizer.json"
# t:generate(text) at tp 2 on init.from's weights and tokenizer.json: --prompt's ids and text;
# through a tokenizer whose eos (its config.json's eos_token_id) is the 5th id of those, the ids
# stop after that id's first place, and with opts.eos = -1 they do not
if command -v mpirun >/dev/null 2>&1; then
  jids=$(echo "$jt" | sed 's/.*"ids": \[\([^]]*\)\].*/\1/')
  eos=$(echo "$jids" | tr -d , | cut -d' ' -f5)
  to_eos=$(echo "$jids" | tr -d , | tr ' ' '\n' | sed "/^$eos\$/q" | paste -sd, | sed 's/,/, /g')
  mkdir -p "$tmp/C" && cp tests/golden/tokenizer/bytelevel.json "$tmp/C/tokenizer.json" &&
    echo "{\"eos_token_id\": $eos}" >"$tmp/C/config.json" || fail "the eos tokenizer folder"
  cat >"$tmp/text.lua" <<LUA
x, y = t:generate("$text", {max_tokens=16})
io.write(string.format("rank%d ids %s\n", t.rank, table.concat(y, ", ")))
if t.rank == 0 then io.open("$tmp/text.out", "wb"):write(x) end
x, y = t:generate("$text", {max_tokens=16, tokenizer="$tmp/C"})
io.write(string.format("rank%d to_eos %s\n", t.rank, table.concat(y, ", ")))
x, y = t:generate("$text", {max_tokens=16, tokenizer="$tmp/C", eos=-1})
io.write(string.format("rank%d eos_off %s\n", t.rank, table.concat(y, ", ")))
LUA
  cat >"$tmp/text_dt.lua" <<LUA
x, y = t:generate("$text", {max_tokens=16})
io.write(string.format("rank%d dt %s\n", t.rank, table.concat(y, ", ")))
LUA
  # in a folder of its own: the REPL makes the token cache, as tycho run does
  (mkdir -p "$tmp/R" && cd "$tmp/R" && mpirun -np 2 "$tycho" repl "$OLDPWD/$plan" "$tmp/text_dt.lua" --set mesh.tp=2 \
    "${dt[@]}") >"$tmp/mrepl_dt" 2>&1
  mpirun -np 2 "$tycho" repl "$plan" "$tmp/text.lua" --set mesh.tp=2 --set model.vocab=1000 \
    --set init.from="$tmp/B" --set train.eval_every=0 >"$tmp/mrepl" 2>&1
  for r in 0 1; do
    [ "$(sed -n "s/.*rank$r ids //p" "$tmp/mrepl")" = "$jids" ] || fail "t:generate(text), rank $r: $(cat "$tmp/mrepl")"
    [ "$(sed -n "s/.*rank$r to_eos //p" "$tmp/mrepl")" = "$to_eos" ] ||
      fail "t:generate(text) with eos $eos, rank $r: want $to_eos: $(cat "$tmp/mrepl")"
    [ "$(sed -n "s/.*rank$r eos_off //p" "$tmp/mrepl")" = "$jids" ] ||
      fail "t:generate(text) with opts.eos = -1, rank $r: $(cat "$tmp/mrepl")"
    [ "$(sed -n "s/.*rank$r dt //p" "$tmp/mrepl_dt")" = "$jids" ] ||
      fail "t:generate(text) through the plan's data.tokenizer, rank $r: $(cat "$tmp/mrepl_dt")"
  done
  [ -s "$tmp/text.out" ] && [ "$(cat "$tmp/text.out")" = "$streamed" ] ||
    fail "t:generate(text) gave '$(cat "$tmp/text.out" 2>/dev/null)', generate --prompt '$streamed'"
  echo "ok: t:generate(text) at tp 2 = generate --prompt: ids $jids; stops at the tokenizer's eos $eos: $to_eos"
fi

# a mixture of experts (plans/tiny_moe.lua: layers 1 and 3 sparse, 4 experts, top 2, capacity
# factor 1.25): the cache gives the full forward's ids (both keep every assignment), greedy and
# sampled; t:generate gives --json's ids on one rank and, where mpirun is, on both ranks at
# mesh.ep = 2 (dp 2: each rank holds 2 of the 4 experts, all gathered to rank 0)
moe=plans/tiny_moe.lua
mj=$(gen "$moe" --prompt-ids $prompt --max-tokens 24 --json) || fail "generate $moe --json"
mg=$(echo "$mj" | sed 's/.*"ids": \[\([^]]*\)\].*/\1/; s/,//g')
[ "$(echo "$mg" | wc -w)" -eq 24 ] || fail "$moe: not 24 ids: $mj"
grep -q "4 layers (2 sparse: 4 experts, top 2, every assignment kept)" "$tmp/err" || fail "header: $(cat "$tmp/err")"
mf=$(gen "$moe" --prompt-ids $prompt --max-tokens 24 --no-cache) || fail "generate $moe --no-cache"
[ "$mg" = "$mf" ] || fail "$moe: the cache gives '$mg', the full forward '$mf'"
ms=$(gen "$moe" --prompt-ids $prompt --max-tokens 24 --temperature 1 --seed 7) || fail "generate $moe sampled"
msf=$(gen "$moe" --prompt-ids $prompt --max-tokens 24 --temperature 1 --seed 7 --no-cache) ||
  fail "generate $moe sampled --no-cache"
[ "$ms" = "$msf" ] || fail "$moe sampled: the cache gives '$ms', the full forward '$msf'"
cat >"$tmp/moe.lua" <<'LUA'
g = t:generate({49,50,43,51,52,61}, {max_tokens=24})
s = t:generate({49,50,43,51,52,61}, {max_tokens=24, temperature=1, seed=7})
io.write(string.format("rank%d greedy %s\nrank%d seed7 %s\n", t.rank, table.concat(g, " "), t.rank, table.concat(s, " ")))
LUA
"$tycho" repl "$moe" "$tmp/moe.lua" --set train.eval_every=0 >"$tmp/mrepl" 2>&1
[ "$(sed -n 's/.*rank0 greedy //p' "$tmp/mrepl")" = "$mg" ] || fail "$moe t:generate: $(cat "$tmp/mrepl")"
[ "$(sed -n 's/.*rank0 seed7 //p' "$tmp/mrepl")" = "$ms" ] || fail "$moe t:generate sampled: $(cat "$tmp/mrepl")"
if command -v mpirun >/dev/null 2>&1; then
  mpirun -np 2 "$tycho" repl "$moe" "$tmp/moe.lua" --set train.eval_every=0 --set mesh.ep=2 >"$tmp/mrepl" 2>&1
  for r in 0 1; do
    [ "$(sed -n "s/.*rank$r greedy //p" "$tmp/mrepl")" = "$mg" ] || fail "$moe ep 2, rank $r: $(cat "$tmp/mrepl")"
    [ "$(sed -n "s/.*rank$r seed7 //p" "$tmp/mrepl")" = "$ms" ] || fail "$moe ep 2, rank $r sampled: $(cat "$tmp/mrepl")"
  done
  echo "ok: $moe: cached = full forward, t:generate on one rank and at ep 2 = generate: $mg"
else
  echo "ok: $moe: cached = full forward, t:generate = generate: $mg (ep 2 skipped: no mpirun)"
fi

# (3) refusals
expect 2 "tycho: --prompt-ids: token id 64 is not below the model's vocabulary (64)" \
  "$tycho" generate "$plan" --prompt-ids 1,64
expect 2 "tycho: --prompt-ids: 129 tokens, longer than the model's max_seq (128)" \
  "$tycho" generate "$plan" --prompt-ids "$(seq -s, 1 129 | sed 's/[0-9]*/1/g')"
expect 2 "tycho: --prompt-ids 1,,2: not a comma list of token ids" "$tycho" generate "$plan" --prompt-ids 1,,2
expect 2 "tycho: --temperature warm: not a number in [0, 1e+06]" \
  "$tycho" generate "$plan" --prompt-ids 1 --temperature warm
expect 2 "tycho: --top-p 0: must be above 0 (1: off)" "$tycho" generate "$plan" --prompt-ids 1 --top-p 0
expect 2 "tycho: --top-p 1.5: not a number in [0, 1]" "$tycho" generate "$plan" --prompt-ids 1 --top-p 1.5
expect 2 "tycho: --max-tokens needs an integer in 1..1000000 (got 0: out of range); see tycho --help" "$tycho" generate "$plan" --prompt-ids 1 --max-tokens 0
expect 2 "tycho: generate needs one prompt: --prompt-ids I,J,K or --prompt TEXT" "$tycho" generate "$plan"
expect 2 "tycho: --prompt needs a tokenizer, and the plan has no data.tokenizer and no init.from folder to find one in; give --tokenizer PATH (a tokenizer.json or the folder holding it) or the ids with --prompt-ids I,J,K" \
  "$tycho" generate "$plan" --prompt "12+34="
expect 2 "tycho: --prompt: token id 69 is not below the model's vocabulary (64)" \
  "$tycho" generate "$plan" --tokenizer "$tmp/B/tokenizer.json" --prompt "Hello"
echo "ok: refusals"

# (4) transformers' greedy generate on a random Llama, where a venv can have it
venv=${XDG_CACHE_HOME:-$HOME/.cache}/tycho-test-venv-transformers
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, transformers, safetensors' 2>/dev/null; then
  { /usr/bin/python3 -m venv --system-site-packages "$venv" &&
    "$venv/bin/pip" install -q --timeout 20 --retries 1 transformers==4.40.2 safetensors; } >"$tmp/pip.txt" 2>&1
fi
if ! why=$("$venv/bin/python" -c 'import torch, transformers, safetensors' 2>&1); then
  echo "skipped: transformers' generate (no venv with torch and transformers 4.40.2: $(printf '%s' "$why" | tail -n 1; tail -n 1 "$tmp/pip.txt" 2>/dev/null))"
  exit 0
fi
"$venv/bin/python" - "$tmp/hf" "$text" <<'EOF' >"$tmp/hf.txt" 2>"$tmp/err" || fail "transformers"
import json, sys
import torch
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=875, pad_token_id=0)
model = LlamaForCausalLM(cfg).float().eval()
with torch.no_grad():
    model.lm_head.weight.mul_(30.0)  # logits far apart: argmax does not turn on rounding
model.save_pretrained(sys.argv[1], safe_serialization=True)
# merges as "a b" strings, which the tokenizers that transformers 4.40.2 pins (0.19) reads too
spec = json.load(open("tests/golden/tokenizer/bytelevel.json"))
spec["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
json.dump(spec, open(sys.argv[1] + "/tokenizer.json", "w"), ensure_ascii=False)
tok = Tokenizer.from_file(sys.argv[1] + "/tokenizer.json")
x = torch.tensor([tok.encode(sys.argv[2], add_special_tokens=False).ids])
with torch.no_grad():
    out = model.generate(x, do_sample=False, max_new_tokens=40, attention_mask=torch.ones_like(x))[0, x.shape[1]:].tolist()
with open(sys.argv[1] + "/../hf_text.json", "w") as f:
    json.dump({"ids": out, "text": tok.decode(out, skip_special_tokens=False)}, f)
for prompt in ([5, 17, 42, 3, 88, 9, 60], [7], [2, 2, 31, 640, 11]):
    x = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(x, do_sample=False, max_new_tokens=40, attention_mask=torch.ones_like(x))
    print(",".join(map(str, prompt)), " ".join(map(str, out[0, len(prompt):].tolist())))
EOF
n=0
while read -r p ids; do
  gen "$tmp/hf" --prompt-ids "$p" --max-tokens 40 >/dev/null || fail "generate from the saved model"
  got=$(sed -n 's/^ids: //p' "$tmp/err") # stdout has the text: the folder has a tokenizer
  [ "$got" = "$ids" ] || fail "prompt $p: tycho '$got', transformers '$ids'"
  n=$((n + 1))
done <"$tmp/hf.txt"
[ "$n" -eq 3 ] || fail "$n prompts compared"
grep -q ' 875$' "$tmp/hf.txt" || fail "no reference output stops at the eos id 875: $(cat "$tmp/hf.txt")"
echo "ok: transformers' greedy generate, token for token, on 3 prompts: $(cut -d' ' -f2- "$tmp/hf.txt" | head -n 1)"
gen "$tmp/hf" --prompt "$text" --max-tokens 40 --json >"$tmp/tycho_text.json" || fail "--prompt on the saved model"
"$venv/bin/python" - "$tmp/hf_text.json" "$tmp/tycho_text.json" <<'EOF' || fail "the text"
import json, sys
want, got = (json.load(open(f)) for f in sys.argv[1:])
assert got == want, f"tycho {got}, transformers and tokenizers {want}"
print("ok: --prompt's ids and text are tokenizers' encode, transformers' generate and tokenizers' decode:", got["text"][:60])
EOF

# transformers' greedy generate on a random MixtralForCausalLM (every layer sparse: 4 experts, top
# 2; transformers keeps every assignment, as tycho's generation does), its lm_head scaled by 30 and
# its routers by 10 so that neither the top two logits nor a token's choice of experts turns on
# rounding
"$venv/bin/python" - "$tmp/mx" <<'EOF' >"$tmp/mx.txt" 2>"$tmp/err" || fail "transformers' Mixtral"
import sys
import torch
from transformers import MixtralConfig, MixtralForCausalLM
torch.manual_seed(0)
cfg = MixtralConfig(vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
                    num_local_experts=4, num_experts_per_tok=2, bos_token_id=1, eos_token_id=875,
                    pad_token_id=0)
model = MixtralForCausalLM(cfg).float().eval()
with torch.no_grad():
    model.lm_head.weight.mul_(30.0)
    for layer in model.model.layers:
        layer.block_sparse_moe.gate.weight.mul_(10.0)
model.save_pretrained(sys.argv[1], safe_serialization=True)
for prompt in ([5, 17, 42, 3, 88, 9, 60], [7], [2, 2, 31, 640, 11]):
    x = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(x, do_sample=False, max_new_tokens=40, attention_mask=torch.ones_like(x))
    print(",".join(map(str, prompt)), " ".join(map(str, out[0, len(prompt):].tolist())))
EOF
n=0
while read -r p ids; do
  got=$(gen "$tmp/mx" --prompt-ids "$p" --max-tokens 40) || fail "generate from the saved Mixtral"
  [ "$got" = "$ids" ] || fail "Mixtral, prompt $p: tycho '$got', transformers '$ids'"
  n=$((n + 1))
done <"$tmp/mx.txt"
[ "$n" -eq 3 ] || fail "$n Mixtral prompts compared"
echo "ok: transformers' greedy generate on a random Mixtral, token for token, on 3 prompts: $(cut -d' ' -f2- "$tmp/mx.txt" | head -n 1)"
