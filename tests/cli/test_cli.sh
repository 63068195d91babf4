#!/usr/bin/env bash
# The command line as a user meets it: help (tycho --help, tycho COMMAND --help), version, exit codes, `check` output for the shipped
# plans at several world sizes, --json, --set, --unsafe, TYCHO_PATH and the sandbox's require.
# usage: test_cli.sh TYCHO   (run from the source folder)
set -u
tycho=$1
. "$(dirname "$0")/../lib/build.sh" "$tycho"
# Figures that scale with the element size (the float64 build holds and sends 8-byte reals).
if [ "$REAL_BYTES" -eq 8 ]; then act=256.0 bill='6\.1 MiB +6\.1 MiB +12\.3 MiB'; else act=128.0 bill='3\.1 MiB +3\.1 MiB +6\.1 MiB'; fi
passed=0 failed=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | head -n 20; }
# expect NAME CODE PATTERN CMD...: CMD exits with CODE and its stdout+stderr matches PATTERN (grep -E)
expect() {
  local name=$1 code=$2 pattern=$3; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -ne "$code" ]; then bad "$name (exit $rc, expected $code)" "$out"; return; fi
  if ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then bad "$name (no match for /$pattern/)" "$out"; return; fi
  ok "$name"
}

expect help 0 '^usage: tycho <command>' "$tycho" --help
expect version 0 '^tycho [0-9]+\.[0-9]+\.[0-9]+' "$tycho" --version
expect no_command 2 '^tycho: no command given' "$tycho"
expect unknown_command 2 "^tycho: unknown command 'trian'" "$tycho" trian plans/tiny.lua
expect unknown_option 2 "^tycho: unknown option '--wrold'" "$tycho" check plans/tiny.lua --wrold 8
expect missing_plan_arg 2 "^tycho: 'check' needs a plan file" "$tycho" check
expect bad_world 2 '^tycho: --world needs an integer' "$tycho" check plans/tiny.lua --world zero
expect missing_file 2 '^tycho: plan error: nothere.lua: cannot open' "$tycho" check nothere.lua
# tokenize: its usage and its options' values (the command itself: e2e.tokenize)
expect tokenize_help 0 'tokenize TOKENIZER FILE\.\.\. --out OUT\.bin' "$tycho" tokenize --help
expect tokenize_no_out 2 '^tycho: usage: tycho tokenize TOKENIZER FILE\.\.\. --out OUT\.bin' "$tycho" tokenize t.json a.txt
expect tokenize_threads_value 2 '^tycho: --threads needs a value' "$tycho" tokenize t.json a.txt --out o.bin --threads
expect tokenize_threads_range 2 '^tycho: --threads 0: give a whole number of threads, 1\.\.256' "$tycho" tokenize t.json a.txt --out o.bin --threads 0
expect tokenize_unknown_option 2 "^tycho: tokenize: unknown option '--eos'" "$tycho" tokenize t.json a.txt --out o.bin --eos
# --listen on an address other machines can reach only with --listen-public, and then with a warning
expect listen_public_refused 2 '^tycho: --listen 0\.0\.0\.0:4711: not a loopback address, so other machines could connect; give --listen-public too' "$tycho" run plans/tiny.lua --listen 0.0.0.0:4711 --set train.steps=1
expect listen_public_alone 2 '^tycho: --listen-public needs --listen HOST:PORT' "$tycho" run plans/tiny.lua --listen-public
port=$((20000 + $$ % 20000))
expect listen_public_warned 0 "^tycho: warning: --listen 0\.0\.0\.0:$port --listen-public: other machines can connect to this job" \
  bash -c 'cd "$1" && exec "$2" run "$3/plans/tiny.lua" --listen 0.0.0.0:"$4" --listen-public --set train.steps=1 --set train.eval_every=0' _ "$tmp" "$(readlink -f "$tycho")" "$PWD" "$port"
expect comm_backend_unknown 2 '^tycho: TYCHO_COMM_BACKEND="nccl": no such comm backend in this build \(it has "mpi"\)' env TYCHO_COMM_BACKEND=nccl "$tycho" run plans/tiny.lua

