#!/usr/bin/env bash
# `tycho check PLAN --world N --cluster C --sbatch`: the Slurm batch script, without a Slurm. On
# the slurm tests' CPU cluster (tests/slurm/local4.lua) the whole script, the figures of the memory
# and time comments aside: one node, 4 tasks of 1 CPU, no GPUs, the job's folder this one, the srun
# line with the plan and every --set (quoted where the shell needs it), --unsafe passed on, the
# checkpoint and metrics paths. On the H100 cluster: 2 nodes of 8 tasks and 8 GPUs for 16 ranks,
# whole nodes with their CPUs shared out by srun unless --cpus-per-task N; a cpu plan asks for no
# GPU. Refused with exit 2: --sbatch without --cluster, with --json, --cpus-per-task without
# --sbatch or out of range, --sbatch on another command.
# usage: check_sbatch.sh TYCHO   (run from the source folder)
set -u
tycho=$(readlink -f "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
plan=tests/plans/good/dp_small.lua

"$tycho" check "$plan" --world 4 --cluster tests/slurm/local4.lua --sbatch --set zero=3 --unsafe \
  --set "log.metrics=runs/it's here.jsonl" --set checkpoint.dir=ck --set checkpoint.every=5 >"$tmp/s" 2>"$tmp/err" ||
  fail "check --sbatch: exit code $? ($(cat "$tmp/err"))"
[ -s "$tmp/err" ] && fail "unexpected stderr: $(cat "$tmp/err")"
sed -e 's/holds [0-9.]* [KMG]*i*B of [0-9.]* [KMG]*i*B per device: fits, [0-9]*% headroom/holds X of Y per device: fits, H% headroom/' \
  -e 's/^# time: .* s per step, [0-9]* tokens\/s, MFU [0-9.]*%/# time: S s per step, T tokens\/s, MFU M%/' "$tmp/s" >"$tmp/got"
cat >"$tmp/want" <<WANT
#!/bin/bash
# plan dp-small (tests/plans/good/dp_small.lua) on 4 ranks, written by tycho check --sbatch
# cluster: slurm test node, 4 CPU ranks (tests/slurm/local4.lua)
# layout: tp 1 x pp 1 x dp 4, zero 3; 1 node of 4 cores (one rank each)
# memory: the fullest rank (pp rank 0) holds X of Y per device: fits, H% headroom
# time: S s per step, T tokens/s, MFU M% (tycho check's prediction on this cluster)
#SBATCH --job-name=dp-small
#SBATCH --nodes=1
#SBATCH --ntasks=4
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=1
#SBATCH --output=dp-small-%j.out
#SBATCH --chdir=$PWD
# checkpoints: ck (every 5 steps; submitted again, the job resumes from the newest)
# metrics: runs/it's here.jsonl
srun --mpi=pmix --cpus-per-task=1 $tycho run tests/plans/good/dp_small.lua --unsafe --set zero=3 --set 'log.metrics=runs/it'\\''s here.jsonl' --set checkpoint.dir=ck --set checkpoint.every=5
WANT
diff "$tmp/want" "$tmp/got" || fail "the script on the CPU cluster differs (above: < expected, > got)"
# the srun line is one the shell reads back into the same words
words=$(tail -n 1 "$tmp/s" | sed 's/^srun /printf "%s|" /' | bash)
[ "$words" = "--mpi=pmix|--cpus-per-task=1|$tycho|run|tests/plans/good/dp_small.lua|--unsafe|--set|zero=3|--set|log.metrics=runs/it's here.jsonl|--set|checkpoint.dir=ck|--set|checkpoint.every=5|" ] ||
  fail "the srun line reads back as $words"

# a GPU cluster: nodes from gpus_per_node, a GPU per task, whole nodes unless --cpus-per-task
"$tycho" check plans/llama2_7b.lua --world 16 --cluster plans/clusters/h100_80g_ib.lua --sbatch >"$tmp/s" 2>&1 ||
  fail "check --sbatch on the H100 cluster: exit code $?"
want='#SBATCH --job-name=llama2-7b
#SBATCH --nodes=2
#SBATCH --ntasks=16
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --output=llama2-7b-%j.out'
[ "$(grep '^#SBATCH' "$tmp/s" | head -n 7)" = "$want" ] || { cat "$tmp/s"; fail "the #SBATCH lines for 16 H100 ranks"; }
grep -qx '# layout: tp 2 x pp 1 x dp 8, zero 1; 2 nodes of 8 GPUs' "$tmp/s" || fail "no layout comment"
grep -Eq '^# memory: the fullest rank \(pp rank 0\) holds [0-9.]+ GiB of 74.5 GiB per device: fits, [0-9]+% headroom$' "$tmp/s" ||
  fail "no memory comment"
grep -Eq '^# time: [0-9.]+ s per step, [0-9]+ tokens/s, MFU [0-9.]+% ' "$tmp/s" || fail "no time comment"
grep -qx '# checkpoints: ckpt/llama2-7b (every 1000 steps; submitted again, the job resumes from the newest)' "$tmp/s" ||
  fail "no checkpoint comment"
grep -qx '# metrics: runs/llama2-7b/metrics.jsonl' "$tmp/s" || fail "no metrics comment"
grep -qx "srun --mpi=pmix --cpus-per-task=\$((SLURM_CPUS_ON_NODE / SLURM_NTASKS_PER_NODE)) $tycho run plans/llama2_7b.lua" \
  "$tmp/s" || fail "the srun line for whole nodes"
"$tycho" check plans/llama2_7b.lua --world 12 --cluster plans/clusters/h100_80g_ib.lua --sbatch --cpus-per-task 14 \
  --set device=cpu --set mesh.tp=1 --set batch.global=1032 >"$tmp/s" 2>&1 || fail "check --sbatch --cpus-per-task: exit code $?"
[ "$(grep -E '^#SBATCH --(nodes|ntasks|ntasks-per-node|gpus-per-node|cpus-per-task|exclusive)' "$tmp/s")" = \
  '#SBATCH --nodes=2
#SBATCH --ntasks=12
#SBATCH --ntasks-per-node=8
#SBATCH --cpus-per-task=14' ] || { cat "$tmp/s"; fail "12 cpu ranks with 14 CPUs each"; }
grep -qx "srun --mpi=pmix --cpus-per-task=14 $tycho run plans/llama2_7b.lua --set device=cpu --set mesh.tp=1 --set batch.global=1032" "$tmp/s" ||
  fail "the srun line with --cpus-per-task 14"

refused() { # refused MESSAGE ARGS...: exit 2, MESSAGE on stderr, nothing on stdout
  "$tycho" "${@:2}" >"$tmp/o" 2>"$tmp/e"
  local rc=$?
  [ "$rc" -eq 2 ] || fail "${*:2}: exit $rc, expected 2"
  [ "$(cat "$tmp/e")" = "$1" ] || fail "${*:2}: stderr '$(cat "$tmp/e")', expected '$1'"
  [ -s "$tmp/o" ] && fail "${*:2}: a script on stdout after a refusal"
  return 0
}
refused "tycho: --sbatch needs --cluster C.lua, the cluster the job runs on (e.g. plans/clusters/h100_80g_ib.lua): its nodes size the script" \
  check "$plan" --world 4 --sbatch
refused "tycho: --sbatch and --json: choose one (the script, or the JSON document)" \
  check "$plan" --world 4 --cluster tests/slurm/local4.lua --sbatch --json
refused "tycho: --cpus-per-task is for the batch script: tycho check PLAN --world N --cluster C.lua --sbatch --cpus-per-task N" \
  check "$plan" --world 4 --cluster tests/slurm/local4.lua --cpus-per-task 2
refused "tycho: --cpus-per-task needs an integer in 1..4096 (got 0: out of range); see tycho --help" \
  check "$plan" --world 4 --cluster tests/slurm/local4.lua --sbatch --cpus-per-task 0
refused "tycho: unknown option '--sbatch' for 'run'; see tycho --help" run "$plan" --sbatch

# A working folder whose path holds a line break: an #SBATCH line cannot carry it (the rest would
# be a line of the script, run by bash), so the script is refused before a byte is written.
src=$PWD
hostile="$tmp/cw"$'\n''touch PWNED #'
mkdir "$hostile" || fail "mkdir of a folder with a line break"
(cd "$hostile" && "$tycho" check "$src/$plan" --world 4 --cluster "$src/tests/slurm/local4.lua" --sbatch >"$tmp/o" 2>"$tmp/e")
rc=$?
[ "$rc" -eq 2 ] || fail "a folder with a line break: exit $rc, expected 2 ($(cat "$tmp/e"))"
grep -q "^tycho: --sbatch: the current folder's path holds a control character (byte 0x0a at offset $((${#tmp} + 3)))" "$tmp/e" ||
  fail "a folder with a line break: stderr '$(cat "$tmp/e")'"
[ -s "$tmp/o" ] && fail "a folder with a line break: a script on stdout"
# --set values with a line break, a carriage return, a quote and a backslash: one line each, and
# the srun line reads back into the same words; running the script's lines runs no other command.
(cd "$tmp" && "$tycho" check "$src/$plan" --world 4 --cluster "$src/tests/slurm/local4.lua" --sbatch \
  --set "log.metrics=a"$'\n'"touch PWNED #" --set "checkpoint.dir=b"$'\r'"c'd\\e" >"$tmp/s" 2>"$tmp/e") ||
  fail "check --sbatch with a line break in a --set: exit $? ($(cat "$tmp/e"))"
[ "$(grep -c '^srun ' "$tmp/s")" -eq 1 ] || fail "the srun line is not one line: $(cat "$tmp/s")"
words=$(grep '^srun ' "$tmp/s" | sed 's/^srun /printf "%s|" /' | bash)
[ "$words" = "--mpi=pmix|--cpus-per-task=1|$tycho|run|$src/$plan|--set|log.metrics=a"$'\n'"touch PWNED #|--set|checkpoint.dir=b"$'\r'"c'd\\e|" ] ||
  fail "the srun line with control characters reads back as $words"
(cd "$tmp" && grep -v '^srun ' "$tmp/s" | bash) || fail "the script's other lines fail under bash"
[ -e "$tmp/PWNED" ] && fail "a line of the script ran a command from a --set value"
echo "ok: the batch script on a CPU and a GPU cluster, refusals, hostile folder and values"
