#!/usr/bin/env bash
# `tycho repl` on a terminal (tmux): the prompt, a value, continuation lines (">> "), readline's
# history (Up brings back the last chunk; ~/.tycho_history is written at the end), Ctrl-C at the
# prompt clearing the line typed so far, Ctrl-C during a long Lua loop ("interrupted!") with the
# prompt back, Ctrl-D ending the session with exit code 0; then a trainer: Ctrl-C during
# t:step(100000) stops it at a step boundary and the trainer goes on; tab completion of the
# tycho module's names and the trainer's methods.
# usage: repl_terminal.sh TYCHO   (run from the source folder; needs tmux: scripts/install-deps.sh)
set -u
tycho=$(readlink -f "$1")
command -v tmux >/dev/null || { echo "FAIL: tmux is not installed (scripts/install-deps.sh installs it)"; exit 1; }
home=$(mktemp -d)
sock="$home/tmux.sock"
session=repl$$
cleanup() { tmux -S "$sock" kill-server 2>/dev/null; rm -rf "$home"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- pane:"; tmux -S "$sock" capture-pane -p -t "$session" 2>/dev/null; exit 1; }
pane() { tmux -S "$sock" capture-pane -p -t "$session"; }
wait_for() { # wait_for TEXT [SECONDS]: the pane shows TEXT
  local deadline=$((SECONDS + ${2:-10}))
  while [ $SECONDS -lt $deadline ]; do
    pane | grep -qF -- "$1" && return 0
    sleep 0.1
  done
  fail "the pane never showed '$1'"
}
wait_prompt() { # an empty prompt line (capture-pane drops its trailing space)
  local deadline=$((SECONDS + ${1:-10}))
  while [ $SECONDS -lt $deadline ]; do
    pane | grep -qE '^>>? ?$' && return 0
    sleep 0.1
  done
  fail "no prompt"
}
keys() { tmux -S "$sock" send-keys -t "$session" "$@"; sleep 0.2; }
line() { tmux -S "$sock" send-keys -t "$session" -l "$1"; keys Enter; } # -l: "end" is text, not the End key

tmux -S "$sock" new-session -d -s "$session" -x 120 -y 40 \
  "env HOME=$home OPENBLAS_NUM_THREADS=1 $tycho repl; echo \"exit=\$?\"; sleep 30"
wait_prompt
line '=40 + 2'
wait_for "42"
line 'function g()'
wait_for ">>"
line 'return 7 * 6 + 1'
sleep 0.3
line 'end'
wait_prompt
line '=g()'
wait_for "43"
# history: Up is the last chunk again
keys Up
wait_for "> =g()"
keys Enter
[ "$(pane | grep -c '^43$')" -ge 2 ] || fail "Up then Enter did not run =g() again"
# Ctrl-C at the prompt drops what was typed
tmux -S "$sock" send-keys -t "$session" -l 'this is not lua'
keys C-c
line '=5 * 5'
wait_for "25"
pane | grep -q "unexpected symbol" && fail "the line cleared by Ctrl-C was run"
# Ctrl-C during a long loop: interrupted, and the prompt comes back
line 'for i = 1, 1e12 do end'
sleep 1
keys C-c
wait_for "interrupted!"
line '=1 + 1'
wait_for "2"
keys C-d
wait_for "exit=0"
grep -qF '=40 + 2' "$home/.tycho_history" || fail "~/.tycho_history does not hold the session's chunks"

# Ctrl-C during t:step: it stops at the next step boundary, the trainer stays usable
tmux -S "$sock" kill-session -t "$session"
tmux -S "$sock" new-session -d -s "$session" -x 160 -y 40 \
  "env HOME=$home OPENBLAS_NUM_THREADS=1 $tycho repl plans/tiny.lua --set train.steps=100000 --set log.every=1000; echo \"exit=\$?\"; sleep 30"
wait_prompt 30
# tab completion: a module's names after '.', a trainer's methods after ':'
tmux -S "$sock" send-keys -t "$session" -l '=tycho.ope'
keys Tab
wait_for "> =tycho.open"
keys C-u Enter
tmux -S "$sock" send-keys -t "$session" -l 't:ste'
keys Tab
wait_for "> t:step"
line '(100000)'
sleep 2
keys C-c
wait_for "interrupted at step" 20
wait_prompt
line '=t.step > 0 and t.step < 100000'
wait_for "true"
keys C-d
wait_for "exit=0"
echo "ok: repl on a terminal"