# Shipped plans at several world sizes: the numbers a user would work out by hand.
expect tiny_1 0 'batch +global 32 = micro 8 × 4 micro-batches × dp 1' "$tycho" check plans/tiny.lua
expect tiny_4 0 'mesh +4 ranks = tp 1 × pp 1 × dp 4' "$tycho" check plans/tiny.lua --world 4
expect 7b_8 0 'mesh +8 ranks = tp 2 × pp 1 × dp 4 \(dp "auto"\)' "$tycho" check plans/llama2_7b.lua --world 8
expect 7b_8_params 0 '6,738,415,616 parameters' "$tycho" check plans/llama2_7b.lua --world 8
expect 7b_1024 0 'global 1024 = micro 1 × 2 micro-batches × dp 512' "$tycho" check plans/llama2_7b.lua --world 1024
expect 70b_64_mesh 0 'tp groups: 8 of 8 ranks, e.g. \{0\.\.7\}' "$tycho" check plans/llama2_70b.lua --world 64
expect 70b_64_pp 0 'pp groups: 16 of 4 ranks, e.g. \{0, 16, 32, 48\}' "$tycho" check plans/llama2_70b.lua --world 64
expect 70b_64_stage3 0 '3 +3 +0 +layers 60-79 \+ final norm \+ head' "$tycho" check plans/llama2_70b.lua --world 64
expect 70b_64_rank63 0 '^ +63 +7 +1 +3 +3$' "$tycho" check plans/llama2_70b.lua --world 64
expect 70b_4096 0 '4084 more ranks' "$tycho" check plans/llama2_70b.lua --world 4096
expect 70b_timeline 0 'rank 3 \| \.    \.    \.    F0   B0' "$tycho" check plans/llama2_70b.lua --world 64
expect 70b_bubble 0 'peak in-flight micro-batches per rank: 4 3 2 1' "$tycho" check plans/llama2_70b.lua --world 64
expect 70b_world_not_multiple 2 'a world of 100 ranks is not a multiple of tp × pp = 8 × 4 = 32' \
  "$tycho" check plans/llama2_70b.lua --world 100

# --json: one document on stdout, nothing else there
if "$tycho" check plans/llama2_70b.lua --world 4096 --json >"$tmp/70b.json" 2>"$tmp/err"; then
  n=$(sed 's/.*"ranks":\[//' "$tmp/70b.json" | grep -o '{"rank":' | wc -l)
  if [ "$n" -eq 4096 ] && [ "$(head -c 11 "$tmp/70b.json")" = '{"schema":1' ] && [ ! -s "$tmp/err" ]; then
    ok json_4096_ranks
  else bad "json_4096_ranks ($n rank records)"; fi
else bad json_4096_ranks "$(cat "$tmp/err")"; fi
if command -v lua5.4 >/dev/null; then
  # a JSON document is also a Lua table constructor once ':' become '=' — good enough to prove
  # it is well formed (balanced, quoted, comma-separated) without a JSON library
  if "$tycho" check plans/tiny.lua --json | sed -e 's/"\([a-z_0-9]*\)":/["\1"]=/g' -e 's/\[/{/g; s/\]/}/g' \
      -e 's/{"\([a-z_0-9]*\)"}=/["\1"]=/g' -e 's/null/nil/g' | sed '1s/^/return /' >"$tmp/doc.lua" &&
     lua5.4 -e "local d = dofile('$tmp/doc.lua'); assert(d.plan.model.n_layers == 4 and d.world == 1 and #d.ranks == 1)"; then
    ok json_parses
  else bad json_parses "$(head -c 600 "$tmp/doc.lua")"; fi
fi

# --set: overrides change the compiled plan and its hash; bad ones are plan errors
h1=$("$tycho" check plans/tiny.lua | sed -n 's/^hash *//p')
h2=$("$tycho" check plans/tiny.lua --set optimizer.lr=0.002 | sed -n 's/^hash *//p')
h3=$("$tycho" check plans/tiny.lua | sed -n 's/^hash *//p')
if [ -n "$h1" ] && [ "$h1" = "$h3" ] && [ "$h1" != "$h2" ]; then ok hash_stable_and_sensitive
else bad "hash_stable_and_sensitive ($h1 $h2 $h3)"; fi
expect set_value 0 'optimizer +adamw lr 0.002' "$tycho" check plans/tiny.lua --set optimizer.lr=0.002
expect log_trace 0 '^log +progress every 100 steps, trace /tmp/t\.json \(the first 3 steps\)' \
  "$tycho" check plans/tiny.lua --set log.trace=/tmp/t.json --set log.trace_steps=3
