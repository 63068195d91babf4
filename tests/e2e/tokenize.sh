#!/usr/bin/env bash
# tycho tokenize: the golden texts (tests/golden/tokenizer) through both golden tokenizers give
# the ids of the `tokenizers` library, each document followed by the eos id (none with
# --no-eos), in an llm.c header (magic, version 1, the count); a .jsonl gives one document a
# line, blank lines skipped, a line without a string "text" refused naming file:line (exit 2);
# a tokenizer with ids past 65535 writes version 2 (uint32), which `tycho run` trains on; an
# unknown component type, a link at --out and a missing input are refused with exit 2 naming
# them, nothing written. When a venv with the `tokenizers` library can be made, a live check
# trains a byte-level (Llama 3's Split + ByteLevel) and a Metaspace tokenizer and compares every
# line of a mixed text.
# usage: tokenize.sh TYCHO   (run from the source folder)
set -u
tycho=$1
g=tests/golden/tokenizer
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }
ok() { echo "ok   $*"; }

# the header's three int32 and the tokens of an llm.c file (uint16 or uint32 by its version)
header() { od -An -v -td4 -N12 "$1" | tr -s ' ' | sed 's/^ //'; }
tokens() {
  local v; v=$(od -An -td4 -j4 -N4 "$1" | tr -d ' ')
  if [ "$v" = 2 ]; then od -An -v -tu4 -j1024 "$1"; else od -An -v -tu2 -j1024 "$1"; fi | tr -s ' ' '\n' | grep -v '^$'
}

# 1. the golden text: ids and eos, then --no-eos
for tok in bytelevel sp; do
  eos=$([ $tok = sp ] && echo 2 || echo 0)
  out=$("$tycho" tokenize $g/$tok.json $g/text.txt --out "$tmp/$tok.bin" --threads 2 2>&1) || fail "$tok: $out"
  n=$(wc -l < $g/$tok.text.ids)
  [ "$(header "$tmp/$tok.bin")" = "20240520 1 $((n + 1))" ] || fail "$tok header: $(header "$tmp/$tok.bin")"
  { cat $g/$tok.text.ids; echo $eos; } > "$tmp/want"
  tokens "$tmp/$tok.bin" > "$tmp/got"
  cmp -s "$tmp/got" "$tmp/want" && ok "$tok: the library's ids, then eos $eos" || fail "$tok: ids differ"
  "$tycho" tokenize $g/$tok.json $g/text.txt --out "$tmp/$tok.bin" --no-eos > /dev/null || fail "$tok --no-eos"
  tokens "$tmp/$tok.bin" | cmp -s - $g/$tok.text.ids && ok "$tok --no-eos" || fail "$tok --no-eos: ids differ"
  case "$out" in *"1 documents, $((n + 1)) tokens (llm.c version 1, uint16 tokens; eos $eos after each document)"*) ;;
    *) fail "$tok summary: $out" ;; esac
done

# 2. .jsonl: one document a line, in order over several threads, eos after each
printf '{"text": "hello world"}\n\n{"id": 7, "text": "Καλημέρα κόσμε"}\n   \n{"text": "3.14159 <|endoftext|>!"}\n' > "$tmp/docs.jsonl"
for k in $(seq 1 40); do printf '{"text": "document %d of many"}\n' $k; done >> "$tmp/docs.jsonl"
"$tycho" tokenize $g/bytelevel.json "$tmp/docs.jsonl" $g/special.txt --out "$tmp/docs.bin" --threads 3 > "$tmp/say" ||
  fail "jsonl: $(cat "$tmp/say")"
grep -q "44 documents" "$tmp/say" || fail "jsonl: $(cat "$tmp/say")"
# each document alone, concatenated, equals the whole
: > "$tmp/want"
for text in "hello world" "Καλημέρα κόσμε" "3.14159 <|endoftext|>!"; do
  printf '%s' "$text" > "$tmp/one.txt"
  "$tycho" tokenize $g/bytelevel.json "$tmp/one.txt" --out "$tmp/one.bin" > /dev/null
  tokens "$tmp/one.bin" >> "$tmp/want"
done
for k in $(seq 1 40); do
  printf 'document %d of many' $k > "$tmp/one.txt"
  "$tycho" tokenize $g/bytelevel.json "$tmp/one.txt" --out "$tmp/one.bin" > /dev/null
  tokens "$tmp/one.bin" >> "$tmp/want"
