#!/usr/bin/env bash
# Non-finite runs explain themselves: a loss or gradient norm that is not finite stops the run
# before the step is applied, naming the step as the progress lines number it (one after the
# last progress line) with advice that fits (lower the lr, or set grad_clip when it is not set);
# weights from init.from holding an inf are refused at start, naming the file and the tensor.
# usage: run_nonfinite.sh TYCHO   (run from the source folder)
set -u
tycho=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
blow_up() { # blow_up GRAD_CLIP: a run whose lr makes the loss diverge
  "$tycho" run plans/tiny.lua --set optimizer.lr=1e4 --set optimizer.grad_clip="$1" --set train.steps=200 \
    --set log.every=1 --set train.eval_every=0 >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ "$rc" -eq 1 ] || fail "a diverged run exits 1 (got $rc)"
  last=$(sed -n 's/^step *\([0-9]*\)\/200 .*/\1/p' "$tmp/out" | tail -1)
  msg=$(head -1 "$tmp/err")
  case "$msg" in
    "tycho: step $((last + 1)): the loss ("*") or the gradient norm ("*") is not finite, so the step is not applied; $2") ;;
    *) fail "grad_clip $1: '$msg' (the last progress line was step $last)" ;;
  esac
}
blow_up 0 'lower optimizer.lr or set optimizer.grad_clip'
blow_up 1 'lower optimizer.lr (optimizer.grad_clip = 1 is set already)'

# weights with an inf in them
"$tycho" run plans/tiny.lua --set train.steps=2 --set train.eval_every=0 --set export.path="$tmp/w.safetensors" \
  >/dev/null 2>&1 || fail "the export run failed"
n=$(od -An -t u8 -N8 "$tmp/w.safetensors" | tr -d ' ')
printf '\x00\x00\x80\x7f' | dd of="$tmp/w.safetensors" bs=1 seek=$((8 + n)) conv=notrunc 2>/dev/null
err=$("$tycho" run plans/tiny.lua --set train.steps=2 --set init.from="$tmp/w.safetensors" 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 1 ] || fail "weights with an inf: exit $rc, expected 1"
case "$err" in
  *"init.from $tmp/w.safetensors: tensor '"*"' holds a non-finite value (inf at element 0): a run cannot start from these weights"*) ;;
  *) fail "weights with an inf: '$err'" ;;
esac
echo "ok: non-finite runs"
