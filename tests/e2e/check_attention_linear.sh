#!/usr/bin/env bash
# The attention keeps O(T · d) per layer (each query row's log-sum-exp and its output, no (T, T)
# matrix), so `tycho check` bills a one-layer plan's activations linear in the sequence: at seq
# 4096 about twice those at seq 2048, not four times (plans/tiny.lua cut to one layer: 8 heads,
# micro-batch 8; with the probabilities kept the ratio was 3.75). The workspace grows at most as
# much (the attention's scratch is fixed blocks per head; with the probabilities kept: 3.80).
# usage: check_attention_linear.sh TYCHO   (run from the source folder)
set -u
tycho=$1
failed=0
fail() { echo "FAIL: $*"; failed=1; }

# mem T: "activations workspace" of the one-layer plan at seq T
mem() {
  "$tycho" check plans/tiny.lua --set model.n_layers=1 --set model.max_seq=4096 --set batch.seq="$1" \
    --json | perl -MJSON::PP -e 'local $/; my $m = decode_json(<STDIN>)->{memory}{per_pp_rank}[0];
      print "$m->{activations} $m->{workspace}\n"'
}
read -r a2 w2 < <(mem 2048) || true
read -r a4 w4 < <(mem 4096) || true
[ -n "${a2:-}" ] && [ -n "${a4:-}" ] || { echo "FAIL: check --json gave no memory figures"; exit 1; }
echo "activations: seq 2048 $a2 bytes, seq 4096 $a4; workspace $w2, $w4"
ratio() { perl -e 'printf "%.4f", $ARGV[1] / $ARGV[0]' "$1" "$2"; }
ra=$(ratio "$a2" "$a4") rw=$(ratio "$w2" "$w4")
perl -e 'exit !($ARGV[0] >= 1.95 && $ARGV[0] <= 2.05)' "$ra" ||
  fail "activations grow $ra× from seq 2048 to 4096, want about 2×"
perl -e 'exit !($ARGV[0] <= 2.05)' "$rw" ||
  fail "workspace grows $rw× from seq 2048 to 4096, want at most about 2×"
[ $failed -eq 0 ] && echo "ok: activations ×$ra, workspace ×$rw"
exit $failed
