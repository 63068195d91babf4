#!/usr/bin/env bash
# `tycho repl` on a terminal keeps its history line by line: each chunk is in ~/.tycho_history as
# soon as it has been read (a session that dies keeps it), and the file holds the last 1000.
# usage: repl_history.sh TYCHO   (run from the source folder; ctest sets $TYCHO_PTYDRIVE)
set -u
tycho=$(readlink -f "$1")
drive=${TYCHO_PTYDRIVE:?"the path of the ptydrive tool (ctest sets it)"}
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT

cat > "$home/script" <<'SCRIPT'
expect > 
send =40 + 2\r
expect 42
expect > 
# the session still runs: the history file already holds the chunk
send =io.open(os.getenv("HOME") .. "/.tycho_history"):read("a")\r
expect =40 + 2
expect > 
send \x04
exit 0
SCRIPT
env HOME="$home" OPENBLAS_NUM_THREADS=1 "$drive" "$home/script" -- "$tycho" repl
rc=$?
[ $rc -eq 0 ] || exit $rc
# a second session adds to it (the first one's chunks stay)
cat > "$home/script2" <<'SCRIPT'
expect > 
send =1 + 1\r
expect 2
expect > 
send \x04
exit 0
SCRIPT
env HOME="$home" OPENBLAS_NUM_THREADS=1 "$drive" "$home/script2" -- "$tycho" repl
rc=$?
[ $rc -eq 0 ] || exit $rc
want='=40 + 2
=io.open(os.getenv("HOME") .. "/.tycho_history"):read("a")
=1 + 1'
[ "$(cat "$home/.tycho_history")" == "$want" ] || {
  echo "FAIL: ~/.tycho_history is not the chunks of both sessions, in order:"; cat "$home/.tycho_history"; exit 1; }
echo "ok: repl history line by line"
