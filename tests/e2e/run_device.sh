#!/usr/bin/env bash
# Where `tycho run` computes, said and refused by name: a device = "cuda" plan on a machine
# without a CUDA device exits 2 with the reason for this build ("no CUDA device visible" where the
# build has the CUDA backend, "this build of tycho has no CUDA backend" where it does not:
# `tycho --version` says which); device = "auto" (the default) runs on the CPU and the header says
# why; device = "cpu" adds no line to the header; `tycho check` of a cuda plan needs no device.
# Skipped (77) where the driver sees a device: a cuda plan runs there.
# usage: run_device.sh TYCHO   (run from the source folder)
set -u
tycho=$1
unset CUDA_VISIBLE_DEVICES
failed=0
fail() { echo "FAIL: $*"; failed=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plan=tests/plans/good/train_small.lua
if "$tycho" --version | grep -q ', with the CUDA backend)'; then
  why="no CUDA device visible"
  refusal='device = "cuda": no CUDA device visible (the driver reports none); run it on the CPU with --set device=cpu (or device = "auto")'
else
  why="no CUDA backend in this build"
  refusal='device = "cuda": this build of tycho has no CUDA backend; run it on the CPU with --set device=cpu (or device = "auto")'
fi
if "$tycho" check "$plan" | grep -q '^device  *auto → cpu here ('; then
  echo "skipped: a CUDA device is visible here"
  exit 77
fi

"$tycho" run "$plan" --set device=cuda --set train.steps=1 >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 2 ] || fail "device=cuda exited $rc, expected 2"
[ "$(cat "$tmp/err")" = "tycho: plan error: --set device=cuda: $refusal" ] ||
  fail "device=cuda: stderr '$(cat "$tmp/err")'"
[ ! -s "$tmp/out" ] || fail "device=cuda printed on stdout: $(cat "$tmp/out")"

"$tycho" run "$plan" --set train.steps=1 >"$tmp/auto" 2>&1 || fail "device auto: $(cat "$tmp/auto")"
[ "$(sed -n 3p "$tmp/auto")" = "device: cpu (auto: $why)" ] || fail "device auto: header $(head -4 "$tmp/auto")"
"$tycho" run "$plan" --set train.steps=1 --set device=auto >"$tmp/auto2" 2>&1 || fail "device=auto: $(cat "$tmp/auto2")"
grep -qx "device: cpu (auto: $why)" "$tmp/auto2" || fail "device=auto: header $(head -4 "$tmp/auto2")"

"$tycho" run "$plan" --set train.steps=1 --set device=cpu >"$tmp/cpu" 2>&1 || fail "device=cpu: $(cat "$tmp/cpu")"
! grep -q '^device' "$tmp/cpu" || fail "device=cpu: a device line: $(grep '^device' "$tmp/cpu")"
# the same run, the same numbers: the header's device line is the only difference
diff <(grep -v '^device: ' "$tmp/auto" | grep '^step' | sed 's/ | [0-9]* tok\/s.*//') \
     <(grep '^step' "$tmp/cpu" | sed 's/ | [0-9]* tok\/s.*//') >/dev/null || fail "auto and cpu train differently"

"$tycho" check "$plan" --set device=cuda >"$tmp/check" 2>&1 || fail "check of a cuda plan: $(cat "$tmp/check")"
grep -qx 'device     cuda' "$tmp/check" || fail "check of a cuda plan: $(grep '^device' "$tmp/check")"
"$tycho" check "$plan" >"$tmp/check" 2>&1 || fail "check: $(cat "$tmp/check")"
grep -qx "device     auto → cpu ($why)" "$tmp/check" || fail "check: $(grep '^device' "$tmp/check")"
[ "$failed" -eq 0 ] && echo "ok: device"
exit "$failed"
