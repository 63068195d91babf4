#!/usr/bin/env bash
# `tycho calibrate`: its refusals (exit 2, naming the cause), and a short run under mpirun that
# writes a cluster file which loads with `check --cluster`, states what it measured in its header,
# and whose figures are positive and agree with each other and with the step-time model: the
# file's gpus_per_node is this machine's online cores, efficiency.compute is the plan's linears'
# rate over the sgemm peak as the header states them, and the model's serial step on the file
# (less the optimizer) is the serial forward and backward the header says was measured — the
# pointwise figure is what makes them equal (host/drive/calibrate.h).
# usage: calibrate.sh TYCHO   (run from the source folder)
set -u
tycho=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cores=$(getconf _NPROCESSORS_ONLN)
fail() { echo "FAIL: $*"; exit 1; }
refused() { # refused TEXT COMMAND...: exit 2 with TEXT on stderr
  local text=$1 err rc
  shift
  err=$(timeout 240 "$@" 2>&1 >/dev/null)
  rc=$?
  [ "$rc" -eq 2 ] || fail "$*: exit $rc, expected 2 ($err)"
  case "$err" in *"$text"*) ;; *) fail "$*: '$err' lacks '$text'" ;; esac
}
refused "calibrate needs --out FILE" "$tycho" calibrate plans/tiny.lua
refused "unknown option '--world' for 'calibrate'" "$tycho" calibrate --out "$tmp/c.lua" --world 2
refused "--reps needs an integer in 1..1000" "$tycho" calibrate --out "$tmp/c.lua" --reps 0
refused "start it with 2 or more ranks" mpirun -np 1 "$tycho" calibrate --out "$tmp/c.lua"
refused "--launcher '/bin/true': write {n} where the rank count goes" "$tycho" calibrate --out "$tmp/c.lua" --launcher /bin/true
refused "precision.compute: calibrate measures the fp32 kernels" \
  mpirun -np 2 "$tycho" calibrate plans/tiny.lua --out "$tmp/c.lua" --set precision.compute=bf16
refused "ranks on $cores cores would share them" \
  mpirun -np $((cores + 1)) "$tycho" calibrate --out "$tmp/c.lua"
refused "plan error: " mpirun -np 2 "$tycho" calibrate plans/tiny.lua --out "$tmp/c.lua" --set model.dim=-1
[ ! -e "$tmp/c.lua" ] || fail "a refused calibrate wrote $tmp/c.lua"

out=$(timeout 300 mpirun -np 2 "$tycho" calibrate plans/tiny.lua --out "$tmp/c.lua" --reps 2 2>&1) ||
  fail "calibrate: $out"
case "$out" in *"wrote $tmp/c.lua"*) ;; *) fail "calibrate said: $out" ;; esac
f=$tmp/c.lua
for text in "Measured by \`tycho calibrate\`" "2 ranks of one thread under MPI" "best (shortest) of 2 repetitions" \
            "A device (\"GPU\" below) is one core" "Plan measured: plans/tiny.lua" "all-reduce" "all-gather" \
            "reduce-scatter" "ring fit" "-> peak_tflops" "-> overheads.pointwise_ns"; do
  grep -qF -- "$text" "$f" || fail "the header lacks '$text'"
done
field() { grep -v "^--" "$f" | sed -n "s/.*[ {]$1 = \([0-9.e+-]*\).*/\1/p" | head -1; }
[ "$(field gpus_per_node)" = "$cores" ] || fail "gpus_per_node $(field gpus_per_node), $cores cores online"
[ "$(field nodes)" = 1 ] || fail "nodes $(field nodes)"
for k in device_memory_gb peak_tflops bandwidth_gbs latency_us compute attention_tflops pointwise_ns optimizer_ns; do
  v=$(field $k)
  awk -v v="$v" 'BEGIN { exit !(v + 0 > 0) }' || fail "$k = '$v' is not positive"
done
# efficiency.compute = linears / the 1024^3 rate, at most 1, from the header's figures (GFLOP/s, 2 decimals)
peak=$(sed -n 's/.*sgemm 1024 x 1024 x 1024 (linear_forward): \([0-9.]*\) GFLOP.*/\1/p' "$f")
lin=$(sed -n "s/.*the plan's linears, forward and backward: \([0-9.]*\) GFLOP.*/\1/p" "$f")
awk -v p="$peak" -v l="$lin" -v e="$(field compute)" 'BEGIN { w = l / p; if (w > 1) w = 1;
  exit !(p > 0 && (e - w < 0.002 && w - e < 0.002)) }' || fail "efficiency.compute $(field compute), linears $lin / peak $peak"
