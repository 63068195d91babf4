#!/usr/bin/env bash
# data.text: text files tokenized at run start into a cached token file. Proves: `tycho check`
# names the files, their bytes, the tokenizer and the cache (to be made, then already made); the
# first run makes the cache (the exact bytes `tycho tokenize` writes for the same files) and the
# next runs, on 1 rank and on 2 (dp 2 under mpirun), reuse it unchanged; the losses and the
# validation loss equal those of runs on data.train / data.val cut from `tycho tokenize`'s file at
# the same place (the last data.val_fraction of the tokens); a changed text, or a changed config.json
# beside the tokenizer (where its eos id can come from), makes a new cache;
# refusals with exit 2 naming the field: a missing file, no tokenizer, data.text with data.train,
# a tokenizer with more ids than model.vocab, a tokenizer that is not there, a .jsonl file,
# data.val_fraction = 0 with evaluation asked for. plans/shakespeare.lua checks and runs 2 shrunk
# steps on a slice of text with a sample (train.sample) after its evaluation, and names its fetch
# script where its text is missing; train.sample runs on every layout: the greedy sample of a tp 2,
# a pp 2 and a dp 2 ZeRO 3 run is the one-rank run's, and so is a mixture of experts' at ep 2.
# usage: data_text.sh TYCHO   (run from the source folder; works in a folder of its own, where
# the cache folder .tycho-cache is made)
set -u
tycho=$1
case "$tycho" in /*) ;; *) tycho=$PWD/$tycho ;; esac
tok=$PWD/tests/golden/tokenizer/bytelevel.json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
failed=0
fail() { echo "FAIL: $*"; failed=1; }
ok() { echo "ok   $*"; }

for i in $(seq 1 120); do echo "The quick brown fox $i jumps over the lazy dog number $((i * 7)), said the king."; done > a.txt
for i in $(seq 1 80); do echo "To be or not to be, that is question $i; whether 'tis nobler in the mind."; done > b.txt
plan() { # $1: the data table
  cat <<LUA
local tycho = require "tycho"
return tycho.plan {
  name = "text-small",
  model = { family = "llama", n_layers = 2, dim = 32, n_heads = 4, n_kv_heads = 2, ffn_dim = 64,
            vocab = 1024, max_seq = 16 },
  mesh = { tp = 1, pp = 1, dp = "auto" },
  batch = { global = 4, micro = 2, seq = 16 },
  precision = { compute = "fp32", grads = "fp32", master = "fp32" },
  optimizer = { kind = "adamw", lr = 3e-3, beta1 = 0.9, beta2 = 0.99, eps = 1e-8,
                weight_decay = 0.1, grad_clip = 1.0 },
  seeds = { global = 7 },
  data = $1,
  train = { steps = 3, eval_every = 3, eval_batches = 2 },
  log = { every = 1 },
}
LUA
}
plan "{ text = { \"a.txt\", \"b.txt\" }, tokenizer = \"$tok\", val_fraction = 0.25 }" > text.lua
plan "{ train = \"train.bin\", val = \"val.bin\" }" > files.lua
losses() { grep -E '^(step [0-9]+/3 \| loss|eval at step)' "$1" | sed 's/ | grad norm.*//; s/ | lr .*//'; }

# check before the cache exists
"$tycho" check text.lua > check.out 2>&1 || fail "check: $(cat check.out)"
grep -q "^data       text, 2 files: a.txt, b.txt; 14788 bytes; tokenizer $tok; cache .tycho-cache/text-[0-9a-f]*.bin (made by rank 0 at run start); the last 0.25 of the tokens for validation" check.out &&
  ok "check names the files, bytes, tokenizer and cache" || fail "check: $(grep '^data' check.out)"

# first run: the cache made, the bytes of tycho tokenize
"$tycho" run text.lua > run1.out 2>&1 || fail "run 1: $(cat run1.out)"
grep -q "^data.text: 2 files (14788 bytes) tokenized with $tok into .tycho-cache/text-" run1.out &&
  ok "the first run tokenizes" || fail "run 1: $(head -3 run1.out)"
cache=$(ls .tycho-cache/text-*.bin 2>/dev/null)
[ "$(echo "$cache" | wc -w)" = 1 ] || fail "one cache file expected: $cache"
"$tycho" tokenize "$tok" a.txt b.txt --out ref.bin > /dev/null || fail "tokenize"
cmp -s ref.bin "$cache" && ok "the cache holds tycho tokenize's file" || fail "the cache differs from tycho tokenize's file"
ls -l --time-style=+%s.%N "$cache" > stamp1
grep -q "(already made)" <("$tycho" check text.lua 2>&1) && ok "check: already made" || fail "check after the run"

# second run, and a run on 2 ranks: the cache reused untouched
"$tycho" run text.lua > run2.out 2>&1 || fail "run 2: $(cat run2.out)"
grep -q "^data.text: 2 files (14788 bytes) already tokenized with $tok: $cache" run2.out &&
  ok "the second run reuses the cache" || fail "run 2: $(head -2 run2.out)"