expect set_list 0 'recompute +layers 0-3 +attn_core,mlp_act' "$tycho" check plans/tiny.lua --set recompute=attn_core,mlp_act
expect set_mesh 0 'mesh +4 ranks = tp 2 × pp 2 × dp 1' "$tycho" check plans/tiny.lua --set mesh.tp=2 --set mesh.pp=2 --world 4
# a value that starts with '{' is a Lua table constructor, run with no globals
expect set_table 0 '1 +1 +0 +layers 1-3 \+ final norm \+ head' "$tycho" check plans/tiny.lua --set mesh.pp=2 \
  --world 2 --set 'stages={{"embed",0},{1,2,3,"head"}}'
expect set_table_checked 2 '^tycho: plan error: --set stages=\{\{"embed",0\},\{2,3,"head"\}\}: stages\[2\]: layer 1 is missing' \
  "$tycho" check plans/tiny.lua --set mesh.pp=2 --world 2 --set 'stages={{"embed",0},{2,3,"head"}}'
expect set_table_syntax 2 "^tycho: plan error: --set stages=\\{\\{0\\}: a value that starts with '\\{' must be a Lua table constructor \\(--set:1: '\\}' expected" \
  "$tycho" check plans/tiny.lua --set 'stages={{0}'
expect set_table_no_globals 2 "attempt to index a nil value \\(global 'os'\\)" "$tycho" check plans/tiny.lua --set 'stages={os.exit(1)}'
# a constructor nested 60,000 deep is refused naming the limit (it said "C stack overflow"), its
# value named by its start and size; brackets inside strings do not count
deep=$(printf '%60000s' '' | tr ' ' '{')$(printf '%60000s' '' | tr ' ' '}')
expect set_table_nesting 2 "^tycho: plan error: --set model\\.x=\\{+\\.\\.\\. \\(120008 bytes\\): the table constructor nests 60000 levels deep; at most 100 levels of brackets \\(\\{, \\( and \\[ together\\) are read\$" \
  "$tycho" check plans/tiny.lua --set "model.x=$deep"
expect set_table_nesting_strings 2 "^tycho: plan error: --set stages=.*: stages: 2 entries, but pp 1" \
  "$tycho" check plans/tiny.lua --set "stages={\"$(printf '%300s' '' | tr ' ' '{')\", [[((((]]}"
# check says when this build's run would refuse a CPU plan it describes, and only then
expect run_refusal 0 'tycho run refuses this plan on this build: .*(precision.grads = "fp16": gradients are kept in fp32 or bf16|precision.compute = "bf16": this build)' \
  "$tycho" check plans/tiny.lua --set precision.compute=bf16 --set precision.grads=fp16 --world 2
if "$tycho" check plans/tiny.lua | grep -q 'refuses'; then bad run_refusal_none "a plan run accepts"; else ok run_refusal_none; fi
expect run_refusal_json 0 '"run_refusal":"([^"\\]|\\.)*(gradients are kept in fp32 or bf16|kernels have no bf16 compute)' \
  "$tycho" check plans/tiny.lua --set precision.compute=bf16 --set precision.grads=fp16 --world 2 --json
# a bf16 plan over tensor parallelism runs (where the build has bf16 kernels)
if "$tycho" check plans/tiny.lua --set precision.compute=bf16 --set mesh.tp=2 --world 2 | grep 'refuses' |
   grep -qv 'kernels have no bf16 compute'; then bad run_refusal_none_bf16_tp2 "a bf16 tp 2 plan is refused"
else ok run_refusal_none_bf16_tp2; fi
expect run_refusal_json_none 0 '"run_refusal":null' "$tycho" check plans/tiny.lua --json
# the cost model prices what the comm layer moves: on the CPU its reals, whatever the plan
# computes in, so a CPU bf16 plan's data-parallel bytes are the fp32 plan's
dpb() { "$tycho" check plans/tiny.lua --world 2 --set zero=1 --cluster plans/clusters/h100_80g_ib.lua --json "$@" |
  grep -o '"dp":{"intra_node":[a-z]*,"seconds":[^}]*"bytes_per_rank":[0-9]*' | grep -o '[0-9]*$'; }
b32=$(dpb) b16=$(dpb --set precision.compute=bf16)
if [ -n "$b32" ] && [ "$b32" = "$b16" ]; then ok cost_cpu_bf16_bytes; else bad cost_cpu_bf16_bytes "fp32 '$b32', bf16 '$b16'"; fi
expect set_bad_syntax 2 '^tycho: plan error: --set: "mesh.tp": expected path.to.field=value' "$tycho" check plans/tiny.lua --set mesh.tp

