#!/usr/bin/env bash
# Non-finite runs explain themselves: a loss or gradient norm that is not finite stops the run
# before the step is applied (unclipped in fp32, so does a norm whose elements' squares could
# overflow AdamW's second moment: the step would leave an infinite moment), naming the step as the progress lines number it (one after the
# last progress line) with advice that fits (lower the lr, or set grad_clip when it is not set);
# weights from init.from holding an inf are refused at start, naming the file and the tensor;
# a diverging run's checkpoints are all finite (the failing step is never saved), and a
# checkpoint holding an inf is refused by ckpt verify and by a resume.
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
    "tycho: step $((last + 1)): the gradient norm ("*") is too large for fp32: the square of a gradient element could overflow AdamW's second moment, so the step is not applied; lower optimizer.lr or set optimizer.grad_clip")
      [ "$1" = 0 ] || fail "grad_clip $1: refused for a norm too large, but clipping bounds the moments: '$msg'" ;;
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
[ "$rc" -eq 2 ] || fail "weights with an inf: exit $rc, expected 2 (an input error)"
case "$err" in
  *"init.from $tmp/w.safetensors: tensor '"*"' holds a non-finite value (inf at element 0): a run cannot start from these weights"*) ;;
  *) fail "weights with an inf: '$err'" ;;
esac
# Non-finite steps never reach a checkpoint: a diverging run saving after every step keeps only
# finite checkpoints (ckpt verify checks every element), the newest being the last applied step.
"$tycho" run plans/tiny.lua --set optimizer.lr=1e4 --set optimizer.grad_clip=0 --set train.steps=200 --set log.every=1 \
  --set train.eval_every=0 --set checkpoint.dir="$tmp/ck" --set checkpoint.every=1 --set checkpoint.keep=1000 \
  >"$tmp/out" 2>"$tmp/err"
[ $? -eq 1 ] || fail "the diverging run with checkpoints: not exit 1"
last=$(sed -n 's/^step *\([0-9]*\)\/200 .*/\1/p' "$tmp/out" | tail -1)
newest=$(ls "$tmp/ck" | grep -v tmp | tail -1)
[ "$newest" = "$(printf 'step_%08d' "$last")" ] || fail "the newest checkpoint $newest is not the last applied step $last"
ls -d "$tmp"/ck/*.tmp >/dev/null 2>&1 && fail "a .tmp folder was left"
for c in "$tmp"/ck/step_*; do
  "$tycho" ckpt verify "$c" >"$tmp/v" 2>&1 || fail "$(basename "$c") does not verify: $(cat "$tmp/v")"
  grep -q "every element finite, the largest weight" "$tmp/v" || fail "ckpt verify does not report finiteness"
done

# A checkpoint holding an inf (its checksum made to match) is refused by ckpt verify and by a
# resume, naming the tensor (perl patches the first piece of rank_00000.bin and its manifest entry).
c=$(printf '%s/ck/step_%08d' "$tmp" 1)
perl -e '
  my ($dir) = @ARGV;
  open(my $mf, "<", "$dir/manifest.json") or die; local $/; my $m = <$mf>; close $mf;
  $m =~ /"kind":"param","file":0,"offset":0,"block":\[[^]]*\],"range":\[(\d+),(\d+)\],"fnv1a64":"([0-9a-f]+)"/ or die "no piece";
  my ($lo, $hi, $old) = ($1, $2, $3);
  my $f64 = $m =~ /"dtype":"F64"/;                    # the float64 build writes 8-byte elements
  open(my $f, "+<:raw", "$dir/rank_00000.bin") or die; read($f, my $bytes, ($hi - $lo) * ($f64 ? 8 : 4));
  substr($bytes, 0, $f64 ? 8 : 4) = $f64 ? pack("VV", 0, 0x7ff00000) : pack("V", 0x7f800000);
  seek($f, 0, 0); print $f $bytes; close $f;
  my ($H, $L) = (0xcbf29ce4, 0x84222325);            # FNV-1a 64 in 32-bit halves
  for my $b (unpack("C*", $bytes)) {
    $L ^= $b;
    my $t = $L * 0x1b3;
    my $nL = $t & 0xffffffff;
    $H = ($H * 0x1b3 + $L * 0x100 + int($t / 4294967296)) & 0xffffffff;
    $L = $nL;
  }
  my $new = sprintf("%08x%08x", $H, $L);
  $m =~ s/"fnv1a64":"$old"/"fnv1a64":"$new"/;
  open($mf, ">", "$dir/manifest.json") or die; print $mf $m; close $mf;
' "$c" || fail "could not patch the checkpoint"
"$tycho" ckpt verify "$c" >"$tmp/v" 2>&1 && fail "ckpt verify passed a checkpoint holding an inf"
grep -q "checkpoint $c: element \[0, 0\] of .* (param) is inf" "$tmp/v" || fail "ckpt verify: '$(cat "$tmp/v")'"
rm -rf "$tmp/ck1" && mkdir "$tmp/ck1" && cp -r "$c" "$tmp/ck1/"
"$tycho" run plans/tiny.lua --set train.steps=3 --set train.eval_every=0 --set optimizer.lr=1e4 --set optimizer.grad_clip=0 \
  --set checkpoint.dir="$tmp/ck1" >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] || fail "a resume from a checkpoint holding an inf: not exit 2 (an input error)"
grep -q "the param of .* holds inf (element 0 of this rank's range): the run that saved it had diverged" "$tmp/err" ||
  fail "resume from inf: '$(cat "$tmp/err")'"
echo "ok: non-finite runs"