[ "$(losses run1.out)" = "$(losses run2.out)" ] || fail "runs 1 and 2 differ"
mpirun -np 2 "$tycho" run text.lua --set 'train.sample={prompt="The", max_tokens=8}' > mpi.out 2>&1 ||
  fail "mpirun: $(tail -5 mpi.out)"
[ "$(grep -c '^sample at step 3 (train.sample):' mpi.out)" = 1 ] && ok "2 ranks: rank 0 prints one sample" ||
  fail "2 ranks sample: $(grep -A1 '^sample' mpi.out)"
grep -q "already tokenized" mpi.out && grep -q "^eval at step 3: val loss" mpi.out && ok "2 ranks reuse the cache" ||
  fail "mpirun: $(head -3 mpi.out)"
ls -l --time-style=+%s.%N "$cache" | cmp -s - stamp1 && ok "the cache was not rewritten" || fail "the cache was rewritten"

# train.sample on every layout: all ranks gather the weights to rank 0, which samples as one rank does
greedy='train.sample={prompt="The", max_tokens=8, temperature=0}'
sample() { sed -n '/^sample at step 3 (train.sample):$/,/^done: /p' "$1" | grep -v '^done: '; }
"$tycho" run text.lua --set "$greedy" > s1.out 2>&1 || fail "1-rank sample run: $(tail -5 s1.out)"
want=$(sample s1.out)
[ "$(echo "$want" | wc -l)" -ge 2 ] || fail "1-rank sample: $(cat s1.out)"
for layout in mesh.tp=2 mesh.pp=2 zero=3; do
  mpirun -np 2 "$tycho" run text.lua --set "$greedy" --set $layout > s2.out 2>&1 ||
    fail "train.sample at $layout: exit $?: $(grep -v '^step' s2.out | head -5)"
  [ "$(sample s2.out)" = "$want" ] && ok "train.sample at $layout (2 ranks) = 1 rank's: $(echo "$want" | tail -1)" ||
    fail "train.sample at $layout: '$(sample s2.out)', 1 rank '$want'"
done
# with a mixture of experts (layer 1 sparse): a sample on one rank, and at mesh.ep 2 (dp 2, each
# rank 2 of the 4 experts, all gathered to rank 0) the same
moe='model.moe={experts=4, top_k=2, ffn_dim=32, layers={1}}'
"$tycho" run text.lua --set "$greedy" --set "$moe" > m1.out 2>&1 || fail "1-rank MoE sample run: $(tail -5 m1.out)"
mwant=$(sample m1.out)
[ "$(echo "$mwant" | wc -l)" -ge 2 ] || fail "1-rank MoE sample: $(grep -v '^step' m1.out | head -5)"
mpirun -np 2 "$tycho" run text.lua --set "$greedy" --set "$moe" --set mesh.ep=2 > m2.out 2>&1 ||
  fail "MoE train.sample at mesh.ep=2: exit $?: $(grep -v '^step' m2.out | head -5)"
[ "$(sample m2.out)" = "$mwant" ] && ok "MoE train.sample at mesh.ep=2 (2 ranks) = 1 rank's: $(echo "$mwant" | tail -1)" ||
  fail "MoE train.sample at mesh.ep=2: '$(sample m2.out)', 1 rank '$mwant'"

# the same tokens as data.train / data.val, cut at the last 0.25 of tycho tokenize's file
le32() { printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $(($1 & 255)) $((($1 >> 8) & 255)) $((($1 >> 16) & 255)) $((($1 >> 24) & 255)))"; }
n=$(od -An -td4 -j8 -N4 ref.bin | tr -d ' ')
nv=$((n / 4)) nt=$((n - n / 4))
{ le32 20240520; le32 1; le32 $nt; head -c 1012 /dev/zero; tail -c +1025 ref.bin | head -c $((2 * nt)); } > train.bin
{ le32 20240520; le32 1; le32 $nv; head -c 1012 /dev/zero; tail -c +$((1025 + 2 * nt)) ref.bin; } > val.bin
"$tycho" run files.lua > files1.out 2>&1 || fail "data.train run: $(cat files1.out)"
[ -n "$(losses run1.out)" ] && [ "$(losses run1.out)" = "$(losses files1.out)" ] &&
  ok "1 rank: losses and val loss equal data.train/data.val's" || fail "1 rank: $(losses run1.out) vs $(losses files1.out)"
mpirun -np 2 "$tycho" run files.lua > files2.out 2>&1 || fail "data.train mpirun: $(tail -5 files2.out)"
[ -n "$(losses mpi.out)" ] && [ "$(losses mpi.out)" = "$(losses files2.out)" ] &&
  ok "2 ranks: losses and val loss equal data.train/data.val's" || fail "2 ranks: $(losses mpi.out) vs $(losses files2.out)"

