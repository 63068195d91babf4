#!/usr/bin/env bash
# `tycho check` and `tycho tune` with expert parallelism (mesh.ep, docs/moe.md "Expert
# parallelism"), against figures worked out by hand from the runtime's contract:
#  - plans/tiny_moe.lua on 4 ranks with ep 2 (sparse layers 1 and 3, 4 experts, top 2, dim 128,
#    micro 8, seq 32, capacity ceil(1.25 · 32 · 2 / 4) = 20, one micro-batch per step at dp 4):
#    the ep groups {0, 1} and {2, 3}; per sparse layer and micro-batch 4 all-to-alls of
#    4 experts × 8 × 20 rows × 128 = 81920 elements each from a rank ("exact"); a step's ep
#    traffic 2 layers × 4 = 8 calls of those; dropless: 8 · 32 · 2 · 128 = 65536 elements each
#    and a row-count exchange of 4 experts × 4 bytes = 16, 10 calls a step ("exact in total");
#  - the cost on a cluster prints the ep comm on the intra-node link;
#  - plans/mixtral_8x7b.lua checks cleanly on 256 H200s and every rank fits with ≥ 20% headroom
#    (its comment says 35%; in the bf16 mode's sizes it does not fit 80 GB GPUs), with ep groups
#    of 8 consecutive ranks and 512 all-to-alls a step on pp rank 0 (1 layer × 128 micro-batches
#    × 4) of 8 × 1280 × 4096 elements each, moved as bf16 (a bf16 model's rows travel in bf16);
#  - the experts' state is sharded over ep: on tiny_moe at ep 2 × dp 4 the edp groups {0, 2},
#    {1, 3} hold the experts' reductions; Mixtral's model states at ep 8 under ZeRO 1 are below
#    those at ep 1, and on 64 ranks the layouts tune finds that fit all shard the experts;
#  - tune lists layouts of a MoE plan and writes mesh.ep into the plan it picks, which checks.
# usage: check_moe_ep.sh TYCHO   (run from the source folder)
set -u
tycho=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }
eb=4
"$tycho" --version | grep -q "float64 kernels" && eb=8

"$tycho" check plans/tiny_moe.lua --world 4 --set mesh.ep=2 >"$tmp/t.txt" 2>&1 || fail "tiny_moe ep 2: $(cat "$tmp/t.txt")"
grep -q '^mesh       4 ranks = tp 1 × pp 1 × dp 4 (dp "auto"), ep 2 inside dp;' "$tmp/t.txt" || fail "mesh line"
grep -q '^           ep groups: 2 of 2 ranks, e.g. {0, 1}: ep consecutive dp ranks of each dp group (ep rank = dp % 2); each holds 2 of the 4 experts of every sparse layer$' "$tmp/t.txt" ||
  fail "ep groups line: $(grep 'ep groups' "$tmp/t.txt")"
grep -q '^all-to-all per sparse layer and micro-batch of 8 × 32 tokens on each ep group of 2 ranks' "$tmp/t.txt" || fail "all-to-all block"
grep -q '^           layers 1, 3, each fwd  dispatch .*4 experts × 8 sequences × capacity 20 rows × dim 128, padded$' "$tmp/t.txt" || fail "dispatch line"
grep -q '^           4 all-to-all calls, .* per sparse layer and micro-batch: exact$' "$tmp/t.txt" || fail "all-to-all total"
grep -q '^           pp rank 0, ep    8 all-to-all ' "$tmp/t.txt" || fail "ep traffic: $(grep 'pp rank 0' "$tmp/t.txt")"
grep -q 'expert parallelism: ep 2, a rank holds and computes 2 of the 4 experts for its ep group.s tokens (their parameters, gradients and AdamW state are its own, reduced over the 2 dp ranks holding the same experts)$' "$tmp/t.txt" || fail "moe line"
"$tycho" check plans/tiny_moe.lua --world 4 | grep -q 'ep groups' && fail "ep groups printed at ep 1"