done
{ cat $g/bytelevel.special.ids; echo 0; } >> "$tmp/want"
tokens "$tmp/docs.bin" > "$tmp/got"
cmp -s "$tmp/got" "$tmp/want" && ok "jsonl: 44 documents in order, eos after each" || fail "jsonl: ids differ"
[ "$(head -3 "$tmp/got" | tr '\n' ' ')" != "" ] || fail "jsonl: empty"

printf '{"text": "fine"}\n{"txt": "no"}\n' > "$tmp/bad.jsonl"
err=$("$tycho" tokenize $g/bytelevel.json "$tmp/bad.jsonl" --out "$tmp/bad.bin" 2>&1); rc=$?
[ $rc = 2 ] && case "$err" in *"$tmp/bad.jsonl:2: no string \"text\" field"*) true ;; *) false ;; esac &&
  [ ! -e "$tmp/bad.bin" ] && ok "a line without text: exit 2, file:line" || fail "bad jsonl: exit $rc: $err"

# 3. ids past 65535: version 2 (uint32); tycho run trains on it
sed 's/"added_tokens": \[/"added_tokens": [{"id": 70000, "content": "<|big|>", "special": true, "normalized": false},/' \
  $g/bytelevel.json > "$tmp/big.json"
for k in 1 2 3 4 5 6 7 8; do cat $g/text.txt; done > "$tmp/long.txt"
"$tycho" tokenize "$tmp/big.json" "$tmp/long.txt" --out "$tmp/v2small.bin" > "$tmp/say" || fail "v2: $(cat "$tmp/say")"
printf 'and <|big|> here' >> "$tmp/long.txt"
"$tycho" tokenize "$tmp/big.json" "$tmp/long.txt" --out "$tmp/v2.bin" > "$tmp/say" || fail "v2: $(cat "$tmp/say")"
set -- $(header "$tmp/v2.bin")
[ "$2" = 2 ] && [ $(( $(stat -c %s "$tmp/v2.bin") - 1024 )) = $(( $3 * 4 )) ] &&
  [ "$(tokens "$tmp/v2.bin" | grep -c '^70000$')" = 1 ] && ok "ids past 65535: version 2, uint32" ||
  fail "v2: header $*, $(cat "$tmp/say")"
cat > "$tmp/plan.lua" <<EOF
local tycho = require "tycho"
return tycho.plan {
  name = "tokenized",
  model = { n_layers = 1, dim = 16, n_heads = 2, n_kv_heads = 2, ffn_dim = 32, vocab = 1024, max_seq = 16 },
  batch = { global = 2, micro = 2, seq = 16 },
  data = { train = "$tmp/v2small.bin" },
  train = { steps = 2 },
}
EOF
err=$("$tycho" run "$tmp/plan.lua" --set data.train="$tmp/v2.bin" 2>&1); rc=$?
[ $rc = 2 ] && case "$err" in *"token 70000 at index"*"is not below vocab 1024"*) true ;; *) false ;; esac &&
  ok "a version 2 file keeps the id < vocab check" || fail "v2 vocab check: exit $rc: $err"
[ "$(header "$tmp/v2small.bin" | cut -d' ' -f2)" = 2 ] || fail "v2small is not version 2"
out=$(timeout 300 "$tycho" run "$tmp/plan.lua" 2>&1); rc=$?
[ $rc = 0 ] && case "$out" in *"done: 2 steps"*) true ;; *) false ;; esac && ok "tycho run trains on a version 2 file" ||
  fail "run on v2: exit $rc: $(echo "$out" | tail -3)"

# 4. refusals: exit 2, by name, nothing written
awk '/"pre_tokenizer": \{/ {print; getline; sub(/"ByteLevel"/, "\"Whitespace\""); print; next} {print}' \
  $g/bytelevel.json > "$tmp/ws.json"
err=$("$tycho" tokenize "$tmp/ws.json" $g/text.txt --out "$tmp/ws.bin" 2>&1); rc=$?
[ $rc = 2 ] && case "$err" in *"$tmp/ws.json: pre_tokenizer type \"Whitespace\" is not read by tycho"*) true ;; *) false ;; esac &&
  [ ! -e "$tmp/ws.bin" ] && ok "an unknown pre_tokenizer type: exit 2, named" || fail "Whitespace: exit $rc: $err"
echo keep > "$tmp/target"
ln -s "$tmp/target" "$tmp/link.bin"
err=$("$tycho" tokenize $g/sp.json $g/text.txt --out "$tmp/link.bin" 2>&1); rc=$?
[ $rc = 2 ] && [ "$(cat "$tmp/target")" = keep ] && case "$err" in *"--out $tmp/link.bin: is a symbolic link"*) true ;; *) false ;; esac &&
  ok "a link at --out: exit 2, its target untouched" || fail "link: exit $rc: $err"
