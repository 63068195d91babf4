#!/usr/bin/env bash
# `tycho check` says once which runtime its byte figures describe (the `device` line, the JSON's
# runtime/runtime_note), and every figure agrees with that one statement:
#  - the tp table's element sizes are the ones the traffic moves: Σ of tp_comm's collectives × the
#    micro-batches + the norm's all-gather (8·tp bytes) = the step's tp traffic, byte for byte —
#    for a plan in bf16 too, whose conversions move bf16 and whose loss statistics and gains' sums
#    move the runtime's reals (it once printed 2-byte elements in the table and 4-byte ones in the
#    traffic);
#  - a stage boundary moves the activations' element between pipeline stages (bf16 in a bf16
#    plan, the runtime's real in fp32);
#  - the element names of the memory line are the runtime's (the CPU's fp32 is this build's real:
#    float64 in the proof build; the GPU's bf16 mode is the CPU's: bf16 copies as params (the fp32 master is optimizer state),
#    its tensors moved as fp32);
#  - no other line of the text makes a statement of its own about the runtime.
# usage: check_runtime_statement.sh TYCHO   (run from the source folder)
set -u
tycho=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }
real=fp32 real_bytes=4
"$tycho" --version | grep -q "float64 kernels" && real=float64 real_bytes=8

# case NAME RUNTIME ELEMENT_BYTES PARAMS_NAME ARGS...: `tycho check ARGS` (text and JSON)
case_() {
  local name=$1 runtime=$2 eb=$3 params=$4
  shift 4
  "$tycho" check "$@" --json >"$tmp/c.json" 2>"$tmp/err" || { fail "$name: check --json failed: $(cat "$tmp/err")"; return; }
  "$tycho" check "$@" >"$tmp/c.txt" 2>"$tmp/err" || { fail "$name: check failed: $(cat "$tmp/err")"; return; }
  local got
  got=$(perl -MJSON::PP -e '
    local $/; my $d = decode_json(<STDIN>);
    my $t = $d->{tp_comm}; my $sum = 0;
    $sum += $_->{bytes} for @{$t->{collectives}};
    for (@{$t->{collectives}}) { die "bytes != elements x element_bytes\n"
      if $_->{bytes} != $_->{elements} * $_->{element_bytes};
      # the conversions move the activations element; the loss statistics and gains sums are reals
      die "$_->{what}: $_->{element_bytes}-byte elements, the activations are $t->{bytes_per_element}\n"
        if $_->{what} !~ /^(cross-entropy|norm gains|final_norm gain)/ && $_->{element_bytes} != $t->{bytes_per_element} }
    my $tp = $d->{plan}{mesh}{tp}; my $m = $d->{plan}{schedule}{microbatches};
    my $traffic = 0; $traffic += $_->{bytes} for values %{$d->{traffic_per_step}[0]{tp}};
    my $want = $tp > 1 ? $sum * $m + 8 * $tp : 0;
    print "$d->{runtime} $t->{bytes_per_element} $traffic $want\n";' <"$tmp/c.json") ||
    { fail "$name: the JSON does not read"; return; }
  set -- $got
  [ "$1" = "$runtime" ] || fail "$name: runtime \"$1\", expected \"$runtime\""
  [ "$2" = "$eb" ] || fail "$name: tp_comm.bytes_per_element $2, expected $eb"
  [ "$3" = "$4" ] && [ "$3" != 0 ] && echo "ok   $name: tp table ($2-byte elements) × micro-batches = tp traffic ($3 B)" ||
    fail "$name: the tp traffic moves $3 B, the tp table × micro-batches + the norm's gather $4 B"
  grep -q "^tp comm .*(activations in $eb-byte elements)" "$tmp/c.txt" ||
    fail "$name: the text's tp comm line lacks (activations in $eb-byte elements)"
  grep -q "^memory     per rank, .*(params $params" "$tmp/c.txt" && echo "ok   $name: memory line says params $params" ||
    fail "$name: the memory line does not say params $params: $(grep '^memory' "$tmp/c.txt")"
  # the runtime is named on the line after "device" only
  local others
  others=$(awk '/^device/ { d = NR } /runtime.s|this runtime/ && NR != d + 1 { print NR": "$0 }' "$tmp/c.txt")
  [ -z "$others" ] && echo "ok   $name: the runtime is stated once, under device" ||
    fail "$name: other lines state the runtime: $others"
}

small=tests/plans/good/dp_small.lua
case_ "cpu fp32 tp 2" cpu $real_bytes $real $small --world 2 --set mesh.tp=2
case_ "cpu bf16 tp 2" cpu 2 "bf16 copies" $small --world 2 --set mesh.tp=2 --set precision.compute=bf16
case_ "cuda 7B tp 2" cuda 2 "bf16 copies" plans/llama2_7b.lua --world 16
case_ "cpu 7B tp 2" cpu 2 "bf16 copies" plans/llama2_7b.lua --world 16 --set device=cpu
# pp_case NAME ELEMENT_BYTES ARGS...: a stage boundary (micro × seq × dim) moves ELEMENT_BYTES an
# element between stages: a bf16 plan's in bf16 (exec.c's pp wire), an fp32 plan's as reals
pp_case() {
  local name=$1 eb=$2 got
  shift 2
  got=$("$tycho" check "$@" --json | perl -MJSON::PP -e 'local $/; my $d = decode_json(<STDIN>);
    my $s = $d->{traffic_per_step}[0]{pp}{send}; my $b = $d->{plan}{batch};
    printf "%d %d\n", $s->{bytes} / $s->{calls}, $b->{micro} * $b->{seq} * $d->{plan}{model}{dim}') ||
    { fail "$name: check --json"; return; }
  set -- $got
  [ "$1" = "$(($2 * eb))" ] && echo "ok   $name: a stage boundary of $2 elements moves $1 B" ||
    fail "$name: a stage boundary of $2 elements moves $1 B, expected $(($2 * eb))"
}
pp_case "cpu fp32 pp 2" $real_bytes $small --world 2 --set mesh.pp=2
pp_case "cpu bf16 pp 2" 2 $small --world 2 --set mesh.pp=2 --set precision.compute=bf16
[ $failed -eq 0 ] && echo "every byte figure agrees with the one statement of the runtime"
exit $failed
