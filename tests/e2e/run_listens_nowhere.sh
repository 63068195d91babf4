#!/usr/bin/env bash
# A one-rank `tycho run` started by hand (no launcher, no --listen) opens no TCP port that other
# machines could reach: with Open MPI's defaults its singleton start listened on every interface
# (the process itself, and the orted daemon it forked). Checked with ss while the run trains: no
# listening TCP socket owned by the run's process or any process under it is on an address
# other than loopback.
# usage: run_listens_nowhere.sh TYCHO   (run from the source folder)
set -u
tycho=$(readlink -f "$1")
command -v ss >/dev/null 2>&1 || { echo "skip: no ss (iproute2)"; exit 77; }
dir=$(mktemp -d)
job=
trap '[ -n "$job" ] && kill -KILL "$job" 2>/dev/null; rm -rf "$dir"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
unset OMPI_MCA_btl OMPI_MCA_ess_singleton_isolated OMPI_COMM_WORLD_SIZE PMI_SIZE PMIX_RANK SLURM_STEP_ID
fail() { echo "FAIL: $*"; [ -f "$dir/run.out" ] && { echo "--- the run's output:"; tail -5 "$dir/run.out"; }; exit 1; }

"$tycho" run plans/tiny.lua --set train.steps=100000 --set log.every=1 --set train.eval_every=0 > "$dir/run.out" 2>&1 &
job=$!
# MPI is started (and any daemon forked) before the first step's line
for _ in $(seq 1200); do grep -q '^step *1/' "$dir/run.out" && break; kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
grep -q '^step *1/' "$dir/run.out" || fail "the run took no step"
tree() { echo "$1"; local p; for p in $(pgrep -P "$1"); do tree "$p"; done; }
pids=$(tree "$job")
ss -ltnpH > "$dir/ss" || fail "ss -ltnp failed"
mine=$(for p in $pids; do grep -E "pid=$p," "$dir/ss"; done)
# the local address is the 4th column: loopback is 127.0.0.0/8, ::1 and ::ffff:127.x
public=$(awk '{ a = $4; sub(/:[0-9]+$/, "", a); gsub(/[][]/, "", a);
  if (a !~ /^127\./ && a != "::1" && a !~ /^::ffff:127\./) print }' <<< "$mine")
[ -z "$public" ] || fail "the one-rank run (pids $(echo $pids)) listens beyond loopback:
$public"
kill -TERM "$job"
wait "$job"
job=
echo "ok: a one-rank run (pids $(echo $pids)) listens on no TCP address beyond loopback ($(grep -c . <<< "$mine") on loopback)"
