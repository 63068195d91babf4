#!/usr/bin/env bash
# mesh.cp (context parallelism): what it does not compose with yet is refused by name, exit code 2,
# before any step — by `tycho run` under mpirun (bf16 compute, a sparse model, zb-h1), and, with run's
# reason, by `tycho check` and `rehearse`, which price and run every cp layout run trains (check's
# figures for one are printed: the axis, the ring's traffic, its overlap in the step time).
# usage: run_cp_refusals.sh MPIEXEC NUMPROC_FLAG TYCHO   (run from the source folder)
set -u
mpiexec=$1 np=$2 tycho=$3
plan=tests/plans/good/dp_small.lua
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
composes='context parallelism composes with dp (ZeRO 0-3), tp (with sequence parallelism), pp, dropout and recompute so far'
expect() { # expect RANKS TEXT ARGS...: `tycho run` on RANKS ranks exits 2 with TEXT on stderr, no step
  local ranks=$1 text=$2
  shift 2
  timeout 240 "$mpiexec" "$np" "$ranks" "$tycho" run "$plan" --set train.steps=2 "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  [ "$rc" -eq 2 ] || { cat "$tmp/out" "$tmp/err"; echo "FAIL: run $* on $ranks ranks exited $rc, expected 2"; exit 1; }
  grep -qF -- "$text" "$tmp/err" || { cat "$tmp/err"; echo "FAIL: run $*: stderr lacks '$text'"; exit 1; }
  ! grep -q '^step ' "$tmp/out" || { echo "FAIL: run $* trained a step"; exit 1; }
}
expect 2 'tycho: plan error: --set mesh.cp=2: mesh.cp = 2 with precision.compute = "bf16": the ring'"'"'s attention computes in fp32 only; set precision.compute = "fp32" or mesh.cp = 1' \
  --set mesh.cp=2 --set precision.compute=bf16
expect 2 "mesh.cp = 2 with model.moe (4 experts): $composes; the routing's capacity counts a rank's tokens" \
  --set mesh.cp=2 --set model.moe.experts=4 --set model.moe.top_k=2 --set model.moe.ffn_dim=32
expect 4 "mesh.cp = 2 with schedule.kind = \"zb-h1\": $composes, under whole backwards" \
  --set mesh.cp=2 --set mesh.pp=2 --set schedule.kind=zb-h1 --set batch.micro=1
# a sequence shorter than its 2 · cp chunks: the plan error names the largest cp that fits
expect 2 "mesh.cp = 2: batch.seq = 3 is shorter than the 2 × cp = 4 chunks context parallelism cuts each sequence into (each of at least one token); use cp ≤ 1" \
  --set mesh.cp=2 --set batch.seq=3
# check and rehearse: what run refuses under cp, refused by name with run's own reason, exit 2
bf16='mesh.cp = 2 with precision.compute = "bf16": the ring'"'"'s attention computes in fp32 only; set precision.compute = "fp32" or mesh.cp = 1'
"$tycho" check "$plan" --world 2 --set mesh.cp=2 --set precision.compute=bf16 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 2 ] || { cat "$tmp/out" "$tmp/err"; echo "FAIL: check with mesh.cp=2 and bf16 exited $rc, expected 2"; exit 1; }
grep -qF "tycho check: --set mesh.cp=2: $bf16" "$tmp/err" || { cat "$tmp/err"; echo "FAIL: check with mesh.cp=2 and bf16 does not say why"; exit 1; }
# (rehearse takes a sparse model: a bf16 plan it rehearses in fp32 in the float64 build, which runs)
"$tycho" rehearse "$plan" --world 2 --launcher "$mpiexec --oversubscribe $np {n}" --set mesh.cp=2 \
  --set model.moe.experts=4 --set model.moe.top_k=2 --set model.moe.ffn_dim=32 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 2 ] || { cat "$tmp/out" "$tmp/err"; echo "FAIL: rehearse with mesh.cp=2 and model.moe exited $rc, expected 2"; exit 1; }
grep -qF "mesh.cp = 2 with model.moe (4 experts): $composes; the routing's capacity counts a rank's tokens" "$tmp/err" "$tmp/out" ||
  { cat "$tmp/out" "$tmp/err"; echo "FAIL: rehearse with mesh.cp=2 and model.moe does not say why"; exit 1; }
# and what run trains, check prices: the cp axis, the ring's traffic and its overlap
"$tycho" check "$plan" --world 2 --set mesh.cp=2 --cluster plans/clusters/h100_80g_ib.lua >"$tmp/out" 2>"$tmp/err" ||
  { cat "$tmp/out" "$tmp/err"; echo "FAIL: check with mesh.cp=2 failed"; exit 1; }
for want in '^mesh +2 ranks = tp 1 × cp 2 × pp 1 × dp 1' '^ +pp rank 0, cp +[0-9]+ send [0-9.]+ KiB; [0-9]+ recv' \
            '^ +cp ring [0-9.]+ s exposed of [0-9.]+ s of transfers'; do
  grep -Eq -- "$want" "$tmp/out" || { cat "$tmp/out"; echo "FAIL: check with mesh.cp=2: no line matching /$want/"; exit 1; }
done
echo "ok: cp refusals"
