#!/usr/bin/env bash
# `tycho check` reads against the published accountings of ZeRO's memory. For Llama-2 7B
# (plans/llama2_7b.lua: bf16 params, fp32 master and AdamW moments) at dp 64, tp 1, pp 1, the JSON's
# ranks[0].model_states (what a rank keeps between steps) must be, within 1%:
#  - the ZeRO paper's model states (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
#    Training Trillion Parameter Models", SC 2020, section 3.1 and figure 1: 2Ψ + 2Ψ + KΨ, K = 12,
#    sharded by stage) with bf16 grads: zero 0 16Ψ, 1 4Ψ + 12Ψ/N, 2 2Ψ + 14Ψ/N, 3 16Ψ/N, each of
#    params, grads and optimizer on its own too (Ψ = the plan's parameter count, plan.model.params);
#  - DeepSpeed's estimator without offload, with fp32 grads (the plan's own precision.grads), as its
#    "Memory Requirements" page states it (https://deepspeed.readthedocs.io/en/latest/memory.html,
#    docs/code-docs/source/memory.rst in the DeepSpeed repository):
#      ZeRO-2: 4Ψ + 16Ψ/N, that is fp16 params 2Ψ + fp16 grads of the whole model 2Ψ + (fp32 master,
#        momentum, variance and the fp32 gradient partition, 4 bytes each)/N. tycho keeps no whole
#        fp16 gradient (a rank's gradients are its fp32 shard, and during backward at most two
#        units' buckets in flight, transient), so the like-for-like part is 4Ψ + 16Ψ/N − 2Ψ, and
#        the whole of tycho's ZeRO-2 peak in those categories stays below DeepSpeed's figure;
#      ZeRO-3: largest_layer_memory + 18Ψ/N, 18 = fp32 params, grads, momentum, variance (16) +
#        fp16 params (2): the model states, like for like. largest_layer_memory = 4 bytes ×
#        the largest layer's parameters (its 2-byte params gathered, its 2-byte grads computed).
#        DeepSpeed gathers per module; tycho gathers per decoder layer and prefetches the next,
#        so its transient params are 2 bytes × two decoder layers' parameters (4·dim·(q,k,v,o) rows
#        + 3·dim·ffn + 2 norms), checked here from the model's shapes.
# And the split is one of the bill: peak = model states + transient, per category.
# usage: check_model_states.sh TYCHO   (run from the source folder)
set -u
tycho=$1
plan=plans/llama2_7b.lua
N=64
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# check ZERO GRADS: the JSON of the 7B plan at dp 64, tp 1, pp 1
check() {
  "$tycho" check $plan --set mesh.dp=$N --set mesh.tp=1 --set mesh.pp=1 --set zero="$1" \
    --set precision.grads="$2" --json >"$tmp/c.json" 2>"$tmp/err" || { cat "$tmp/err"; return 1; }
}
# field OBJECT KEY: the integer KEY of rank 0's OBJECT ("memory", "model_states", "transient")
field() {
  grep -o '"rank":0,"tp".*' "$tmp/c.json" | grep -o "\"$1\":{[^}]*}" | head -n 1 | grep -o "\"$2\":[0-9]*" |
    grep -o '[0-9]*$'
}
model() { grep -o '"model":{[^}]*}' "$tmp/c.json" | head -n 1 | grep -o "\"$1\":[0-9]*" | grep -o '[0-9]*$'; }
# near WHAT GOT WANT: GOT within 1% of WANT (an awk expression of P, the parameter count, and N)
near() {
  local what=$1 got=$2 want
  want=$(awk -v P="$psi" -v N=$N "BEGIN { printf \"%.0f\", $3 }")
  if awk -v g="$got" -v w="$want" 'BEGIN { d = g - w; if (d < 0) d = -d; exit !(w > 0 && d <= 0.01 * w) }'; then
    echo "ok   $what: $got B, formula $3 = $want B ($(awk -v g="$got" -v w="$want" 'BEGIN { printf "%+.4f%%", 100 * (g - w) / w }'))"
  else
    fail "$what: $got B, formula $3 = $want B: more than 1% apart"
  fi
}

