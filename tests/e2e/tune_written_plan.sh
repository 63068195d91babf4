#!/usr/bin/env bash
# `tycho tune` writes a plan that means what was tuned: checked from another folder, the written
# file compiles to exactly the plan tune priced — its base plan (never a namesake on the search
# path), every --set tune was given, and the layout tune chose. Three bases: one whose file name
# has dots (`require` cannot name it), one named like a shipped plan written to another folder
# (the shipped plans/tiny.lua is on the search path there), and a shipped plan written elsewhere
# (loaded by `require`, as before).
# usage: tune_written_plan.sh TYCHO   (run from the source folder)
set -u
tycho=$1
case $tycho in /*) ;; *) tycho=$PWD/$tycho ;; esac # it runs from another folder too
src=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$tmp/out"; echo "--- stderr"; cat "$tmp/err"; exit 1; }
cluster=$src/plans/clusters/a100_80g_ib.lua
mkdir -p "$tmp/base" "$tmp/elsewhere" "$tmp/third"
# tiny with 2 layers instead of 4, so the shipped tiny.lua, if it were loaded, shows
sed 's/n_layers = 4,/n_layers = 2,/' plans/tiny.lua >"$tmp/base/my.tiny.lua"
cp "$tmp/base/my.tiny.lua" "$tmp/base/tiny.lua"
grep -q 'n_layers = 2,' "$tmp/base/tiny.lua" || fail "the base plan's copy lacks n_layers = 2"
sets=(--set train.steps=77 --set optimizer.lr=2e-3 --set 'log={every=7}' --set 'log.metrics=m "1".jsonl'
      --set lr_schedule.warmup=nil --set checkpoint.dir=ck --set checkpoint.allow_changes=optimizer.lr,batch.global)

# The layout of tune's best line as --set overrides (tune's search: stages balanced, 1F1B,
# zb-h1 (the line says so) or interleaved, sequence parallel with tp > 1, one recompute for every layer).
layout_sets() {
  local line
  line=$(grep -m1 '^written (the fastest that tycho run runs; [^)]*): tp' "$tmp/out") ||
    line=$(grep -m1 '^ 1\. tp' "$tmp/out") || fail "tune printed no best layout"
  local re='^( 1\.|written \(.*\):) tp ([0-9]+) pp ([0-9]+) v ([0-9]+) dp [0-9]+, micro ([0-9]+), zero ([0-3])( \(grads every ([a-z-]+)(, params every ([a-z-]+))?\))?, recompute ([a-z_]+), sequence parallel (on|off)'
  [[ $line =~ $re ]] || fail "cannot read tune's best layout: $line"
  local v=${BASH_REMATCH[4]} every=${BASH_REMATCH[8]} params=${BASH_REMATCH[10]}
  layout=(--set mesh.tp="${BASH_REMATCH[2]}" --set mesh.pp="${BASH_REMATCH[3]}" --set virtual_stages="$v"
          --set stages=balanced --set schedule.kind=$([ "$v" -gt 1 ] && echo interleaved ||
                                                     { [[ $line == *", schedule zb-h1"* ]] && echo zb-h1 || echo 1f1b; })
          --set batch.micro="${BASH_REMATCH[5]}" --set zero="${BASH_REMATCH[6]}"
          --set recompute="${BASH_REMATCH[11]}"
          --set sequence_parallel=$([ "${BASH_REMATCH[12]}" = on ] && echo true || echo false))
  [ -n "$every" ] && layout+=(--set zero_every.grads="${every/micro-batch/micro_batch}")
  [ -n "$params" ] && layout+=(--set zero_every.params="${params/micro-batch/micro_batch}")
  return 0
}
# The "plan" object of a check --json document (the plan hash covers exactly it).
plan_json() { sed -n 's/.*"plan":\({"name":.*\),"run_refusal":.*/\1/p'; }

# tune_and_compare NAME BASE WRITTEN [tune arguments...]: tune BASE, check WRITTEN from a third
# folder, compare with BASE checked under the --set overrides and tune's layout
tune_and_compare() {
  local name=$1 base=$2 written=$3
  shift 3
  "$tycho" tune "$base" --world 4 --cluster "$cluster" --top 1 "${sets[@]}" "$@" >"$tmp/out" 2>"$tmp/err" ||
    fail "$name: tune failed"
  [ -s "$written" ] || fail "$name: tune wrote no $written"
  layout_sets
  (cd "$tmp/third" && "$tycho" check "$written" --world 4 --json) >"$tmp/got.json" 2>"$tmp/err" ||
    fail "$name: check of the written plan from another folder failed: $(cat "$written")"
  "$tycho" check "$base" --world 4 --json "${sets[@]}" "${layout[@]}" >"$tmp/want.json" 2>"$tmp/err" ||
    fail "$name: check of the base plan with tune's choices failed (${layout[*]})"
  local got want
  got=$(plan_json <"$tmp/got.json")
  want=$(plan_json <"$tmp/want.json")
  [ -n "$want" ] || fail "$name: no plan object in check --json"
  if [ "$got" != "$want" ]; then
    echo "written plan: $got" >"$tmp/out"
    echo "tuned plan:   $want" >>"$tmp/out"
    fail "$name: the written plan compiles to another plan than tune's choice"
  fi
  # the fields that matter, named, so a failure above is not an artefact of the comparison
  for field in '"n_layers":2' '"steps":77' '"lr":0.002' '"metrics":"m \"1\".jsonl"' '"warmup":0' '"log":{"every":7' '"allow_changes":["batch.global","optimizer.lr"]' \
               "\"tp\":${layout[1]#mesh.tp=},\"pp\":${layout[3]#mesh.pp=}" "\"zero\":${layout[13]#zero=}"; do
    case "$got" in *"$field"*) ;; *) fail "$name: the written plan lacks $field" ;; esac
  done
  echo "ok   $name"
}