err=$("$tycho" tokenize $g/sp.json "$tmp/absent.txt" --out "$tmp/x.bin" 2>&1); rc=$?
[ $rc = 2 ] && case "$err" in *"$tmp/absent.txt"*) true ;; *) false ;; esac && [ ! -e "$tmp/x.bin" ] &&
  ok "a missing input: exit 2, named" || fail "missing input: exit $rc: $err"
err=$("$tycho" tokenize "$tmp/nothing.json" $g/text.txt --out "$tmp/x.bin" 2>&1); rc=$?
[ $rc = 2 ] && case "$err" in *"$tmp/nothing.json"*) true ;; *) false ;; esac && ok "a missing tokenizer: exit 2" ||
  fail "missing tokenizer: exit $rc: $err"

# 5. the live check against the library, where a venv with it can be made
# against_library WHAT: tycho tokenize's ids of live.jsonl under each tokenizer WHAT.names lists
# (NAME.json, written with the library's ids of the same lines in NAME.ids) equal the library's
against_library() {
  local what=$1 name
  for name in $(cat "$tmp/$what.names" 2>/dev/null); do
    "$tycho" tokenize "$tmp/$name.json" "$tmp/live.jsonl" --out "$tmp/$name.bin" --no-eos --threads 2 > /dev/null ||
      { fail "$what $name: tokenize failed"; continue; }
    tokens "$tmp/$name.bin" > "$tmp/$name.got"
    tr ' ' '\n' < "$tmp/$name.ids" | grep -v '^$' > "$tmp/$name.want"
    if cmp -s "$tmp/$name.got" "$tmp/$name.want"; then
      ok "$what: $name, $(wc -l < "$tmp/$name.want") ids of $(wc -l < "$tmp/live.jsonl") lines equal the library's"
    else
      fail "$what: $name differs from the library: $(diff "$tmp/$name.got" "$tmp/$name.want" | head -4 | tr '\n' ' ')"
    fi
  done
}
venv=${XDG_CACHE_HOME:-$HOME/.cache}/tycho-test-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
  { /usr/bin/python3 -m venv --system-site-packages "$venv" && "$venv/bin/pip" install -q --timeout 20 --retries 1 tokenizers; } > "$tmp/pip.log" 2>&1
fi
if "$venv/bin/python" -c 'import tokenizers' 2>/dev/null; then
  "$venv/bin/python" tests/golden/tokenizer/live.py "$tmp" > "$tmp/live.log" 2>&1 || fail "live: $(tail -5 "$tmp/live.log")"
  against_library live
  [ -s "$tmp/live.names" ] || fail "live: no tokenizers trained ($(tail -3 "$tmp/live.log"))"
else
  echo "skipped: the live check against the tokenizers library (no venv with it: $(tail -1 "$tmp/pip.log" 2>/dev/null))"
fi

# 6. real vocabularies: Mistral 7B's SentencePiece model and Mistral NeMo's byte-level ranks, from
# PyPI's mistral-common wheel (Apache 2.0), written as the hub's tokenizer.json files are
# (tests/golden/tokenizer/real.py), against the library on the same lines
wheels=${XDG_CACHE_HOME:-$HOME/.cache}/tycho-test-wheels
wheel=$wheels/mistral_common-1.13.1-py3-none-any.whl
if [ -s "$tmp/live.names" ]; then
  [ -s "$wheel" ] || "$venv/bin/pip" download -q --no-deps --timeout 20 --retries 1 -d "$wheels" \
    mistral-common==1.13.1 > "$tmp/pip-real.log" 2>&1
  "$venv/bin/python" -c 'import sentencepiece' 2>/dev/null ||
    "$venv/bin/pip" install -q --timeout 20 --retries 1 sentencepiece >> "$tmp/pip-real.log" 2>&1
fi
if [ -s "$tmp/live.names" ] && [ -s "$wheel" ] && "$venv/bin/python" -c 'import sentencepiece' 2>/dev/null; then
  "$venv/bin/python" tests/golden/tokenizer/real.py "$wheel" "$tmp" > "$tmp/real.log" 2>&1 ||
    fail "real: $(tail -5 "$tmp/real.log")"
  against_library real
  [ "$(wc -l < "$tmp/real.names" 2>/dev/null)" = 2 ] || fail "real: not both tokenizers written ($(tail -3 "$tmp/real.log"))"
else
  echo "skipped: the real vocabularies (no mistral-common wheel or sentencepiece: $(tail -1 "$tmp/pip-real.log" 2>/dev/null))"
fi

[ $failed = 0 ] && echo ok
exit $failed