# the JSON: the same figures to the byte
json() { # json ARGS... -> "ep_all_to_all rows / traffic" as numbers
  "$tycho" check "$@" --json | perl -MJSON::PP -e '
    local $/; my $d = decode_json(<STDIN>); my $x = $d->{ep_all_to_all};
    my $t = $d->{traffic_per_step}[0]{ep}{"all-to-all"};
    my $layers = join ",", map { "$_->{layer}:$_->{calls}:$_->{bytes}" } @{$x->{layers}};
    print join(" ", $x->{rows}{calls}, $x->{rows}{elements_each}, $x->{rows}{bytes_each}, $x->{count_exchange}{calls},
               $x->{count_exchange}{bytes}, $x->{exact}, $t->{calls}, $t->{bytes}, join(";", map { join ",", @$_ } @{$d->{groups}{ep}}),
               $layers), "\n";'
}
got=$(json plans/tiny_moe.lua --world 4 --set mesh.ep=2)
rows=$((81920 * eb))
want="4 81920 $rows 0 0 exact 8 $((8 * rows)) 0,1;2,3 1:4:$((4 * rows)),3:4:$((4 * rows))"
[ "$got" = "$want" ] || fail "capacity JSON: got '$got', want '$want'"
got=$(json plans/tiny_moe.lua --world 4 --set mesh.ep=2 --set model.moe.capacity_factor=0)
rows=$((65536 * eb))
want="4 65536 $rows 1 16 exact in total; per-peer split follows the routing 10 $((2 * (4 * rows + 16))) 0,1;2,3 1:5:$((4 * rows + 16)),3:5:$((4 * rows + 16))"
[ "$got" = "$want" ] || fail "dropless JSON: got '$got', want '$want'"

"$tycho" check plans/tiny_moe.lua --world 4 --set mesh.ep=2 --cluster plans/clusters/h100_80g_ib.lua >"$tmp/c.txt" 2>&1 || fail "cost: $(cat "$tmp/c.txt")"
grep -q '^           ep comm [0-9.]* s exposed (all-to-all on the intra-node link, not overlapped)$' "$tmp/c.txt" || fail "ep comm line"

# the comm layer's records of a real step on 4 ranks (ep 2) against check's ep traffic: at capacity
# every rank's equal to check's; dropless every rank's calls, and the bytes summed over the ranks
# (each rank sends back what it received, as the routing spread it: check gives the mean)
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
  cat >"$tmp/count.lua" <<'LUA'
