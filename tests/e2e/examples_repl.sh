#!/usr/bin/env bash
# examples/repl: the recorded 4-rank session replayed in script mode must print what was
# recorded (session.out), timings masked; it ends in exit 1 (one chunk is a refused step, on
# purpose), and the checkpoint it saves verifies.
# usage: examples_repl.sh TYCHO   (run from the source folder)
set -u
tycho=$1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
TYCHO_EXAMPLE_DIR=$tmp mpirun -np 4 "$tycho" repl plans/tiny.lua examples/repl/session.lua --set zero=3 \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 1 ] || fail "the session exits 1 (its refused step); got $rc: $(cat "$tmp/err")"
sed -E 's/\| [0-9]+ tok\/s \| [0-9.]+s \| ETA [0-9.]+s$/| N tok\/s | T s | ETA T s/' "$tmp/out" >"$tmp/masked"
diff examples/repl/session.out "$tmp/masked" || fail "the replay differs from examples/repl/session.out (< recorded, > now)"
"$tycho" ckpt verify "$tmp/session_ckpt" >/dev/null || fail "the session's checkpoint does not verify"
echo "ok: examples/repl replays as recorded"
