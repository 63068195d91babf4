#!/usr/bin/env bash
# Weights in and out under tensor and pipeline parallelism. A serial run of the dp_small plan
# exports its weights (A); then the same plan starts from A (init.from) once on one rank and once
# on RANKS ranks with the --set layout arguments, both exporting after 5 steps (S, P). The
# parallel run must read A block by block (its losses equal the serial run's within EQUIV_TOL,
# tests/lib/build.sh: 1e-5 in fp32, 1e-10 in float64), and its export, put together from every
# tp and pp rank, must be the model: a serial run started from P has the same losses, within
# EQUIV_TOL, as one started from S. (The float64 build exports F32 too: S and P are its weights
# rounded to fp32, which differ only where weights 1e-15 apart round apart, one chance in ~1e9
# per weight.) With --hf every export is a Hugging Face folder (export.format = "hf", shards of
# 0.02 MB) and every init.from that folder; the parallel export's index must then equal the serial
# one's, byte for byte.
# usage: run_init_export.sh RANKS MPIEXEC NUMPROC_FLAG TYCHO [--hf] [--both path=value]... [--set path=value]...
#   --both: for every run (the model), --set: for the parallel run (the layout)
set -u
ranks=$1 mpiexec=$2 np=$3 tycho=$4
shift 4
. "$(dirname "$0")/../lib/build.sh" "$tycho"
both=() fmt=() ext=.safetensors hf=0
if [ "${1:-}" = --hf ]; then
  fmt=(--set export.format=hf --set export.shard_mb=0.02) ext= hf=1
  shift
fi
while [ "${1:-}" = --both ]; do both+=(--set "$2"); shift 2; done
plan=tests/plans/good/dp_small.lua
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fail() { echo "--- stdout"; cat "$tmp/out" 2>/dev/null; echo "--- stderr"; cat "$tmp/err" 2>/dev/null; echo "FAIL: $*"; exit 1; }
field() { grep -o "\"$2\": [-0-9.eE+]*" "$1" | awk '{ print $2 }'; }
same() { # same FILE_A FILE_B WHAT: every step's loss within EQUIV_TOL relative
  local v
  v=$(paste <(field "$1" loss) <(field "$2" loss) | awk -v tol="$EQUIV_TOL" '{ d = ($2 - $1) / $1; d = d < 0 ? -d : d;
    w = d > w ? d : w; n++ } END { if (n == 0 || w > tol) print "FAIL " n " " w; else printf "ok %d %.3g (bound %g)", n, w, tol }')
  echo "$3: $v"
  case "$v" in ok*) ;; *) fail "$3: losses differ: $v" ;; esac
}
run1() { "$tycho" run "$plan" --set train.steps=5 --set train.eval_every=0 "${both[@]}" "$@" >"$tmp/out" 2>"$tmp/err" || fail "serial run $*"; }

run1 --set export.path="$tmp/a$ext" "${fmt[@]}"
run1 --set init.from="$tmp/a$ext" --set export.path="$tmp/s$ext" "${fmt[@]}" --set log.metrics="$tmp/s.jsonl"
timeout 240 "$mpiexec" "$np" "$ranks" "$tycho" run "$plan" --set train.steps=5 --set train.eval_every=0 "${both[@]}" "$@" \
  --set init.from="$tmp/a$ext" --set export.path="$tmp/p$ext" "${fmt[@]}" --set log.metrics="$tmp/p.jsonl" \
  >"$tmp/out" 2>"$tmp/err" || fail "the parallel run"
same "$tmp/s.jsonl" "$tmp/p.jsonl" "started from A, serial against $*"
if [ "$hf" = 1 ]; then
  [ -f "$tmp/p/model-00002-of-"*.safetensors ] || fail "the parallel export has fewer than two shards"
  cmp "$tmp/s/model.safetensors.index.json" "$tmp/p/model.safetensors.index.json" || fail "the indexes differ"
  cmp "$tmp/s/config.json" "$tmp/p/config.json" || fail "the configs differ"
fi
run1 --set init.from="$tmp/s$ext" --set log.metrics="$tmp/from_s.jsonl"
run1 --set init.from="$tmp/p$ext" --set log.metrics="$tmp/from_p.jsonl"
same "$tmp/from_s.jsonl" "$tmp/from_p.jsonl" "started from the serial and from the parallel export"
