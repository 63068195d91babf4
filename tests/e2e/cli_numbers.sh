#!/usr/bin/env bash
# Every numeric argument of the command line is parsed strictly and checked in 64 bits against
# its range before it is stored: a value that does not fit (4294967297 ranks, which an int
# truncated to 1; 17592186044416 MiB, which << 20 wrapped to 256) or is not a whole decimal
# number is refused with exit code 2 and one line naming the option, the value and the range.
# --set paths with an empty component ("mesh..tp") are refused, not read as "mesh.tp". And
# tycho's own messages are formatted by C (%lld, %.0f): tune's "no layout fits" line was once
# "invalid option '%.' to 'lua_pushfstring'" with exit code 1.
# usage: cli_numbers.sh TYCHO   (run from the source folder)
set -u
tycho=$1
plan=tests/plans/good/train_small.lua
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
# expect CODE TEXT ARGS...: exit code CODE and TEXT in the first stderr line
expect() {
  local code=$1 text=$2
  shift 2
  local stderr rc first
  stderr=$("$@" 2>&1 >/dev/null </dev/null)
  rc=$?
  first=$(printf '%s\n' "$stderr" | head -n 1)
  if [ "$rc" -ne "$code" ]; then
    echo "FAIL: $* exited $rc, expected $code; stderr: $stderr"; failed=1; return
  fi
  case "$first" in
    *"$text"*) echo "ok   $*" ;;
    *) echo "FAIL: $*: first stderr line '$first' lacks '$text'"; failed=1 ;;
  esac
}

w='--world needs an integer in 1..16777216'
expect 2 "tycho: $w (got 4294967297: out of range); see tycho --help" "$tycho" check $plan --world 4294967297
expect 2 "tycho: $w (got 99999999999: out of range)" "$tycho" check $plan --world 99999999999
expect 2 "tycho: $w (got 99999999999999999999999: out of range)" "$tycho" check $plan --world 99999999999999999999999
expect 2 "tycho: $w (got 16777217: out of range)" "$tycho" check $plan --world 16777217
expect 2 "tycho: $w (got -1: out of range)" "$tycho" check $plan --world -1
expect 2 "tycho: $w (got 0: out of range)" "$tycho" check $plan --world=0
expect 2 "tycho: $w (got 4x: not an integer)" "$tycho" check $plan --world 4x
expect 2 "tycho: $w (got  4: not an integer)" "$tycho" check $plan --world " 4"
expect 2 "tycho: $w (got 0x10: not an integer)" "$tycho" check $plan --world 0x10
expect 2 "tycho: $w (got nothing)" "$tycho" check $plan --world
expect 2 "tycho: $w (got 4294967298: out of range)" "$tycho" run $plan --world 4294967298
expect 2 "tycho: $w (got 4294967297: out of range)" "$tycho" tune $plan --world 4294967297 --cluster plans/clusters/h100_80g_ib.lua --out "$tmp/t.lua"
expect 2 'tycho: --max-memory needs an integer in 1..1048576 (got 17592186044416: out of range)' \
  "$tycho" check $plan --max-memory 17592186044416
expect 2 'tycho: --max-memory needs an integer in 1..1048576 (got 0: out of range)' "$tycho" check $plan --max-memory 0
expect 2 'tycho: --max-instructions needs an integer in 1000..1000000000000000 (got 9223372036854775808: out of range)' \
  "$tycho" check $plan --max-instructions 9223372036854775808
expect 2 'tycho: --max-instructions needs an integer in 1000..1000000000000000 (got 1e9: not an integer)' \
  "$tycho" check $plan --max-instructions 1e9
c=plans/clusters/h100_80g_ib.lua
expect 2 'tycho: --top needs an integer in 1..1000 (got 4294967297: out of range)' "$tycho" tune $plan --world 4 --out "$tmp/t.lua" --cluster $c --top 4294967297
expect 2 'tycho: --top needs an integer in 1..1000 (got 0: out of range)' "$tycho" tune $plan --world 4 --out "$tmp/t.lua" --cluster $c --top 0
expect 2 'tycho: --headroom needs an integer in 0..99 (got 100: out of range)' "$tycho" tune $plan --world 4 --out "$tmp/t.lua" --cluster $c --headroom 100
expect 2 'tycho: --headroom needs an integer in 0..99 (got 12.5: not an integer)' "$tycho" tune $plan --world 4 --out "$tmp/t.lua" --cluster $c --headroom 12.5
expect 2 'tycho: --timeout needs an integer in 1..604800 (got 99999999999999999999: out of range)' \
  "$tycho" repl --timeout 99999999999999999999
expect 2 'tycho: TYCHO_REPL_TIMEOUT needs an integer in 1..604800 (got 30s: not an integer)' env TYCHO_REPL_TIMEOUT=30s "$tycho" repl

# --set paths: an empty component is refused (it was read as mesh.tp, or as mesh)
expect 2 "tycho: --set mesh..tp=2: the path 'mesh..tp' has an empty component" "$tycho" check $plan --set mesh..tp=2
expect 2 "tycho: --set .mesh.tp=2: the path '.mesh.tp' has an empty component" "$tycho" check $plan --set .mesh.tp=2
expect 2 "tycho: --set mesh.=2: the path 'mesh.' has an empty component" "$tycho" check $plan --set=mesh.=2
expect 2 "tycho: --set mesh..tp=2: the path 'mesh..tp' has an empty component" "$tycho" run $plan --set mesh..tp=2
expect 2 "tycho: --set mesh..tp=2: the path 'mesh..tp' has an empty component" "$tycho" repl $plan --set mesh..tp=2

# the values in range still work: the largest world, 0% headroom (not the default 10%)
expect 2 'but the world has 16777216; set dp = 16777216' "$tycho" check $plan --world 16777216
if "$tycho" tune $plan --world 2 --cluster $c --headroom 0 --out "$tmp/t.lua" >"$tmp/out" 2>&1 &&
   grep -q 'fit with 0% headroom' "$tmp/out"; then echo "ok   tune --headroom 0"
else echo "FAIL: tune --headroom 0:"; cat "$tmp/out"; failed=1; fi
if "$tycho" check $plan --max-memory 1048576 --max-instructions 1000000000000000 >/dev/null; then
  echo "ok   the largest --max-memory and --max-instructions"
else echo "FAIL: the largest --max-memory and --max-instructions are refused"; failed=1; fi

# C formats in tycho's messages: the "no layout fits" line of tune
expect 2 'tycho: no layout of plans/llama2_70b.lua fits 1 ranks of' "$tycho" tune plans/llama2_70b.lua --world 1 --cluster $c --out "$tmp/t70.lua"
expect 2 'with 10% headroom; more ranks' "$tycho" tune plans/llama2_70b.lua --world 1 --cluster $c --out "$tmp/t70.lua"

[ "$failed" -eq 0 ] || exit 1
echo "ok: numbers on the command line"