# The collectives tensor parallelism inserts, per module and micro-batch (tiny: 8 × 32 tokens of
# dim 128 in fp32 = 128 KiB per activation, 256 KiB in the float64 build). Megatron's pairing:
# one all-reduce per attention and one per MLP forward, their duals in backward; sequence
# parallelism turns each into a reduce-scatter and an all-gather.
out=$("$tycho" check plans/tiny.lua --set mesh.tp=2 --world 2 2>&1)
layer=$(printf '%s\n' "$out" | sed -n '/layers 0-3, each/,/^ *head /p' | sed '$d')
fwd_ar=$(printf '%s\n' "$layer" | grep -c 'fwd  all-reduce')
bwd_ar=$(printf '%s\n' "$layer" | grep -c 'bwd  all-reduce')
if [ "$fwd_ar" -eq 2 ] && [ "$bwd_ar" -eq 2 ] && [ "$(printf '%s\n' "$layer" | grep -c 'fwd  all-gather\|reduce-scatter')" -eq 0 ] &&
   printf '%s\n' "$layer" | grep -Eq "fwd  all-reduce +$act KiB  o -> residual" &&
   printf '%s\n' "$layer" | grep -Eq "fwd  all-reduce +$act KiB  down -> residual"; then ok tp_comm_megatron_pairing
else bad "tp_comm_megatron_pairing (fwd $fwd_ar, bwd $bwd_ar all-reduces per layer)" "$out"; fi
expect tp_comm_total 0 "tp comm +per micro-batch of 8 × 32 tokens on each tp group \\(activations in $REAL_BYTES-byte elements\\): forward 11 collectives" \
  "$tycho" check plans/tiny.lua --set mesh.tp=2 --world 2
expect tp_comm_sp 0 "fwd  reduce-scatter +$act KiB  o -> residual" "$tycho" check plans/tiny.lua --set mesh.tp=2 --set sequence_parallel=true --world 2
expect tp_comm_none 0 '^seeds' "$tycho" check plans/tiny.lua
if "$tycho" check plans/tiny.lua 2>&1 | grep -q '^tp comm'; then bad "tp_comm_absent_at_tp1"; else ok tp_comm_absent_at_tp1; fi
expect tp_comm_json 0 "\"tp_comm\":\\{\"micro_batch\":8,\"seq\":32,\"bytes_per_element\":$REAL_BYTES,\"forward\":\\{\"calls\":11,\"bytes\":$((1182720 / 4 * REAL_BYTES))\\}" \
  "$tycho" check plans/tiny.lua --set mesh.tp=2 --world 2 --json

# The memory bill, the cost on a cluster, tune.
expect bill_table 0 "^ +0 +0 +$bill " "$tycho" check plans/tiny.lua
expect bill_json 0 '"ranks":\[\{"rank":0,[^]]*\],"groups":\{[^}]*\},"memory":\{"params":[0-9]+,"grads":[0-9]+,"optimizer":[0-9]+,"activations":[0-9]+,"comm":[0-9]+,"workspace":[0-9]+,"total":[0-9]+\}' \
  "$tycho" check plans/tiny.lua --json
expect bill_70b_fits 0 'every rank fits with at least 10% headroom' "$tycho" check plans/llama2_70b.lua --world 64 --cluster plans/clusters/h100_80g_ib.lua
expect bill_7b_fits 0 'every rank fits with at least 10% headroom' "$tycho" check plans/llama2_7b.lua --world 8 --cluster plans/clusters/a100_80g_ib.lua
expect bill_too_big 0 'DOES NOT FIT' "$tycho" check plans/llama2_70b.lua --world 64 --set mesh.tp=1 --set mesh.pp=1 --set mesh.dp=64 --set sequence_parallel=false --cluster plans/clusters/h100_80g_ib.lua
expect cost_70b 0 '^time +on 8x H100-80G .*: [0-9.]+ s per step, [0-9]+ tokens/s, MFU [0-9.]+% of 989 TFLOPS' \
  "$tycho" check plans/llama2_70b.lua --world 64 --cluster plans/clusters/h100_80g_ib.lua
expect cost_json 0 '"cost":\{"cluster":"8x H200-141G[^"]*","cluster_file":"[^"]*","step_seconds":[0-9.e+-]+' \
  "$tycho" check plans/llama2_70b.lua --world 64 --json --cluster plans/clusters/h200_141g_ib.lua