# a changed text: a new cache
echo "One more line." >> b.txt
"$tycho" run text.lua > run3.out 2>&1 || fail "run 3: $(cat run3.out)"
grep -q "^data.text: 2 files (14803 bytes) tokenized with" run3.out && [ "$(ls .tycho-cache/text-*.bin | wc -l)" = 2 ] &&
  ok "a changed text is tokenized again" || fail "run 3: $(head -1 run3.out); $(ls .tycho-cache)"

# a changed config.json beside the tokenizer (its eos id follows each document): a new cache
mkdir tk && cp "$tok" tk/tokenizer.json
"$tycho" run text.lua --set data.tokenizer=tk > run4.out 2>&1 || fail "run 4: $(cat run4.out)"
echo '{"eos_token_id": 5}' > tk/config.json
"$tycho" run text.lua --set data.tokenizer=tk > run5.out 2>&1 || fail "run 5: $(cat run5.out)"
c4=$(grep -o '^data.text: .*\.tycho-cache/text-[0-9a-f]*\.bin' run4.out | grep -o '\.tycho-cache/.*')
c5=$(grep '^data.text: .* tokenized with' run5.out | grep -o '\.tycho-cache/text-[0-9a-f]*\.bin')
[ -n "$c4" ] && [ -n "$c5" ] && [ "$c4" != "$c5" ] && ! cmp -s "$c4" "$c5" &&
  ok "a changed config.json beside the tokenizer is tokenized again" ||
  fail "config.json: $(head -1 run4.out); $(head -1 run5.out)"

# refusals: exit 2, the field named
refused() { # what, expected text, command...
  local what=$1 want=$2; shift 2
  "$@" > ref.out 2>&1
  local rc=$?
  [ $rc = 2 ] && grep -qF -- "$want" ref.out && ok "refused: $what" || fail "$what: exit $rc: $(cat ref.out)"
}
refused "a missing file" "data.text[1] nope.txt: No such file" "$tycho" run text.lua --set data.text=nope.txt
refused "no tokenizer" "data.text: no data.tokenizer" "$tycho" run text.lua --set data.tokenizer=nil
refused "text and train" "data.text: text to tokenize replaces data.train and data.val" \
  "$tycho" run text.lua --set data.train=train.bin
refused "a small model.vocab" "data.tokenizer $tok has 1000 ids, more than model.vocab = 512" \
  "$tycho" run text.lua --set model.vocab=512
refused "a missing tokenizer" "data.tokenizer nope.json: No such file" "$tycho" run text.lua --set data.tokenizer=nope.json
refused "a .jsonl file" 'data.text = "d.jsonl": data.text reads each file as one document' \
  "$tycho" run text.lua --set data.text=d.jsonl
refused "no validation set to evaluate on" "data.val_fraction = 0: train.eval_every = 3 asks for evaluation" \
  "$tycho" check text.lua --set data.val_fraction=0

# plans/shakespeare.lua without the network: it compiles and checks; 2 steps on a small slice of
# text (a.txt) with its own tokenizer, shrunk by --set; a missing text names the fetch script
src=$OLDPWD
shk=(--set data.tokenizer="$src/plans/tokenizers/shakespeare.json")
"$tycho" check "$src/plans/shakespeare.lua" "${shk[@]}" > shk.out 2>&1 &&
  grep -q "^data       text, 1 file: data/shakespeare/shakespeare.txt" shk.out && ok "shakespeare: check" ||
  fail "shakespeare check: $(grep '^data\|tycho:' shk.out)"
"$tycho" run "$src/plans/shakespeare.lua" "${shk[@]}" --set data.text=a.txt --set train.steps=2 --set model.n_layers=2 \
  --set batch.seq=64 --set batch.global=4 --set batch.micro=2 --set train.eval_batches=1 --set data.val_fraction=0.25 \
  --set log.every=1 > shk.out 2>&1 && grep -q "^step 2/2 | loss" shk.out && grep -q "^eval at step 2: val loss" shk.out &&
  ok "shakespeare: 2 steps on a slice" || fail "shakespeare run: $(tail -5 shk.out)"
grep -A1 "^sample at step 2 (train.sample):" shk.out | tail -1 | grep -q "^Romeo\." && ok "shakespeare: a sample after the eval" ||
  fail "shakespeare sample: $(grep -A2 '^sample' shk.out)"
refused "train.sample without a tokenizer" "train.sample: the prompt is encoded with data.tokenizer" \
  "$tycho" check "$src/plans/shakespeare.lua" --set data=nil --set data.synthetic=addition
refused "shakespeare without its text" "No such file or directory; run scripts/fetch-shakespeare.sh to fetch it (data.fetch)" \
  "$tycho" run "$src/plans/shakespeare.lua" "${shk[@]}"
exit $failed
