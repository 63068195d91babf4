#!/usr/bin/env bash
# Names and paths are bytes, and what tycho writes it reads back. A plan string that is not UTF-8
# (given by --set here; tests/plans/bad/*_not_utf8.lua hold the plan-file cases) is refused
# before anything runs, with exit 2 and the field; a name with quotes, a backslash, a tab and
# multi-byte characters is written into the checkpoint manifest escaped and reads back as the same
# bytes (`ckpt inspect`, and a resume); a plan without a name whose file name is not UTF-8 is
# named with U+FFFD in place of the bad byte, and its manifest reads back.
# usage: names_utf8.sh TYCHO   (run from the source folder)
set -u
tycho=$1
plan=tests/plans/good/train_small.lua
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$tmp/out"; echo "--- stderr"; cat "$tmp/err"; exit 1; }
small=(--set train.eval_every=0 --set train.steps=2 --set checkpoint.every=1)

# --set values that are not UTF-8: refused at once, naming the field and the --set
refused() { # refused MESSAGE ARGS...
  local want=$1
  shift
  "$tycho" check "$plan" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [ $rc -eq 2 ] || fail "$*: exit code $rc, expected 2"
  [ "$(head -n 1 "$tmp/err")" = "$want" ] || fail "$*: expected the message: $want"
}
refused $'tycho: plan error: --set name=run-\xff: name is not valid UTF-8 (byte 0xff at offset 4)' \
  --set name=$'run-\xff'
refused $'tycho: plan error: --set log.metrics=m\xe9trics.jsonl: log.metrics is not valid UTF-8 (byte 0xe9 at offset 1)' \
  --set log.metrics=$'m\xe9trics.jsonl'
"$tycho" run "$plan" "${small[@]}" --set name=$'x\xc0\xaf' --set checkpoint.dir="$tmp/refused" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] || fail "run with a name that is not UTF-8: not refused with exit 2"
[ -e "$tmp/refused" ] && fail "run with a name that is not UTF-8 wrote $tmp/refused"
echo "ok   strings that are not UTF-8 are refused"

# a hostile but valid name: written escaped, read back as the same bytes
name=$'caf\xc3\xa9 "q" \\ \t\xf0\x9f\x98\x80 \x7f'
"$tycho" run "$plan" "${small[@]}" --set name="$name" --set checkpoint.dir="$tmp/ck" >"$tmp/out" 2>"$tmp/err" ||
  fail "run with name '$name' failed"
"$tycho" ckpt inspect "$tmp/ck" >"$tmp/out" 2>"$tmp/err" || fail "ckpt inspect of its checkpoint failed"
[ "$(head -n 1 "$tmp/out")" = "checkpoint $tmp/ck/step_00000002: step 2 of plan $name (hash $(sed -n 's/.*"plan_hash":"\([0-9a-f]*\)".*/\1/p' "$tmp/ck/step_00000002/manifest.json"))" ] ||
  fail "ckpt inspect does not read the name back as written"
grep -qF '"plan":"caf'$'\xc3\xa9'' \"q\" \\ \t'$'\xf0\x9f\x98\x80'' '$'\x7f''"' "$tmp/ck/step_00000002/manifest.json" ||
  fail "the manifest does not hold the name escaped: $(grep -o '"plan":"[^,]*' "$tmp/ck/step_00000002/manifest.json")"
"$tycho" run "$plan" "${small[@]}" --set train.steps=3 --set name="$name" --set checkpoint.dir="$tmp/ck" >"$tmp/out" 2>"$tmp/err" ||
  fail "the resume from that checkpoint failed"
grep -q '^resumed from .*step_00000002' "$tmp/out" "$tmp/err" || fail "the run did not resume"
echo "ok   a name with quotes, a backslash, a tab and multi-byte characters reads back"

# a plan without a name is named after its file: a file name that is not UTF-8 gives a name with
# U+FFFD in its place, which the manifest holds and reads back as it is
cp "$plan" "$tmp/plan-"$'\xff'".lua"
"$tycho" run "$tmp/plan-"$'\xff'".lua" "${small[@]}" --set name=nil --set checkpoint.dir="$tmp/ck2" >"$tmp/out" 2>"$tmp/err" ||
  fail "run of a plan whose path is not UTF-8 failed"
grep -qF '"plan":"plan-'$'\xef\xbf\xbd''"' "$tmp/ck2/step_00000002/manifest.json" ||
  fail "the manifest does not hold the name with U+FFFD: $(grep -o '"plan":"[^,]*' "$tmp/ck2/step_00000002/manifest.json")"
"$tycho" ckpt inspect "$tmp/ck2" >"$tmp/out" 2>"$tmp/err" || fail "ckpt inspect of its checkpoint failed"
grep -qF "step 2 of plan plan-"$'\xef\xbf\xbd'" (hash" "$tmp/out" || fail "ckpt inspect does not read the name back"
echo "ok   a plan named after a file name that is not UTF-8 reads back"
