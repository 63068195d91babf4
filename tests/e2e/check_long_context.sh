#!/usr/bin/env bash
# `tycho check` on a long context (docs/results.md, "Long sequences: Llama 2 70B at 131,072 tokens"):
# plans/llama2_70b.lua at batch.seq = 131072 (model.max_seq raised to it, 32 sequences a step: the
# Llama 2 paper's 4M tokens), as the CPU runtime trains context parallelism (device = "cpu",
# precision.compute = "fp32"), full recompute, tp 8 × pp 4 as the plan has them:
#  - without context parallelism (32 ranks) no rank fits an H100's 80 GB: one rank holds whole
#    sequences' activations;
#  - with mesh.cp = 16 (512 ranks = tp 8 × cp 16 × pp 4) every rank fits with at least 10%
#    headroom, and the figures docs/results.md quotes are check's: pp rank 0's bill and ring;
#  - the ring's traffic on pp rank 0 is the ring's own count (host/runtime/parallel/cp.c): per
#    layer and micro-batch each forward (two with full recompute: the step's and the recompute's)
#    sends 2 (cp − 1) messages (k and v, cp − 1 hops) of B · (T/cp) · NKV · HS elements, NKV the
#    tp rank's 8 / 8 = 1 kv head, and the backward 2 (cp − 1) of them again plus cp accumulators
#    (dk | dv) of twice that; receives as many; over the 20 layers of pp rank 0 and the step's
#    micro-batches (schedule.microbatches);
#  - the ring is priced overlapped: its exposed seconds less than its transfers' seconds;
#  - `tycho tune` for 512 ranks, finding no layout without cp that fits, searches cp and writes
#    a cp layout that fits.
# The fp32 runtime's figures: the float64 proof build (8-byte reals) leaves the test out (scripts/test.sh)
# and, run there, it skips (exit 77).
# usage: check_long_context.sh TYCHO   (run from the source folder)
set -u
tycho=$1
"$tycho" --version | grep -q "float64 kernels" && { echo "skip: the float64 build's 8-byte reals"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }
sets=(--set batch.seq=131072 --set model.max_seq=131072 --set batch.global=32 --set device=cpu
      --set precision.compute=fp32 --set recompute=full --cluster plans/clusters/h100_80g_ib.lua)
num() { grep -o "\"$2\":[-0-9.e]*" "$1" | head -n 1 | cut -d: -f2; }

"$tycho" check plans/llama2_70b.lua --world 32 "${sets[@]}" --json >"$tmp/nocp.json" 2>"$tmp/err" ||
  { cat "$tmp/err"; echo "FAIL: tycho check without cp failed"; exit 1; }
grep -q '"fits":false' "$tmp/nocp.json" && echo "ok   without cp (tp 8 × pp 4, 32 ranks): no rank fits (headroom $(num "$tmp/nocp.json" min_headroom))" ||
  fail "without cp the 70B plan at 131072 tokens fits: nothing for cp to show"

"$tycho" check plans/llama2_70b.lua --world 512 --set mesh.cp=16 "${sets[@]}" --json >"$tmp/cp.json" 2>"$tmp/err" ||
  { cat "$tmp/err"; echo "FAIL: tycho check with cp 16 failed"; exit 1; }
"$tycho" check plans/llama2_70b.lua --world 512 --set mesh.cp=16 "${sets[@]}" >"$tmp/cp.txt" 2>"$tmp/err" ||
  { cat "$tmp/err"; echo "FAIL: tycho check with cp 16 (text) failed"; exit 1; }
grep -q '^mesh  *512 ranks = tp 8 × cp 16 × pp 4 × dp 1' "$tmp/cp.txt" || fail "the mesh line: $(grep '^mesh' "$tmp/cp.txt")"
headroom=$(num "$tmp/cp.json" min_headroom)
grep -q '"fits":true' "$tmp/cp.json" && awk -v h="$headroom" 'BEGIN { exit !(h >= 0.10) }' &&
  echo "ok   cp 16: every rank fits, the least headroom $headroom" || fail "cp 16: fits with headroom $headroom?"