loss = t:step(1)
n, b = 0, 0
for _, r in ipairs(t:comm(1000).records) do if r.group == "ep" and r.step == 0 then n = n + 1; b = b + r.bytes end end
print(string.format("ep step 0: %d %d", n, b))
LUA
  for cf in 1.25 0; do
    # dropless with 8 experts: the row counts (one int32 per expert of each peer, 32 bytes) differ
    # from one number per peer
    sets="--set mesh.ep=2 --set model.moe.capacity_factor=$cf --set train.eval_every=0"
    [ "$cf" = 0 ] && sets="$sets --set model.moe.experts=8"
    # shellcheck disable=SC2086
    want=$("$tycho" check plans/tiny_moe.lua --world 4 $sets --json | perl -MJSON::PP -e '
      local $/; my $t = decode_json(<STDIN>)->{traffic_per_step}[0]{ep}{"all-to-all"}; print "$t->{calls} $t->{bytes}\n"')
    # shellcheck disable=SC2086
    timeout 120 mpirun -np 4 "$tycho" repl plans/tiny_moe.lua "$tmp/count.lua" $sets >"$tmp/run.txt" 2>&1 ||
      { fail "capacity_factor $cf: the run failed: $(tail -5 "$tmp/run.txt")"; continue; }
    got=$(perl -ne 'if (/^\[([0-9-]+)\] ep step 0: (\d+) (\d+)/) { my ($r, $n, $b) = ($1, $2, $3);
        my $k = $r =~ /^(\d+)-(\d+)$/ ? $2 - $1 + 1 : 1; $ranks += $k; $calls{$n} = 1; $sum += $k * $b;
        $each{$b} = 1 } END { print $ranks, " ", join(",", sort keys %calls), " ", $sum, " ", scalar(keys %each), "\n" }' "$tmp/run.txt")
    set -- $want
    if [ "$cf" = 0 ]; then
      [ "$got" = "4 $1 $((4 * $2)) $(echo "$got" | cut -d' ' -f4)" ] || fail "dropless: runs' '$got' (ranks calls sum), check's '$want'"
    else
      [ "$got" = "4 $1 $((4 * $2)) 1" ] || fail "capacity: runs' '$got' (ranks calls sum distinct), check's '$want' on every rank"
    fi
  done
fi

# the shipped Mixtral plan, laid out for 64 80-GB H100s: it fits with 10% headroom on every rank
"$tycho" check plans/mixtral_8x7b.lua --world 64 --cluster plans/clusters/h100_80g_ib.lua >"$tmp/m.txt" 2>&1 || fail "mixtral: $(cat "$tmp/m.txt")"
grep -q 'every rank fits with at least 10% headroom' "$tmp/m.txt" || fail "mixtral does not fit with headroom: $(grep 'device memory' "$tmp/m.txt")"
grep -q '^           ep groups: 16 of 4 ranks, e.g. {0..3}' "$tmp/m.txt" || fail "mixtral ep groups"
# 256 micro-batches × 2 sparse layers × 4 all-to-alls of 8 experts × 1280 rows × 4096 × 2 bytes
grep -q '^           pp rank 0, ep    2048 all-to-all 160.0 GiB$' "$tmp/m.txt" || fail "mixtral ep traffic: $(grep 'pp rank 0, ep' "$tmp/m.txt")"
head=$("$tycho" check plans/mixtral_8x7b.lua --world 64 --cluster plans/clusters/h100_80g_ib.lua --json |
  perl -MJSON::PP -e 'local $/; my $d = decode_json(<STDIN>); my $t = $d->{traffic_per_step}[0]{ep}{"all-to-all"};
    print "$d->{memory}{fits} ", ($d->{memory}{min_headroom} >= 0.10 ? "roomy" : "tight $d->{memory}{min_headroom}"),
    " $t->{calls} $t->{bytes}\n"')
[ "$head" = "1 roomy 2048 $((2048 * 8 * 1280 * 4096 * 2))" ] || fail "mixtral JSON: $head"
# on 48 ranks its 16 stages leave dp 3, which ep 4 does not divide: refused, saying so
"$tycho" check plans/mixtral_8x7b.lua --world 48 >/dev/null 2>"$tmp/err" && fail "mixtral on 48 ranks compiled"
grep -q '^tycho: plan error: plans/mixtral_8x7b.lua:[0-9]*: mesh.ep = 4 does not divide mesh.dp = 3 (dp "auto" = world 48 / (tp 1 × pp 16))' "$tmp/err" ||
  fail "mixtral on 48 ranks: $(cat "$tmp/err")"
# NeMo's layout of it (tp 1, pp 4, virtual 8, ep 8; dp 8 without --world), the whole attention
# recomputed: a bf16 model's sparse layers keep their
# expert rows in bf16 — a one-layer slot's 10,240 received rows × (4096 + 3 × 14336: the inputs,
# gate, up, SwiGLU's output) and 8,192 outputs × 4096 at 2 bytes, 1.03 GB of its 1.24 GB — so pp
# rank 0's 56 slots (each stage's most in flight) bill 72.8 GiB, 141.2 GiB with those rows in fp32
# (the float64 build bills the GPU plan's bf16 buffers at the GPU's 2 bytes too, not as halves of
# its own 8-byte reals: the same figure)
"$tycho" check plans/mixtral_8x7b.lua --set schedule.kind=interleaved --set virtual_stages=8 --set mesh.ep=8 \
  --set mesh.pp=4 --set 'recompute={"attn"}' >"$tmp/nemo.txt" 2>&1 || fail "mixtral at NeMo's layout: $(cat "$tmp/nemo.txt")"
grep -Eq '^         0  0,4,8,12,16,20,24,28 +3\.5 GiB +7\.0 GiB +16\.4 GiB +72\.8 GiB ' "$tmp/nemo.txt" ||
  fail "mixtral at NeMo's layout, pp rank 0: $(grep '^         0  ' "$tmp/nemo.txt")"
grep -q "a sparse layer's expert rows (inputs, gate, up, SwiGLU's output, outputs) in bf16" "$tmp/nemo.txt" ||
  fail "mixtral at NeMo's layout: the bill does not say the expert rows are bf16"

# the experts' state over ep: edp groups, the expert buckets' traffic on them, smaller model states
grep -q '^           edp groups: 2 of 2 ranks, e.g. {0, 2}: the dp ranks holding the same experts (dp % 2 equal); the experts. gradients reduce there$' "$tmp/t.txt" ||
  fail "edp groups line: $(grep 'edp groups' "$tmp/t.txt")"
grep -q '^           pp rank 0, edp   2 all-reduce ' "$tmp/t.txt" || fail "edp traffic: $(grep 'pp rank 0, edp' "$tmp/t.txt")"
edp=$("$tycho" check plans/tiny_moe.lua --world 4 --set mesh.ep=2 --json |
  perl -MJSON::PP -e 'local $/; my $d = decode_json(<STDIN>); print join(" ", map { join(",", @$_) } @{$d->{groups}{edp}}), "\n"')
[ "$edp" = "0,2 1,3" ] || fail "JSON groups.edp: $edp"
# 2 sparse layers × 4 experts × 3 weights × 128 × 192 = 589,824 expert parameters; ep 2 holds half
grep -q '^           expert parameters per rank: at most 294,912 of the model.s 589,824 (pp rank 0: 2 of the 4 experts of each sparse layer on its stages)$' "$tmp/t.txt" ||
  fail "expert shard line: $(grep 'expert parameters' "$tmp/t.txt")"
states() { # the model states of pp rank 0's first rank in bytes
  "$tycho" check plans/mixtral_8x7b.lua --world 64 "$@" --json |
    perl -MJSON::PP -e 'local $/; my $d = decode_json(<STDIN>); print $d->{ranks}[0]{model_states}{total}, "\n"'
}
# an expert parameter costs a rank 2 + 4 + 12 / 4 = 9 bytes at ep 1 (its bf16 copy, fp32
# gradient, and master and moments sharded over dp 4) and (2 + 4 + 12) / 4 = 4.5 at ep 4 (a
# quarter of the experts, their state on no other rank): half, and the dense rest the same
s4=$(states) s1=$(states --set mesh.ep=1)
perl -e "exit !($s4 > 0.5 * $s1 && $s4 < 0.55 * $s1)" || fail "mixtral zero 1: model states $s4 B at ep 4, $s1 B at ep 1"
echo "mixtral zero 1, pp rank 0: model states $s4 B at ep 4, $s1 B at ep 1"
"$tycho" tune plans/mixtral_8x7b.lua --world 64 --cluster plans/clusters/h200_141g_ib.lua --out "$tmp/m64.lua" >"$tmp/tune64.txt" 2>&1 ||
  fail "tune mixtral on 64 ranks: $(cat "$tmp/tune64.txt")"
# the fastest layouts that fit on 141-GB GPUs: with the expert rows in bf16, dp 64 with the
# experts over ep 8 under ZeRO 3 (the fastest, 113.6 GiB), pp 2 × dp 32 close behind; a line
# omits ep 1, and the list must show a layout sharding the experts (ep 2, 4 or 8)
grep -Eq '^ 1\. tp 1 pp [0-9]+ v [0-9]+ dp [0-9]+(,| ep [248],) ' "$tmp/tune64.txt" || fail "tune mixtral on 64 ranks: $(cat "$tmp/tune64.txt")"
grep -Eq '^ [0-9]+\. tp 1 pp [0-9]+ v [0-9]+ dp [0-9]+ ep [248], ' "$tmp/tune64.txt" ||
  fail "tune mixtral on 64 ranks lists no layout with the experts sharded: $(cat "$tmp/tune64.txt")"

# tune: a MoE plan's layouts, the pick's mesh.ep written into the plan, which checks
"$tycho" tune plans/tiny_moe.lua --world 4 --cluster plans/clusters/h100_80g_ib.lua --out "$tmp/tuned.lua" >"$tmp/tune.txt" 2>&1 ||
  fail "tune: $(cat "$tmp/tune.txt")"
grep -q '^ 1\. tp 1 ' "$tmp/tune.txt" || fail "tune lists no tp 1 layout: $(cat "$tmp/tune.txt")"
grep -Eq '^  mesh = \{ tp = 1, pp = [0-9]+, dp = "auto", ep = [124] \},$' "$tmp/tuned.lua" || fail "tuned plan: $(cat "$tmp/tuned.lua")"
cp plans/tiny_moe.lua "$tmp/" # the tuned plan requires its base by name, next to it
"$tycho" check "$tmp/tuned.lua" --world 4 >/dev/null 2>"$tmp/err" || fail "the tuned plan does not check: $(cat "$tmp/err")"

[ "$failed" = 0 ] && echo "ok check_moe_ep"
exit "$failed"