check 0 bf16 || { echo "FAIL: tycho check failed"; exit 1; }
psi=$(model params)
[ -n "$psi" ] && [ "$psi" -gt 6000000000 ] || { echo "FAIL: no parameter count in the JSON"; exit 1; }
echo "Ψ = $psi parameters, N = $N"

# The ZeRO paper, bf16 grads: per stage, the formula of each part and of the total
paper_params=("2*P" "2*P" "2*P" "2*P/N")
paper_grads=("2*P" "2*P" "2*P/N" "2*P/N")
paper_optimizer=("12*P" "12*P/N" "12*P/N" "12*P/N")
paper_total=("16*P" "4*P+12*P/N" "2*P+14*P/N" "16*P/N")
for z in 0 1 2 3; do
  check $z bf16 || { fail "tycho check zero $z failed"; continue; }
  for c in params grads optimizer; do
    eval "want=\${paper_$c[$z]}"
    near "zero $z (paper) model_states.$c" "$(field model_states $c)" "$want"
    peak=$(field memory $c) held=$(field model_states $c)
    t=$([ $c = optimizer ] && echo 0 || field transient $c)
    [ -n "$peak" ] && [ -n "$held" ] && [ -n "$t" ] && [ "$peak" -eq $((held + t)) ] ||
      fail "zero $z: the $c peak $peak B is not model states $held B + transient $t B"
  done
  near "zero $z (paper) model_states.total" "$(field model_states total)" "${paper_total[$z]}"
done
# zero 3's peaks are what a run measures, the gathered units and buckets in flight included: the
# paper's 2Ψ/N is the model states, not the peak (the reason the two are printed apart)
check 3 bf16
awk -v g="$(field memory params)" -v P="$psi" -v N=$N 'BEGIN { exit !(g > 1.5 * 2 * P / N) }' ||
  fail "zero 3: the params peak is no more than the shard: the transient buffers are missing"

# DeepSpeed's estimator, fp32 grads (stage 2 and 3 without offload)
check 2 fp32 || fail "tycho check zero 2 fp32 grads failed"
near "zero 2 (DeepSpeed, less its whole fp16 gradient) model_states.total" "$(field model_states total)" "4*P+16*P/N-2*P"
ds2=$(awk -v P="$psi" -v N=$N 'BEGIN { printf "%.0f", 4 * P + 16 * P / N }')
ours=$(($(field memory params) + $(field memory grads) + $(field memory optimizer)))
if [ "$ours" -lt "$ds2" ]; then
  echo "ok   zero 2: params + grads + optimizer peaks $ours B, below DeepSpeed's 4Ψ + 16Ψ/N = $ds2 B"
else
  fail "zero 2: params + grads + optimizer peaks $ours B, not below DeepSpeed's 4Ψ + 16Ψ/N = $ds2 B"
fi
check 3 fp32 || fail "tycho check zero 3 fp32 grads failed"
near "zero 3 (DeepSpeed's 18Ψ/N) model_states.total" "$(field model_states total)" "18*P/N"
dim=$(model dim) heads=$(model n_heads) kv=$(model n_kv_heads) hd=$(model head_dim) ffn=$(model ffn_dim)
layer=$((dim * heads * hd * 2 + dim * kv * hd * 2 + 3 * dim * ffn + 2 * dim))
near "zero 3 (DeepSpeed's gathered 2-byte params, two decoder layers of $layer) transient.params" \
  "$(field transient params)" "2*2*$layer"

# The text names both accountings, with rank 0's figures
"$tycho" check $plan --set mesh.dp=$N --set mesh.tp=1 --set mesh.pp=1 --set zero=3 --set precision.grads=bf16 \
  >"$tmp/c.txt" 2>"$tmp/err" || fail "tycho check (text) failed"
for line in "model states   200.8 MiB   200.8 MiB     1.2 GiB" "transient      772.0 MiB   772.0 MiB" \
            "model states: the ZeRO paper's accounting, what a rank keeps between steps"; do
  grep -qF "$line" "$tmp/c.txt" && echo "ok   text: '$line'" || fail "the text lacks '$line'"
done
[ $failed -eq 0 ] && echo "model states of Llama-2 7B at dp $N: the ZeRO paper's and DeepSpeed's formulas within 1%"
exit $failed