tune_and_compare "a base whose name has dots" "$tmp/base/my.tiny.lua" "$tmp/base/my.tiny_tuned_4.lua"
tune_and_compare "a base named like a shipped plan, written to another folder" "$tmp/base/tiny.lua" \
  "$tmp/elsewhere/t.lua" --out "$tmp/elsewhere/t.lua"
sets=(--set train.steps=77)
tune_and_compare_shipped() {
  "$tycho" tune plans/tiny.lua --world 4 --cluster "$cluster" --top 1 "${sets[@]}" --out "$tmp/elsewhere/s.lua" \
    >"$tmp/out" 2>"$tmp/err" || fail "shipped: tune failed"
  grep -q '^local plan = require "tiny"' "$tmp/elsewhere/s.lua" || fail "a shipped plan is not loaded by require: $(cat "$tmp/elsewhere/s.lua")"
  layout_sets
  (cd "$tmp/third" && "$tycho" check "$tmp/elsewhere/s.lua" --world 4 --json) >"$tmp/got.json" 2>"$tmp/err" ||
    fail "shipped: check of the written plan failed"
  "$tycho" check plans/tiny.lua --world 4 --json "${sets[@]}" "${layout[@]}" >"$tmp/want.json" 2>"$tmp/err" ||
    fail "shipped: check of the base plan with tune's choices failed"
  [ "$(plan_json <"$tmp/got.json")" = "$(plan_json <"$tmp/want.json")" ] ||
    fail "shipped: the written plan compiles to another plan than tune's choice"
  echo "ok   a shipped plan written to another folder is loaded by require"
}
tune_and_compare_shipped

# zb-h1 is searched beside 1F1B (priced with what its W's hold); the fastest of tiny at 8 ranks is
# zb-h1 under ZeRO 3 with zero_every "step", which tycho run runs, so the written plan is it (no
# line of its own) and it runs; where tycho run refuses a zb-h1 layout (sparse layers) its line says why
"$tycho" tune plans/tiny.lua --world 8 --cluster "$cluster" --top 40 --out "$tmp/elsewhere/zb.lua" >"$tmp/out" 2>"$tmp/err" ||
  fail "zb: tune failed"
grep -q -E '^ *[0-9]+\. tp [0-9]+ pp [2-9].*sequence parallel (on|off): ' "$tmp/out" || fail "zb: no 1F1B layout among the 40 fastest"
kind=$(sed -n 's/^  schedule = { kind = "\(.*\)" },$/\1/p' "$tmp/elsewhere/zb.lua")
grep -m1 '^ 1\. tp' "$tmp/out" | grep -q 'zero 3 (grads every step, params every step),.*, schedule zb-h1: ' ||
  fail "zb: the fastest of tiny at 8 ranks is not zb-h1 under ZeRO 3 with \"step\""
! grep -q 'run refuses it\|^written (' "$tmp/out" && [ "$kind" = zb-h1 ] ||
  fail "zb: the best is zb-h1 (run runs it); the written plan says $kind: $(grep '^written\|refuses' "$tmp/out" | head -n 3)"
"$tycho" check "$tmp/elsewhere/zb.lua" --world 8 >"$tmp/zbcheck" 2>&1 && ! grep -q 'run_refusal\|refuse' "$tmp/zbcheck" ||
  fail "zb: the written plan is not one that runs: $(grep -i refus "$tmp/zbcheck")"
"$tycho" tune plans/tiny_moe.lua --world 8 --cluster "$cluster" --top 40 --out "$tmp/elsewhere/zb_moe.lua" >"$tmp/out" 2>"$tmp/err" ||
  fail "zb: tune of tiny_moe failed"
grep -q '^ *[0-9]*\. tp [0-9]* pp [2-9].*, schedule zb-h1 (check prices it; run refuses it with MoE): ' "$tmp/out" ||
  fail "zb: no zb-h1 layout of tiny_moe among the 40 fastest, said to be refused with MoE"
echo "ok   zb-h1 searched beside 1f1b; the written plan runs"