expect traffic_pp 0 'pp rank 1, pp +1 all-gather 32 B; 1 broadcast 8 B; [0-9]+ send' "$tycho" check plans/llama2_70b.lua --world 64
printf 'return { name = "x", gpus_per_node = 8, device_memory_gb = 80, peak_tflops = 1,\n  intra_node = { bandwidth_gbs = 1, latency_us = 1 },\n  inter_node = { bandwith_gbs = 1, latency_us = 1 },\n  efficiency = { compute = 0.5, comm = 0.5 } }\n' >"$tmp/bad_cluster.lua"
expect cluster_bad_field 2 "^tycho: cluster error: .*bad_cluster.lua:3: inter_node.bandwith_gbs: not a cluster field" \
  "$tycho" check plans/tiny.lua --cluster "$tmp/bad_cluster.lua"
expect tune_needs_cluster 2 '^tycho: tune needs --cluster' "$tycho" tune plans/tiny.lua --world 8
expect tune_tiny 0 '^ 1\. tp [0-9] pp [0-9] v [12] dp [0-9]+' "$tycho" tune plans/tiny.lua --world 8 --cluster plans/clusters/a100_80g_ib.lua --out "$tmp/tiny_tuned.lua"
# the plan written is tune's best, or the fastest that tycho run runs, on its own line, where a
# zb-h1 layout the runtime does not run (MoE, ZeRO 2 and 3 with zero_every "micro_batch") is the best
if [ -s "$tmp/tiny_tuned.lua" ] && best=$("$tycho" tune plans/tiny.lua --world 8 --cluster plans/clusters/a100_80g_ib.lua --out "$tmp/tiny_tuned.lua" |
     sed -n 's/^\( 1\.\|written ([^)]*):\) tp \([0-9]*\) pp \([0-9]*\) .*/tp \2 × pp \3/p' | tail -n 1) &&
   "$tycho" check "$tmp/tiny_tuned.lua" --world 8 | grep -q "^mesh .*= $best × dp"; then ok tune_writes_a_plan_that_checks
else bad tune_writes_a_plan_that_checks "$(cat "$tmp/tiny_tuned.lua" 2>&1)"; fi
start=$(date +%s%N)
out=$("$tycho" tune plans/llama2_70b.lua --world 1024 --cluster plans/clusters/h100_80g_ib.lua --out "$tmp/70b_tuned.lua" 2>&1)
ms=$(( ($(date +%s%N) - start) / 1000000 ))
if printf '%s\n' "$out" | grep -q '^ 1\. tp' && "$tycho" check "$tmp/70b_tuned.lua" --world 1024 --cluster plans/clusters/h100_80g_ib.lua | grep -q 'every rank fits'; then
  ok "tune_70b_1024 (${ms} ms)"
else bad tune_70b_1024 "$out"; fi
# tune's search holds ZeRO 2 and 3 with pipeline stages, each with its zero_every choice
if printf '%s\n' "$out" | grep -Eq '^ *[0-9]+\. tp [0-9]+ pp ([2-9]|[1-9][0-9]+) .*zero [23] \(grads every'; then ok tune_zero_with_stages
else bad tune_zero_with_stages "$out"; fi

# device: which runtime the byte figures describe, said once (the "device" line, the JSON's
# "runtime" and "runtime_note"), not per section. The shipped GPU plans are device "cuda": the
# GPU runtime's (the CPU runtime's layout in fp32 elements, its bf16 mode the CPU's); --set device=cpu describes them on
# this build's CPU runtime; tiny is "auto", the CPU here. A cuda plan's fp32 elements are 4 bytes
# even in the float64 build (its tp comm below), a CPU plan's are the build's reals.
cuda_build= cuda_prefix='no CUDA backend in this build: '
"$tycho" --version | grep -q ', with the CUDA backend)' && cuda_build=1 cuda_prefix=
cuda_note="${cuda_prefix}the byte figures are the GPU runtime's: the CPU runtime's layout in fp32 elements \\(bf16 mode: bf16 copies of the weights and the linears' inputs, fp32 gradients, and the fp32 master weights with AdamW m and v as optimizer state\\); host memory billed apart"
cpu_note="the byte figures are this build's CPU runtime's \\($REAL_NAME kernels\\): what it allocates and what its comm layer moves"
out=$("$tycho" check plans/llama2_7b.lua --world 8 2>&1)
if printf '%s\n' "$out" | grep -Eq '^device +cuda$' && printf '%s\n' "$out" | grep -Eq "^ +$cuda_note\$" &&
   [ "$(printf '%s\n' "$out" | grep -c 'GPU runtime')" -eq 1 ] && ! printf '%s\n' "$out" | grep -q "this runtime's"; then
  ok device_cuda_said_once
