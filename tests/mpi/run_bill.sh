#!/usr/bin/env bash
# The memory bill `tycho check` predicts is the bill `tycho run` measures. Runs PLAN on RANKS
# ranks with the --set arguments (metrics on), reads the per-rank {"event": "memory"} records rank
# 0 wrote, and compares each rank's every category with ranks[r].memory of `tycho check --json
# --world RANKS` for the same plan and arguments: within 5% or 64 KiB. With --async-checkpoint
# the run saves with checkpoint.async and the snapshot's category is compared too. Then the two
# accountings of check's bill: each rank's model states (ranks[r].model_states: params, grads and
# optimizer kept between steps) must equal, byte for byte, what the allocator holds in those
# categories after the last step (the record's "held"), and its transient buffers
# (ranks[r].transient: params, grads, comm) the record's peak less what is held, within the bound
# of the peaks.
# usage: run_bill.sh RANKS MPIEXEC NUMPROC_FLAG TYCHO PLAN [--async-checkpoint] [--set path=value]...
set -u
ranks=$1 mpiexec=$2 np=$3 tycho=$4 plan=$5
shift 5
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
# --async-checkpoint: checkpoint.async into a folder of the test's own, every 2 steps (the
# snapshot is the "checkpoint" category)
args=()
for a in "$@"; do
  if [ "$a" = --async-checkpoint ]; then
    args+=(--set checkpoint.dir="$tmp/ck" --set checkpoint.async=true --set checkpoint.every=2)
  else
    args+=("$a")
  fi
done
set -- "${args[@]}"
fail() { echo "--- stdout"; cat "$tmp/out" 2>/dev/null; echo "--- stderr"; cat "$tmp/err" 2>/dev/null; echo "FAIL: $*"; exit 1; }

timeout 240 "$mpiexec" "$np" "$ranks" "$tycho" run "$plan" "$@" --set log.metrics="$tmp/m.jsonl" \
  >"$tmp/out" 2>"$tmp/err" || fail "tycho run failed"
"$tycho" check "$plan" --world "$ranks" --json "$@" >"$tmp/check.json" 2>"$tmp/err" || fail "tycho check failed"
[ "$(grep -c '"event": "memory"' "$tmp/m.jsonl")" -eq "$ranks" ] || fail "expected $ranks memory records"
worst=0
for ((r = 0; r < ranks; r++)); do
  measured=$(grep -o "\"event\": \"memory\", \"rank\": $r, \"peak\": {[^}]*}" "$tmp/m.jsonl")
  predicted=$(grep -o "\"rank\":$r,\"tp\":[^]]*\],\"groups\":{[^}]*},\"memory\":{[^}]*}" "$tmp/check.json")
  [ -n "$measured" ] && [ -n "$predicted" ] || fail "rank $r: no measured or predicted bill"
  categories="params grads optimizer activations comm workspace total"
  grep -q '"workspace":[0-9]*,"checkpoint":' "$tmp/check.json" && categories="$categories checkpoint"
  for c in $categories; do
    m=$(printf '%s' "$measured" | grep -o "\"$c\": [0-9]*" | grep -o '[0-9]*$')
    p=$(printf '%s' "$predicted" | grep -o "\"memory\":{.*" | grep -o "\"$c\":[0-9]*" | grep -o '[0-9]*$')
    [ -n "$m" ] && [ -n "$p" ] || fail "rank $r: $c missing (measured '$m', predicted '$p')"
    verdict=$(awk -v m="$m" -v p="$p" 'BEGIN { d = m - p; if (d < 0) d = -d;
      r = m > 0 ? d / m : 0; printf "%s %.6f", (d <= 65536 || d <= 0.05 * m) ? "ok" : "bad", r }')
    set -- $verdict
    [ "$1" = ok ] || fail "rank $r: $c measured $m B, predicted $p B"
    worst=$(awk -v a="$worst" -v b="$2" 'BEGIN { print (b > a ? b : a) }')
  done
  held=$(grep -o "\"event\": \"memory\", \"rank\": $r, .*\"held\": {[^}]*}" "$tmp/m.jsonl" | grep -o '"held": {.*')
  states=$(grep -o "\"rank\":$r,\"tp\":.*" "$tmp/check.json" | grep -o '"model_states":{[^}]*}' | head -n 1)
  transient=$(grep -o "\"rank\":$r,\"tp\":.*" "$tmp/check.json" | grep -o '"transient":{[^}]*}' | head -n 1)
  [ -n "$held" ] && [ -n "$states" ] && [ -n "$transient" ] || fail "rank $r: no held bytes, model states or transient buffers"
  value() { printf '%s' "$1" | grep -o "\"$2\": *[0-9]*" | grep -o '[0-9]*$'; }
  for c in params grads optimizer; do
    h=$(value "$held" $c) p=$(value "$states" $c)
    [ -n "$h" ] && [ -n "$p" ] || fail "rank $r: model states' $c missing (held '$h', predicted '$p')"
    [ "$h" -eq "$p" ] || fail "rank $r: model states' $c: the run holds $h B between steps, check predicts $p B"
  done
  for c in params grads comm; do
    m=$(printf '%s' "$measured" | grep -o "\"$c\": [0-9]*" | grep -o '[0-9]*$')
    h=$(value "$held" $c) p=$(value "$transient" $c)
    [ -n "$m" ] && [ -n "$h" ] && [ -n "$p" ] || fail "rank $r: transient $c missing"
    awk -v m="$((m - h))" -v p="$p" 'BEGIN { d = m - p; if (d < 0) d = -d; exit !(d <= 65536 || d <= 0.05 * m) }' ||
      fail "rank $r: transient $c: the run's peak less what it holds is $((m - h)) B, check predicts $p B"
  done
done
echo "memory bill of $ranks ranks: every category within 5% or 64 KiB of the prediction (worst $(awk -v w="$worst" 'BEGIN { printf "%.3f%%", 100 * w }')); model states held between steps equal to the byte, transient buffers within the same bound"
