#!/usr/bin/env bash
# SIGINT or SIGTERM to `tycho run`: the step in progress finishes, a checkpoint is written when
# checkpoint.dir is set, the metrics hold every finished step, and the run exits 130 (SIGINT) or
# 143 (SIGTERM) with one line saying so; the checkpoint verifies and a second run resumes from
# it. Without checkpoint.dir the line says that the steps are not saved. A second signal during
# the step (SIGINT and SIGTERM back to back, on plans/tiny.lua's longer steps) exits at once with
# 128 + that signal and its own line. SIGTERM during a long evaluation ends it at the next batch.
# usage: run_signals.sh TYCHO   (run from the source folder)
set -u
tycho=$1
plan=tests/plans/good/train_small.lua
tmp=$(mktemp -d)
bg=
trap '[ -n "$bg" ] && kill -KILL "$bg" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$tmp/out"; echo "--- stderr"; cat "$tmp/err"; exit 1; }
# interrupt SIGNAL CODE ARGS...: a long run signalled once it has trained 20 steps
interrupt() {
  local sig=$1 code=$2 rc
  shift 2
  rm -f "$tmp/m.jsonl"
  "$tycho" run "$plan" --set train.steps=1000000 --set log.metrics="$tmp/m.jsonl" "$@" >"$tmp/out" 2>"$tmp/err" &
  bg=$!
  for _ in $(seq 1200); do [ "$(grep -c '"loss"' "$tmp/m.jsonl" 2>/dev/null)" -ge 20 ] 2>/dev/null && break; sleep 0.1; done
  kill "-$sig" "$bg"
  for _ in $(seq 1200); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$bg" 2>/dev/null && { kill -KILL "$bg"; fail "SIG$sig: still running 120 s after the signal"; }
  wait "$bg"
  rc=$?
  bg=
  [ "$rc" -eq "$code" ] || fail "SIG$sig: exit code $rc, expected $code"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "SIG$sig: expected one line on stderr"
  steps=$(grep -c '"loss"' "$tmp/m.jsonl")
  [ "$steps" -ge 20 ] || fail "SIG$sig: $steps steps in the metrics"
  last=$(grep '"loss"' "$tmp/m.jsonl" | tail -n 1)
  case "$last" in "{\"step\": $((steps - 1)), "*) ;; *) fail "SIG$sig: last metrics record '$last' is not step $((steps - 1))" ;; esac
}

interrupt INT 130 --set checkpoint.dir="$tmp/ck" --set checkpoint.every=1000000
ckpt=$(printf '%s/ck/step_%08d' "$tmp" "$steps")
[ "$(cat "$tmp/err")" = "tycho: interrupted by SIGINT after step $steps: checkpoint $ckpt written" ] ||
  fail "SIGINT: stderr '$(cat "$tmp/err")'"
grep -q "^step *$steps/1000000 | loss " "$tmp/out" || fail "SIGINT: no progress line for step $steps"
"$tycho" ckpt verify "$ckpt" >"$tmp/verify" 2>&1 || fail "SIGINT: the checkpoint does not verify: $(cat "$tmp/verify")"
"$tycho" run "$plan" --set train.steps=$((steps + 3)) --set checkpoint.dir="$tmp/ck" \
  --set log.metrics="$tmp/m.jsonl" >"$tmp/out" 2>"$tmp/err" || fail "the resumed run failed"
grep -q "^resumed from $ckpt: step $steps\$" "$tmp/out" || fail "the second run did not resume from $ckpt"
[ "$(grep -c '"loss"' "$tmp/m.jsonl")" -eq $((steps + 3)) ] || fail "the resumed run did not add 3 steps"
echo "ok: SIGINT after step $steps: exit 130, checkpoint written, resumed from it"

interrupt TERM 143
case "$(cat "$tmp/err")" in
  "tycho: interrupted by SIGTERM after step $steps: no checkpoint.dir, so the trained steps are not saved") ;;
  *) fail "SIGTERM: stderr '$(cat "$tmp/err")'" ;;
esac
echo "ok: SIGTERM after step $steps without checkpoint.dir: exit 143"

# A second signal before the step ends: out at once, with that signal's code and its own line.
"$tycho" run plans/tiny.lua --set train.steps=1000000 --set log.metrics="$tmp/t.jsonl" >"$tmp/out" 2>"$tmp/err" &
bg=$!
for _ in $(seq 1200); do [ "$(grep -c '"loss"' "$tmp/t.jsonl" 2>/dev/null)" -ge 3 ] 2>/dev/null && break; sleep 0.1; done
kill -INT "$bg"
kill -TERM "$bg"
for _ in $(seq 1200); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
kill -0 "$bg" 2>/dev/null && { kill -KILL "$bg"; fail "second signal: still running 120 s after it"; }
wait "$bg"
rc=$?
bg=
# (which of the two the process takes first is the kernel's choice: either order, matching code)
case "$rc" in 130) second=SIGINT ;; 143) second=SIGTERM ;; *) fail "second signal: exit code $rc, expected 130 or 143" ;; esac
[ "$(cat "$tmp/err")" = "tycho: a second signal ($second): exiting at once" ] || fail "second signal: stderr '$(cat "$tmp/err")'"
echo "ok: a second signal exits at once ($second, $rc)"

# SIGTERM during a long evaluation (1000 batches after every step): it ends at the next batch,
# agreed, and the run stops after that step with its usual line. The signal was held back until
# the evaluation's end (minutes here), so timeout, Slurm and systemd could not stop the run.
"$tycho" run plans/tiny.lua --set train.steps=1000 --set train.eval_every=1 --set train.eval_batches=1000 \
  --set log.every=1 >"$tmp/out" 2>"$tmp/err" &
bg=$!
for _ in $(seq 1200); do grep -q '^step' "$tmp/out" 2>/dev/null && break; sleep 0.1; done
sleep 0.5
kill -TERM "$bg"
for _ in $(seq 900); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
kill -0 "$bg" 2>/dev/null && { kill -KILL "$bg"; fail "SIGTERM during evaluation: still running 90 s after it"; }
wait "$bg"
rc=$?
bg=
[ "$rc" -eq 143 ] || fail "SIGTERM during evaluation: exit code $rc, expected 143"
grep -q '^eval at step 1: cut short by a signal$' "$tmp/out" || fail "SIGTERM during evaluation: no 'cut short' line"
[ "$(cat "$tmp/err")" = "tycho: interrupted by SIGTERM after step 1: no checkpoint.dir, so the trained steps are not saved" ] ||
  fail "SIGTERM during evaluation: stderr '$(cat "$tmp/err")'"
echo "ok: SIGTERM during a long evaluation ends it at the next batch: exit 143"
