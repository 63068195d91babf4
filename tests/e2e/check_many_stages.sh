#!/usr/bin/env bash
# `tycho check` on a pipeline of 4000 stages (plans/tiny.lua with 4000 layers, mesh.pp = 4000):
# the text shows the first and last rows of every per-rank and per-stage table (ranks, stages,
# the schedule's timeline and its peaks, memory, traffic) and says how many it left out, so the
# whole text stays a bounded number of lines (it was one line or more per stage and rank, 24,000
# lines in about 90 s). The bound is on lines, not time; `timeout` only keeps a regression from
# running for minutes.
# usage: check_many_stages.sh TYCHO   (run from the source folder)
set -u
tycho=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

timeout 60 "$tycho" check plans/tiny.lua --set model.n_layers=4000 --set mesh.pp=4000 --set mesh.dp=1 \
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
[ "$failed" -eq 0 ] && echo "ok: 4000 stages in $lines lines"
exit "$failed"
