#!/usr/bin/env bash
# `tycho rehearse`: a plan's layout at toy scale on CPU ranks against the serial run of the same
# shrunk model. CASE is one of
#   layouts  tiny.lua as tp 2 × pp 2 × dp 2 with sequence parallelism and ZeRO-1 (8 ranks), as
#            cp 2 × tp 2 with sequence parallelism (4 ranks), and
#            interleaved 1F1B on pp 2 × 2 virtual stages × dp 2 with dropout 0.1 (4 ranks), and
#            tiny_moe.lua's sparse layers at ep 2 and at pp 2 × dp 2 (ZeRO 2, dropout): all hold,
#            and the account names what was kept and shrunk (the experts' width with dim);
#   faults   a --fault in the layout's run only must fail the rehearsal, each where it should:
#            another model seed (initial weights differ), smaller buckets (the collectives differ
#            from check's), full recompute (the activation peak differs from check's bill);
#   refusals usage and plan errors exit 2 with the cause named, a launcher that cannot start 1;
#   PLAN RANKS  a shipped plan's whole layout (its own mesh, stages, splits, ZeRO, schedule).
# usage: rehearse.sh CASE MPIEXEC TYCHO [RANKS]   (run from the source folder)
set -u
case_=$1 mpiexec=$2 tycho=$3 ranks=${4:-}
launcher="$mpiexec --oversubscribe -np {n}"
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fail() { echo "--- output"; cat "$tmp/out" 2>/dev/null; echo "FAIL: $*"; exit 1; }
# run NAME CODE CMD...: CMD exits with CODE (its output in $tmp/out)
run() {
  local name=$1 code=$2; shift 2
  timeout 600 "$@" >"$tmp/out" 2>&1
  local rc=$?
  [ "$rc" -eq "$code" ] || fail "$name: exit $rc, expected $code"
}
has() { grep -Eq -- "$1" "$tmp/out" || fail "$2: no line matching /$1/"; }

