#!/usr/bin/env bash
# `tycho repl` on a terminal (a pseudo-terminal driven by tests/tools/ptydrive.c): the prompt, a
# value, continuation lines (">> "), readline's history (Up brings back the last chunk;
# ~/.tycho_history is written at the end), Ctrl-C at the prompt clearing the line typed so far,
# Ctrl-C during a long Lua loop ("interrupted!") with the prompt back, Ctrl-D ending the session
# with exit code 0; then a trainer: Ctrl-C during t:step(100000) stops it at a step boundary and
# the trainer goes on; tab completion of the tycho module's names and the trainer's methods,
# t:help among them.
# usage: repl_terminal.sh TYCHO   (run from the source folder; ctest sets $TYCHO_PTYDRIVE)
set -u
tycho=$(readlink -f "$1")
drive=${TYCHO_PTYDRIVE:?"the path of the ptydrive tool (ctest sets it)"}
home=$(mktemp -d)
trap 'rm -rf "$home"' EXIT

cat > "$home/plain.script" <<'SCRIPT'
expect > 
send =40 + 2\r
expect 42
send function g()\r
expect >> 
send return 7 * 6 + 1\r
expect >> 
send end\r
expect > 
send =g()\r
expect 43
expect > 
# history: Up is the last chunk again, and Enter runs it
send \e[A
expect =g()
send \r
expect 43
# Ctrl-C at the prompt drops what was typed
send this is not lua
send \x03
expect > 
send =5 * 5\r
expect 25
absent syntax error
# Ctrl-C during a long loop: interrupted, and the prompt comes back
send for i = 1, 1e12 do end\r
sleep 1
send \x03
expect interrupted!
expect > 
send =1 + 1\r
expect 2
send \x04
exit 0
SCRIPT
env HOME="$home" OPENBLAS_NUM_THREADS=1 "$drive" "$home/plain.script" -- "$tycho" repl
rc=$?
[ $rc -eq 0 ] || exit $rc
grep -qF '=40 + 2' "$home/.tycho_history" || { echo "FAIL: ~/.tycho_history does not hold the session's chunks"; exit 1; }

# A trainer: tab completion, then Ctrl-C during t:step stops it at the next step boundary and
# the trainer stays usable.
cat > "$home/trainer.script" <<'SCRIPT'
timeout 30
expect > 
timeout 10
# tab completion: a module's names after '.', a trainer's methods after ':'
send =tycho.ope\t
expect =tycho.open
send \x15\r
expect > 
# help from the same table: t:hel<Tab> completes to t:help, which prints t:step's line
send t:hel\t
expect t:help
send ()\r
expect t:step([n])
expect > 
send t:ste\t
expect t:step
send (100000)\r
sleep 2
send \x03
timeout 20
expect interrupted at step
expect > 
timeout 10
send =t.step > 0 and t.step < 100000\r
expect true
send \x04
exit 0
SCRIPT
env HOME="$home" OPENBLAS_NUM_THREADS=1 "$drive" "$home/trainer.script" -- \
  "$tycho" repl plans/tiny.lua --set train.steps=100000 --set log.every=1000
rc=$?
[ $rc -eq 0 ] || exit $rc
echo "ok: repl on a terminal"