grep -E '^ +0  0 ' "$tmp/cp.txt" | head -n 1
grep -E '^ +pp rank 0, cp ' "$tmp/cp.txt"
grep -E '^ +cp ring ' "$tmp/cp.txt"

# the ring's messages on pp rank 0, counted
eb=$(grep -o '"tp_comm":{[^}]*' "$tmp/cp.json" | grep -o '"bytes_per_element":[0-9]*' | cut -d: -f2)
M=$(grep -o '"microbatches":[0-9]*' "$tmp/cp.json" | head -n 1 | cut -d: -f2)
ring=$(grep -o '"traffic_per_step":\[{"pp_rank":0,.*' "$tmp/cp.json" | grep -o '"cp":{"send":{"calls":[0-9]*,"bytes":[0-9]*},"recv":{"calls":[0-9]*,"bytes":[0-9]*}}' | head -n 1)
[ -n "$eb" ] && [ -n "$M" ] && [ -n "$ring" ] || { echo "FAIL: no element size, micro-batches or ring traffic in the JSON"; exit 1; }
read -r sc sb rc rb <<<"$(printf '%s' "$ring" | grep -o '[0-9][0-9]*' | tr '\n' ' ')"
read -r want_calls want_bytes <<<"$(awk -v eb="$eb" -v M="$M" 'BEGIN {
  cp = 16; L = 20; B = 1; T = 131072; NKV = 1; HS = 128; fwd = 2
  kv = B * T / cp * NKV * HS * eb
  calls = M * L * (fwd * 2 * (cp - 1) + 2 * (cp - 1) + cp)
  bytes = M * L * (fwd * 2 * (cp - 1) * kv + 2 * (cp - 1) * kv + cp * 2 * kv)
  printf "%.0f %.0f", calls, bytes }')"
[ "$sc" = "$want_calls" ] && [ "$sb" = "$want_bytes" ] && [ "$rc" = "$want_calls" ] && [ "$rb" = "$want_bytes" ] &&
  echo "ok   the ring on pp rank 0: $sc messages, $sb B sent a step (and as many received): the count by hand" ||
  fail "the ring on pp rank 0: send $sc calls $sb B, recv $rc calls $rb B; by hand $want_calls calls, $want_bytes B"

cost=$(grep -o '"cp":{"intra_node":[a-z]*,"seconds":[0-9.e]*,"exposed_seconds":[0-9.e]*' "$tmp/cp.json")
total=$(printf '%s' "$cost" | grep -o '"seconds":[0-9.e]*' | cut -d: -f2)
exposed=$(printf '%s' "$cost" | grep -o '"exposed_seconds":[0-9.e]*' | cut -d: -f2)
[ -n "$total" ] && [ -n "$exposed" ] && awk -v t="$total" -v e="$exposed" 'BEGIN { exit !(t > 0 && e < t) }' &&
  echo "ok   the ring's transfers $total s a step, $exposed s of them exposed past the attention blocks" ||
  fail "the ring's cost: transfers '$total' s, exposed '$exposed' s"

# tune: no layout without cp fits 512 ranks, so it searches cp; its best has cp > 1, and the plan
# it writes checks as fitting
"$tycho" tune plans/llama2_70b.lua --world 512 "${sets[@]}" --out "$tmp/tuned.lua" >"$tmp/tune.txt" 2>"$tmp/err" ||
  { cat "$tmp/tune.txt" "$tmp/err"; echo "FAIL: tycho tune failed"; exit 1; }
grep -E '^ 1\. ' "$tmp/tune.txt"
grep -Eq '^ 1\. tp [0-9]+ pp [0-9]+ v [12] dp [0-9]+ cp [0-9]+,' "$tmp/tune.txt" && grep -q 'cp = ' "$tmp/tuned.lua" &&
  "$tycho" check "$tmp/tuned.lua" --world 512 --cluster plans/clusters/h100_80g_ib.lua | grep -q 'every rank fits' &&
  echo "ok   tune: its best layout has cp, and the plan it wrote fits" || fail "tune did not pick a fitting cp layout"
exit $failed
