#!/usr/bin/env bash
# `tycho run` of tests/plans/good/moe_small.lua (sparse layers 1 and 3, capacity dropping, dropout)
# under mpirun on RANKS ranks with the --set arguments, against the same plan on one rank: the
# metrics' "moe" object of every step is the serial run's. Each rank counts its share of the batch
# on the layers it holds and rank 0 sums them (docs/moe.md, "What a run shows"), so under data
# parallelism and pipeline stages the assignments per expert ("tokens") and the dropped
# fractions must be equal exactly, and the router losses (aux, z: Σ over layers of means) and the
# loss within EQUIV_TOL relative (tests/lib/build.sh: fp32 1e-5, float64 1e-10).
# usage: run_moe_metrics.sh RANKS MPIEXEC NUMPROC_FLAG TYCHO [--set path=value]...   (from the source folder)
set -u
ranks=$1 mpiexec=$2 np=$3 tycho=$4
shift 4
. "$(dirname "$0")/../lib/build.sh" "$tycho"
plan=tests/plans/good/moe_small.lua
tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT
fail() { echo "--- stdout"; cat "$tmp/out"; echo "--- stderr"; cat "$tmp/err"; echo "FAIL: $*"; exit 1; }

"$tycho" run "$plan" --set log.metrics="$tmp/serial.jsonl" >"$tmp/serial.out" 2>&1 ||
  { cat "$tmp/serial.out"; echo "FAIL: the serial run"; exit 1; }
timeout 240 "$mpiexec" "$np" "$ranks" "$tycho" run "$plan" "$@" --set log.metrics="$tmp/par.jsonl" \
  >"$tmp/out" 2>"$tmp/err" || fail "the run on $ranks ranks failed"
[ -s "$tmp/err" ] && fail "unexpected stderr"
steps=$(grep -c '"loss"' "$tmp/serial.jsonl")
[ "$steps" -gt 0 ] && [ "$(grep -c '"moe": {' "$tmp/par.jsonl")" -eq "$steps" ] ||
  fail "expected $steps step records with a moe object"
grep -q '| moe aux [0-9.]* drop [0-9.]*%$' "$tmp/out" || fail "no moe part in the progress line"

# the routing counts of every step and layer, exactly
counts() { grep -o '"layer": [0-9]*, "aux": [-0-9.eE+]*, "dropped": [0-9.eE+-]*, "tokens": \[[^]]*\]' "$1" |
  sed 's/"aux": [^,]*, //'; }
[ "$(counts "$tmp/serial.jsonl" | grep -c .)" -eq $((2 * steps)) ] || fail "expected 2 sparse layers per record"
diff <(counts "$tmp/serial.jsonl") <(counts "$tmp/par.jsonl") >"$tmp/diff" ||
  { cat "$tmp/diff"; fail "the routing (tokens per expert, dropped) differs from the serial run's"; }
# Field f of every record that has it, one per line (the first of each record for aux and z).
field() { grep -o "$2 [-0-9.eE+]*" "$1" | awk '{ print $NF }'; }
for f in '"loss":' '"moe": {"aux":' '"z":'; do
  verdict=$(paste <(field "$tmp/serial.jsonl" "$f") <(field "$tmp/par.jsonl" "$f") | awk -v f="$f" -v tol="$EQUIV_TOL" '
    { d = ($2 - $1) / $1; d = d < 0 ? -d : d; worst = d > worst ? d : worst; n++ }
    END { if (n == 0 || worst > tol) print "FAIL " f " worst relative difference " worst " over " n
          else printf "ok %s %d values, worst relative difference %.3g (bound %g)\n", f, n, worst, tol }')
  echo "$verdict"
  case "$verdict" in ok*) ;; *) fail "$verdict" ;; esac
done
echo "moe metrics on $ranks ranks ($*): $steps steps, tokens per expert and dropped of both layers equal to the serial run's"
