#!/usr/bin/env bash
# plans/tiny_moe.lua (layers 1 and 3 sparse: 4 experts, top 2, capacity factor 1.25) end to end:
# 30 steps train (the loss falls), the progress lines show the router losses and the dropped
# fraction, every metrics record carries the "moe" object whose tokens per expert add up to the
# step's assignments (global · seq · top_k per sparse layer, before dropping), the exported
# safetensors holds Hugging Face Mixtral's tensor names, a checkpoint at step 15 resumes to the
# very losses of the uninterrupted run, and a resume with another expert count is refused
# naming it. log.trace holds the routing figures as counters.
# usage: run_moe.sh TYCHO   (run from the source folder)
set -u
tycho=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
plan=plans/tiny_moe.lua
common=(--set train.steps=30 --set train.eval_batches=0 --set log.every=10)

"$tycho" run "$plan" "${common[@]}" --set log.metrics="$tmp/a.jsonl" \
  --set export.path="$tmp/model.safetensors" --set log.trace="$tmp/trace.json" >"$tmp/a.out" 2>"$tmp/a.err" ||
  fail "the run failed"
# the trace carries the same figures as counters: per sparse layer aux and dropped, tokens per expert
for c in '"name":"moe layer 1","ph":"C","pid":0,"ts":[0-9.]*,"args":{"aux":' \
         '"name":"moe layer 3","ph":"C","pid":0,"ts":[0-9.]*,"args":{"dropped":' \
         '"name":"moe layer 3 tokens","ph":"C","pid":0,"ts":[0-9.]*,"args":{"expert 3":[0-9]*}'; do
  grep -q "$c" "$tmp/trace.json" || fail "the trace has no counter $c"
done
grep -q '^step 30/30 | loss .* | moe aux [0-9.]* drop [0-9.]*%$' "$tmp/a.out" || fail "no moe part in the progress line"
[ "$(grep -c '"moe": {"aux": ' "$tmp/a.jsonl")" -eq 30 ] || fail "not every metrics record has the moe object"
# per record and sparse layer: the tokens per expert sum to 32 · 32 · 2 = 2048
verdict=$(awk '
  /"loss"/ { line = $0
    n = 0
    while (match(line, /"layer": [0-9]+, "aux": [^,]*, "dropped": [^,]*, "tokens": \[[0-9, ]*\]/)) {
      part = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH)
      sub(/.*"tokens": \[/, "", part); sub(/\]/, "", part)
      k = split(part, t, ", "); s = 0
      for (i = 1; i <= k; i++) s += t[i]
      if (k != 4 || s != 2048) { print "bad tokens " part; exit }
      n++
    }
    if (n != 2) { print "record " NR " has " n " layers: " $0; exit }
  }
  END { print "ok" }' "$tmp/a.jsonl")
[ "$verdict" = ok ] || fail "metrics: $verdict"
grep -q '"layers": \[{"layer": 1, ' "$tmp/a.jsonl" || fail "the first sparse layer is not layer 1"
fall=$(awk -F'"loss": ' '/"loss"/ { split($2, a, ","); l[NR] = a[1] } END { print (l[30] < l[1] - 0.8) ? "ok" : l[1] " -> " l[30] }' "$tmp/a.jsonl")
[ "$fall" = ok ] || fail "the loss did not fall: $fall"
for name in model.layers.1.block_sparse_moe.gate.weight model.layers.3.block_sparse_moe.experts.3.w2.weight \
            model.layers.0.mlp.down_proj.weight; do
  grep -q "\"$name\"" "$tmp/model.safetensors" || fail "the export has no $name"
done
grep -q '"model.layers.1.mlp.down_proj.weight"' "$tmp/model.safetensors" && fail "a sparse layer exported a dense MLP"

# a checkpoint at step 15, resumed: steps 21-40 as the run without the stop
"$tycho" run "$plan" "${common[@]}" --set train.steps=15 --set checkpoint.dir="$tmp/ck" \
  >"$tmp/b.out" 2>"$tmp/b.err" || fail "the first half failed"
"$tycho" run "$plan" "${common[@]}" --set checkpoint.dir="$tmp/ck" --set log.metrics="$tmp/c.jsonl" \
  >"$tmp/c.out" 2>"$tmp/c.err" || fail "the resume failed"
want=$(grep '"loss"' "$tmp/a.jsonl" | sed -n '16,30p' | sed 's/.*"loss": \([^,]*\),.*/\1/')
got=$(grep '"loss"' "$tmp/c.jsonl" | sed 's/.*"loss": \([^,]*\),.*/\1/')
[ "$want" = "$got" ] || fail "the resumed losses differ from the uninterrupted run's"
"$tycho" run "$plan" "${common[@]}" --set checkpoint.dir="$tmp/ck" --set model.moe.experts=2 \
  >"$tmp/d.out" 2>"$tmp/d.err"
rc=$?
[ "$rc" -ne 0 ] || fail "a resume with 2 experts ran"
grep -q 'moe_experts = 4, the plan.s 2' "$tmp/d.err" || fail "the refusal does not name the expert count"
echo "ok: 30 steps, moe metrics, Mixtral names, resume equal, expert count refused"