# peak_tflops: the 1024^3 rate, or the linears' where those ran faster
awk -v p="$peak" -v l="$lin" -v t="$(field peak_tflops)" 'BEGIN { m = l > p ? l : p; d = t * 1000 / m - 1;
  exit !(d < 0.001 && d > -0.001) }' || fail "peak_tflops $(field peak_tflops), 1024^3 $peak, linears $lin GFLOP/s"
# the file loads, and the model's serial step less the optimizer is the measured forward + backward
json=$("$tycho" check plans/tiny.lua --world 1 --cluster "$f" --json) || fail "check --cluster $f"
num() { printf '%s' "$json" | grep -o "\"$1\":[^,}]*" | head -1 | cut -d: -f2; }
fb=$(sed -n 's/.*serial forward + backward of one step ([0-9]* micro-batches): \([0-9.]*\) ms.*/\1/p' "$f")
if grep -q CLAMPED "$f"; then
  echo "note: the pointwise figure was clamped (a disturbed machine); the identity is not checked"
else
  awk -v s="$(num step_seconds)" -v o="$(num optimizer_seconds)" -v fb="$fb" 'BEGIN {
    d = (s - o) * 1e3 / fb - 1; exit !(fb > 0 && d < 1e-5 && d > -1e-5) }' ||
    fail "model serial step $(num step_seconds) s less optimizer $(num optimizer_seconds) s vs measured $fb ms"
fi
awk -v r="$(num ranks_per_device)" 'BEGIN { exit !(r == 1) }' || fail "ranks_per_device $(num ranks_per_device) at world 1"
# more ranks than the file's cores: the model says they share the devices
json=$("$tycho" check plans/tiny.lua --world $((2 * cores)) --cluster "$f" --json) || fail "check --world $((2 * cores))"
awk -v r="$(num ranks_per_device)" 'BEGIN { exit !(r == 2) }' || fail "ranks_per_device $(num ranks_per_device) at world $((2 * cores))"
# an overheads field of the wrong kind is refused, naming it
sed 's/pointwise_ns = [0-9.e+-]*/pointwise_ns = -1/' "$f" >"$tmp/bad.lua"
refused "overheads.pointwise_ns: must be a positive, finite number" "$tycho" check plans/tiny.lua --cluster "$tmp/bad.lua"
grep -q "^  overlap = false," "$f" || fail "the file lacks overlap = false"
sed 's/overlap = false/overlap = 0/' "$f" >"$tmp/bad.lua"
refused "overlap: must be true or false" "$tycho" check plans/tiny.lua --cluster "$tmp/bad.lua"
grep -q "^    reduce_scatter = { bandwidth_gbs = " "$f" || fail "the file lacks the links' per-op figures"
sed '0,/all_gather = {/s/all_gather = {/all_gathers = {/' "$f" >"$tmp/bad.lua"
refused "intra_node.all_gathers: not a cluster field" "$tycho" check plans/tiny.lua --cluster "$tmp/bad.lua"
sed '0,/reduce_scatter = { bandwidth_gbs = [0-9.e+-]*/s/reduce_scatter = { bandwidth_gbs = [0-9.e+-]*/reduce_scatter = { bandwidth_gbs = 0/' "$f" >"$tmp/bad.lua"
refused "intra_node.reduce_scatter.bandwidth_gbs: must be a positive, finite number" "$tycho" check plans/tiny.lua --cluster "$tmp/bad.lua"
sed 's/optimizer_ns = /optimiser_ns = /' "$f" >"$tmp/bad.lua"
refused "overheads.optimiser_ns: not a cluster field" "$tycho" check plans/tiny.lua --cluster "$tmp/bad.lua"
# run by hand, calibrate starts one rank per online core itself (the default launcher)
out=$(timeout 300 "$tycho" calibrate plans/tiny.lua --out "$tmp/self.lua" --reps 1 2>&1) || fail "calibrate, self-launched: $out"
case "$out" in *"launch     mpirun "*"-np $cores "*" calibrate plans/tiny.lua --out $tmp/self.lua --reps 1 --worker"*) ;;
  *) fail "calibrate did not start its ranks: $out" ;; esac
case "$out" in *"wrote $tmp/self.lua"*) ;; *) fail "calibrate, self-launched, said: $out" ;; esac
grep -qF -- "$cores ranks of one thread under MPI" "$tmp/self.lua" || fail "the self-launched file lacks '$cores ranks of one thread under MPI'"
echo "ok: calibrate"