case $case_ in
layouts)
  run tp2_pp2_dp2 0 "$tycho" rehearse plans/tiny.lua --world 8 --launcher "$launcher" --set mesh.tp=2 \
    --set mesh.pp=2 --set sequence_parallel=true --set zero=1
  has '^layout +tp 2 × pp 2 × dp 2 \(order tp, dp, pp\); 2 stages \(virtual 1\) under 1f1b; zero 1; sequence parallel on' tp2_pp2_dp2
  has '^shrunk +4 layers \(kept\), dim 32 \(128\), 8 heads / 4 kv \(kept\) of 4 \(16\), ffn 96 \(384\)' tp2_pp2_dp2
  has '^serial +initial parameters bitwise equal; worst relative difference: .*: ok$' tp2_pp2_dp2
  has "^traffic .* equal tycho check's prediction on every rank .*: ok$" tp2_pp2_dp2
  has "^memory .* equals tycho check's bill on every rank .*: ok$" tp2_pp2_dp2
  has '^verdict +the layout holds$' tp2_pp2_dp2
  grep '^serial' "$tmp/out"
  # context parallelism: each sequence over 2 cp ranks (the ring attention) with tp 2 and
  # sequence parallelism; the ring's messages on the cp group and its buffers in comm and
  # workspace are in the traffic and memory checks
  run cp2_tp2_sp 0 "$tycho" rehearse plans/tiny.lua --world 4 --launcher "$launcher" --set mesh.cp=2 \
    --set mesh.tp=2 --set sequence_parallel=true --set zero=1
  has '^layout +tp 2 × cp 2 × pp 1 × dp 1 \(order tp, cp, dp, pp\)' cp2_tp2_sp
  has '^serial +initial parameters bitwise equal; worst relative difference: .*: ok$' cp2_tp2_sp
  has "^traffic .* equal tycho check's prediction on every rank .*: ok$" cp2_tp2_sp
  has "^memory .* equals tycho check's bill on every rank .*: ok$" cp2_tp2_sp
  has '^verdict +the layout holds$' cp2_tp2_sp
  # sparse layers with expert parallelism: the experts shrink with dim, the serial run has no ep,
  # and the ep group's all-to-alls are in the traffic check, as are the experts' reductions and
  # gathers over the edp group (the 2 dp ranks holding the same experts): 20 on rank 0 = dp 3
  # all-reduce + 5 all-gather (3 buckets, the loss and norm sums), ep 8 all-to-all, edp 2 + 2
  run moe_ep 0 "$tycho" rehearse plans/tiny_moe.lua --world 4 --launcher "$launcher" --set mesh.ep=2 --set zero=1
  has '^serial +initial parameters bitwise equal; worst relative difference: .*: ok$' moe_ep
  has "^traffic .* equal tycho check's prediction on every rank \(20 on rank 0\): ok$" moe_ep
  has "^memory .* equals tycho check's bill on every rank .*: ok$" moe_ep
  has '^shrunk +4 layers \(kept\), dim 32 \(128\), .*, ffn 96 \(384\), 4 experts top 2 \(kept\) of ffn 48 \(192\), vocab 64 ' moe_ep
  has '^verdict +the layout holds$' moe_ep
  # sparse layers without ep (every rank holds every expert): pipeline stages, each with a sparse
  # layer, × dp 2 under ZeRO 2, dropout and capacity dropping on
  run moe_pp2_dp2 0 "$tycho" rehearse plans/tiny_moe.lua --world 4 --launcher "$launcher" --set mesh.pp=2 \
    --set zero=2 --set model.dropout=0.1
  has '^layout +tp 1 × pp 2 × dp 2 .*; zero 2;' moe_pp2_dp2
  has '^shrunk .*, 4 experts top 2 \(kept\) of ffn 48 \(192\), ' moe_pp2_dp2
  has '^serial +initial parameters bitwise equal; worst relative difference: .*: ok$' moe_pp2_dp2
  has "^traffic .* equal tycho check's prediction on every rank .*: ok$" moe_pp2_dp2
  has "^memory .* equals tycho check's bill on every rank .*: ok$" moe_pp2_dp2
  has '^verdict +the layout holds$' moe_pp2_dp2
  # a bf16 plan in bf16 compute with bf16 gradients (the plan's own): tensor parallel with
  # sequence parallelism and ZeRO 3 (each gathered unit's bf16 copies, the bf16 gradient shard),
  # within the bf16 bounds (5e-3 for weights with bf16 gradients, 3e-2 for the norm at tp > 1, whose
  # conversions move bf16), traffic and bill exact (the gradient reduce-scatters and the tp
  # conversions in 2-byte elements)
  if ! "$tycho" --version | grep -q "float64 kernels"; then
    run bf16_tp2_dp2_zero3 0 "$tycho" rehearse plans/tiny.lua --world 4 --launcher "$launcher" --set mesh.tp=2 \
      --set sequence_parallel=true --set zero=3 --set precision.compute=bf16 --set precision.grads=bf16
    has "^ +bf16 compute on the CPU runtime \\(the linears' products: .*, gradients in bf16, master in fp32" bf16_tp2_dp2_zero3
    has '^serial +initial parameters bitwise equal; .*bounds 0.001, 0.03, 0.005: ok$' bf16_tp2_dp2_zero3
    has "^traffic .* equal tycho check's prediction on every rank .*: ok$" bf16_tp2_dp2_zero3
    has "^memory .* equals tycho check's bill on every rank .*: ok$" bf16_tp2_dp2_zero3
    has '^verdict +the layout holds$' bf16_tp2_dp2_zero3
    grep '^serial' "$tmp/out"
  fi
  # the shrink's own options: head size, sequence and micro-batches as given
  run options 0 "$tycho" rehearse plans/tiny.lua --world 2 --launcher "$launcher" --set mesh.tp=2 \
    --set sequence_parallel=true --head-dim 2 --seq 16 --micro-batches 2 --steps 1
  has '^shrunk +4 layers \(kept\), dim 16 \(128\), 8 heads / 4 kv \(kept\) of 2 \(16\), ffn 48 \(384\), vocab 64 \(64\), seq 16 \(32\); 2 micro-batches of 8 per step per rank \(4\)' options
  has '^rehearse .* 1 step$' options
  has '^verdict +the layout holds$' options
  # the default launcher (mpirun from PATH) this time
  run interleaved 0 "$tycho" rehearse plans/tiny.lua --world 4 --set mesh.pp=2 --set virtual_stages=2 \
    --set schedule.kind=interleaved --set zero=1 --set model.dropout=0.1 --steps 4
  has '^launch +mpirun (--allow-run-as-root )?--oversubscribe -np 4 ' interleaved
  has '4 stages \(virtual 2\) under interleaved' interleaved
  has '^verdict +the layout holds$' interleaved
  grep '^serial' "$tmp/out"
  ;;
