#!/usr/bin/env bash
# Runs `tycho check` on one malformed plan and proves it is refused as the plan says:
#   exit code 2, the first stderr line "tycho: plan error: FILE:LINE: ..." where LINE is the line
#   marked "-- @error" (or the --set text, or just the file when no line is marked), the
#   "-- expect:" text in that line, and no Lua traceback anywhere.
# usage: check_bad_plan.sh TYCHO PLAN   (run from the source folder; PLAN relative to it)
set -u
tycho=$1 plan=$2
expect=$(grep -m1 -- '^-- expect: ' "$plan" | sed 's/^-- expect: //')
args=$(grep -m1 -- '^-- args: ' "$plan" | sed 's/^-- args: //')
line=$(grep -n -- '-- @error' "$plan" | head -n 1 | cut -d: -f1)
[ -n "$expect" ] || { echo "FAIL $plan: no '-- expect:' line"; exit 1; }

# shellcheck disable=SC2086
stderr=$("$tycho" check "$plan" $args 2>&1 >/dev/null)
rc=$?
first=$(printf '%s\n' "$stderr" | head -n 1)
fail() { echo "FAIL $plan: $*"; echo "stderr was:"; printf '%s\n' "$stderr"; exit 1; }

[ "$rc" -eq 2 ] || fail "exit code $rc, expected 2"
case "$args" in
  --set*) prefix="tycho: plan error: ${args#--set }: "; prefix="tycho: plan error: --set ${args#--set }: " ;;
  *) if [ -n "$line" ]; then prefix="tycho: plan error: $plan:$line: "; else prefix="tycho: plan error: $plan"; fi ;;
esac
case "$first" in
  "$prefix"*) ;;
  *) fail "first line does not start with '$prefix'" ;;
esac
case "$first" in
  *"$expect"*) ;;
  *) fail "first line lacks '$expect'" ;;
esac
if printf '%s\n' "$stderr" | grep -q 'stack traceback'; then fail "a Lua traceback was printed"; fi
echo "ok $plan: $first"
