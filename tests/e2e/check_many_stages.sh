#!/usr/bin/env bash
# `tycho check` on a pipeline of 4000 stages (plans/tiny.lua with 4000 layers, mesh.pp = 4000):
# the text shows the first and last rows of every per-rank and per-stage table (ranks, stages,
# the schedule's timeline and its peaks, memory, traffic) and says how many it left out, so the
# whole text stays a bounded number of lines (it was one line or more per stage and rank, 24,000
# lines in about 90 s). The bound is on lines, not time; `timeout` only keeps a regression from
# running for minutes. `--json` (every rank's bill and traffic) and `--cluster` (every rank's
# bill for the verdict, the step time) compute every pipeline rank: each rank's table in outline
# and one schedule for all, so the 4000 ranks take about 2 s (they took minutes, each rank
# building the whole model's table and the whole schedule); their figures are the ones a rank
# alone gets (this build's fp32 bytes: the float64 build skips the test, scripts/test.sh).
# usage: check_many_stages.sh TYCHO   (run from the source folder)
set -u
tycho=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

timeout 240 "$tycho" check plans/tiny.lua --set model.n_layers=4000 --set mesh.pp=4000 --set mesh.dp=1 \
  --set batch.micro=1 --set batch.global=8 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 0 ] || { fail "exit code $rc"; cat "$tmp/err"; }
lines=$(wc -l <"$tmp/out")
[ "$lines" -le 200 ] || fail "$lines lines of text for 4000 stages, expected at most 200"
for want in \
  '       ...   (3988 more ranks; --json lists every rank)' \
  '       ...   (3988 more stages; --json lists every stage)' \
  '      3999    3999     0   layer 3999 + final norm + head' \
  'peak in-flight micro-batches per rank: 8 8 8 8 8 8 8 8 ... (3988 more) 4 3 2 1' \
  '       ...   (3988 more pp ranks; --json lists every one)' \
  '           ... (3988 more pp ranks; --json lists every one)'; do
  grep -qxF -- "$want" "$tmp/out" || fail "no line '$want'"
done
# the schedule's rows: ranks 0-7 and 3996-3999, the others counted
[ "$(grep -c '^rank ' "$tmp/out")" -eq 12 ] || fail "schedule rows: $(grep -c '^rank ' "$tmp/out"), expected 12"
grep -q '^rank 3999 | ' "$tmp/out" || fail "no schedule row of rank 3999"
[ "$(grep -c '^           pp rank ' "$tmp/out")" -eq 12 ] || fail "traffic rows, expected 12"

# --json: every stage, and every pipeline rank's bill and traffic
many="--set model.n_layers=4000 --set mesh.pp=4000 --set mesh.dp=1 --set batch.micro=1 --set batch.global=8"
# shellcheck disable=SC2086
timeout 240 "$tycho" check plans/tiny.lua $many --json >"$tmp/json" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 0 ] || { fail "--json: exit code $rc"; cat "$tmp/err"; }
count() { grep -oF -- "$1" "$tmp/json" | wc -l; }
[ "$(grep -o '{"index":[0-9]*,"pp_rank":' "$tmp/json" | wc -l)" -eq 4000 ] || fail "--json: not 4000 stages"
[ "$(count '{"index":3999,"pp_rank":3999,"chunk":0,"embed":false,"head":true,"layers":[3999,3999]}')" -eq 1 ] ||
  fail "--json: no last stage"
# the bills: the first rank (the embedding), ranks 1-3992 alike (in memory.per_pp_rank and in ranks), the
# last ones emptier as fewer micro-batches wait there, the last with the norm and head
[ "$(count '{"params":820224,"grads":820224,"optimizer":1640448,"activations":2541312,"comm":147456,"workspace":541960,"total":6511624}')" -eq 2 ] ||
  fail "--json: bill of pp rank 0"
[ "$(count '{"params":787456,"grads":787456,"optimizer":1574912,"activations":2541312,"comm":147456,"workspace":541960,"total":6380552}')" -eq 7984 ] ||
  fail "--json: bills of pp ranks 1-3992"
[ "$(count '{"params":820736,"grads":820736,"optimizer":1641472,"activations":614656,"comm":32768,"workspace":541960,"total":4472328}')" -eq 2 ] ||
  fail "--json: bill of pp rank 3999"
# the traffic: every middle rank sends and receives 16 boundaries (8 micro-batches each way)
[ "$(count '"pp":{"all-gather":{"calls":1,"bytes":32000},"broadcast":{"calls":1,"bytes":8},"send":{"calls":16,"bytes":262144},"recv":{"calls":16,"bytes":262144}}')" -eq 3998 ] ||
  fail "--json: traffic of pp ranks 1-3998"
[ "$(count '{"pp_rank":3999,"tp":{},"dp":{},"pp":{"all-gather":{"calls":1,"bytes":32000},"broadcast":{"calls":1,"bytes":8},"send":{"calls":8,"bytes":131072},"recv":{"calls":8,"bytes":131072}}')" -eq 1 ] ||
  fail "--json: traffic of pp rank 3999"

# --cluster: the verdict over every rank's bill, the step time
# shellcheck disable=SC2086
timeout 240 "$tycho" check plans/tiny.lua $many --cluster plans/clusters/h100_80g_ib.lua >"$tmp/cluster" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 0 ] || { fail "--cluster: exit code $rc"; cat "$tmp/err"; }
for want in \
  '      3999  3999         801.5 KiB   801.5 KiB     1.6 MiB   600.2 KiB    32.0 KiB   529.3 KiB     4.3 MiB   fits, 100% headroom' \
  '           device memory 74.5 GiB (8x H100-80G SXM per node, InfiniBand NDR 400 Gb/s per GPU): every rank fits with at least 10% headroom' \
  'time       on 8x H100-80G SXM per node, InfiniBand NDR 400 Gb/s per GPU: 0.044 s per step, 5870 tokens/s, MFU 0.0% of 989 TFLOPS dense bf16 per GPU'; do
  grep -qxF -- "$want" "$tmp/cluster" || fail "--cluster: no line '$want'"
done
[ "$failed" -eq 0 ] && echo "ok: 4000 stages in $lines lines; --json and --cluster"
exit "$failed"