faults)
  base=("$tycho" rehearse plans/tiny.lua --world 2 --launcher "$launcher")
  run seed 1 "${base[@]}" --fault seeds.model=7
  has '^serial +initial parameters DIFFER; .*: FAILED$' seed
  has '^verdict +the rehearsal FAILED$' seed
  has '^tycho: the rehearsal failed after' seed
  run buckets 1 "${base[@]}" --fault bucket_mb=0.01
  has '^rank 0 \(pipeline rank 0\): dp all-reduce: [0-9]+ calls, [0-9]+ bytes in the last step; tycho check predicts 1 calls' buckets
  has "^traffic .* differ from tycho check's prediction .*: FAILED$" buckets
  has '^serial .*: ok$' buckets
  run recompute 1 "${base[@]}" --fault recompute=full
  has "^memory .* differs from tycho check's bill .*: FAILED$" recompute
  has '^rank 0 \(pipeline rank 0\): activations: peak [0-9]+ B, tycho check.s bill [0-9]+ B' recompute
  echo "each fault failed the rehearsal where it should"
  ;;
refusals)
  run no_world 2 "$tycho" rehearse plans/tiny.lua
  has '^tycho: plans/tiny.lua: mesh.dp is "auto": give the ranks to rehearse with --world N$' no_world
  run no_plan 2 "$tycho" rehearse
  has "^tycho: 'rehearse' needs a plan file" no_plan
  run bad_steps 2 "$tycho" rehearse plans/tiny.lua --world 2 --steps 65
  has '^tycho: --steps needs an integer in 1..64' bad_steps
  many=(); for i in $(seq 17); do many+=(--fault "seeds.model=$i"); done
  run too_many_faults 2 "$tycho" rehearse plans/tiny.lua --world 2 "${many[@]}"
  has '^tycho: rehearse takes at most 64 --set and 16 --fault arguments \(got 0 and 17\)' too_many_faults
  run odd_head 2 "$tycho" rehearse plans/tiny.lua --world 2 --launcher "$launcher" --head-dim 3
  has '^tycho: plan error: --head-dim 3: RoPE rotates pairs of elements; give an even head size' odd_head
  run launcher_count 2 "$tycho" rehearse plans/tiny.lua --world 2 --launcher "$mpiexec -np"
  has "^tycho: --launcher '.* -np': write \{n\} where the rank count goes" launcher_count
  run launcher_missing 1 "$tycho" rehearse plans/tiny.lua --world 2 --launcher "/nonexistent/mpirun -np {n}"
  has 'cannot run /nonexistent/mpirun: No such file or directory' launcher_missing
  run fault_mesh 2 "$tycho" rehearse plans/tiny.lua --world 2 --launcher "$launcher" --fault mesh.tp=2
  has '^tycho: plan error: a --fault may not change the mesh' fault_mesh
  run plan_error 2 "$tycho" rehearse plans/tiny.lua --world 2 --launcher "$launcher" --set mesh.tp=3
  has '^tycho: plan error: ' plan_error
  echo "every refusal named its cause"
  ;;
mixtral)
  # plans/mixtral_8x7b.lua's layout (dp 4 with the experts over ep 4, ZeRO 1, the attention's core
  # recomputed, bf16 with its experts' rows kept in bf16) on pp 4 of its 16 stages: at its 64 ranks
  # the shrunk model's processes (about 260 MB each, the serial run's 1.6 GB) outgrow a 24-GB machine
  plan=plans/mixtral_8x7b.lua
  run mixtral 0 "$tycho" rehearse "$plan" --world 16 --set mesh.pp=4 --launcher "$launcher"
  has '^layout +tp 1 × pp 4 × dp 4 \(order tp, dp, pp\); 4 stages \(virtual 1\) under 1f1b; zero 1; ' mixtral
  if "$tycho" --version | grep -q "float64 kernels"; then
    has "this build has no bf16" mixtral
  else
    has "^ +bf16 compute on the CPU runtime \\(the linears' products: " mixtral
  fi
  has "^traffic .* equal tycho check's prediction on every rank .*: ok$" mixtral
  has "^memory .* equals tycho check's bill on every rank .*: ok$" mixtral
  has '^verdict +the layout holds$' mixtral
  grep -E '^(layout|shrunk|serial|traffic|memory|rehearsed)' "$tmp/out"
  ;;
*)
  plan=$case_
  run "$plan" 0 "$tycho" rehearse "$plan" --world "$ranks" --launcher "$launcher"
  has '^verdict +the layout holds$' "$plan"
  # a bf16 plan is rehearsed in bf16 compute (the float64 build has no bf16: it says so)
  if grep -q 'compute = "bf16"' "$plan"; then
    if "$tycho" --version | grep -q "float64 kernels"; then
      has "this build has no bf16" "$plan"
    else
      has "^ +bf16 compute on the CPU runtime \\(the linears' products: " "$plan"
    fi
  fi
  grep -E '^(layout|shrunk|serial|traffic|memory|rehearsed)' "$tmp/out"
  ;;
esac