else bad device_cuda_said_once "$out"; fi
out=$("$tycho" check plans/llama2_7b.lua --world 8 --set device=cpu 2>&1)
if printf '%s\n' "$out" | grep -Eq '^device +cpu$' && printf '%s\n' "$out" | grep -Eq "^ +$cpu_note\$" &&
   ! printf '%s\n' "$out" | grep -q 'GPU runtime'; then
  ok device_cpu_said_once
else bad device_cpu_said_once "$out"; fi
auto_why='\(no CUDA backend in this build\)' # with the backend: the driver's answer
[ -n "$cuda_build" ] && auto_why='(\(no CUDA device visible\)|here \([0-9]+ CUDA devices? visible: .*\))'
expect device_auto 0 "^device +auto → cpu $auto_why\$" "$tycho" check plans/tiny.lua
expect device_auto_note 0 "^ +$cpu_note\$" "$tycho" check plans/tiny.lua
expect device_json_cuda 0 "\"world\":8,\"runtime\":\"cuda\",\"runtime_note\":\"$cuda_note\",\"plan\":\\{.*\"precision\":\\{[^}]*\\},\"device\":\"cuda\"," \
  "$tycho" check plans/llama2_7b.lua --world 8 --json
expect device_json_cpu 0 "\"world\":64,\"runtime\":\"cpu\",\"runtime_note\":\"$cpu_note\",\"plan\":\\{.*\"device\":\"cpu\"," \
  "$tycho" check plans/llama2_70b.lua --world 64 --set device=cpu --json
if "$tycho" check plans/tiny.lua --json | grep -q '"device"'; then bad "device_json_absent_when_auto"
else ok device_json_absent_when_auto; fi
expect device_set_bad 2 '^tycho: plan error: --set device=gpu: device = "gpu": must be one of "auto", "cpu", "cuda" \(did you mean "cuda"\?' \
  "$tycho" check plans/tiny.lua --set device=gpu
expect device_cuda_tp_comm 0 'tp comm +per micro-batch of 8 × 32 tokens on each tp group \(activations in 4-byte elements\)' \
  "$tycho" check plans/tiny.lua --set mesh.tp=2 --set device=cuda --world 2
expect device_cuda_tp_comm_json 0 '"tp_comm":\{"micro_batch":8,"seq":32,"bytes_per_element":4,' \
  "$tycho" check plans/tiny.lua --set mesh.tp=2 --set device=cuda --world 2 --json

# --unsafe lifts the sandbox; TYCHO_PATH extends require's search path
mkdir -p "$tmp/lib/team"
cat >"$tmp/lib/team/base.lua" <<'LUA'
return { n_layers = 2, dim = 64, n_heads = 4, ffn_dim = 128, vocab = 64, max_seq = 64 }
LUA
cat >"$tmp/io.lua" <<'LUA'
local tycho = require "tycho"
local f = io.open("/dev/null")
f:close()
return tycho.plan { model = require("team.base"), batch = { global = 8, seq = 32 } }
LUA
expect unsafe_off 2 "'io' is not available in the plan sandbox" env TYCHO_PATH="$tmp/lib" "$tycho" check "$tmp/io.lua"
expect unsafe_on 0 '^model +llama, 2 layers' env TYCHO_PATH="$tmp/lib" "$tycho" check "$tmp/io.lua" --unsafe
expect tycho_path_missing 2 "module 'team.base' not found in the plan search path" "$tycho" check "$tmp/io.lua" --unsafe

# require never leaves the search path, not even through a symlink
mkdir -p "$tmp/plan" "$tmp/outside"
echo 'return { secret = true }' >"$tmp/outside/secret.lua"
ln -s "$tmp/outside/secret.lua" "$tmp/plan/escape.lua"
echo 'local s = require "escape"' >"$tmp/plan/p.lua"
expect symlink_escape 2 "module 'escape' not found in the plan search path" "$tycho" check "$tmp/plan/p.lua"

# tycho COMMAND --help (or -h): that command's usage, exit 0, nothing run (run compiles no plan)
for c in check tune run repl rehearse calibrate ckpt; do
  expect "help_$c" 0 "^  $c " "$tycho" "$c" --help
done
expect help_run_plan 0 '^usage:$' "$tycho" run nothere.lua -h
expect help_repl_prompt 0 'help\(\) lists the REPL' "$tycho" repl plans/tiny.lua -n 2 --help

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
