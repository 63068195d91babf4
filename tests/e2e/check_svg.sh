#!/usr/bin/env bash
# `tycho check PLAN --svg FILE`: the picture of the step. For plans/llama2_70b.lua on 64 ranks (on
# the H100 cluster file and without one) and a pp-2 plan with an uneven layer split under each
# schedule kind (gpipe, 1f1b, interleaved with recompute, zb-h1): the file is well-formed XML (xmllint),
# each pipeline rank's blocks (class "blk K mbM rR cC") come in the same count and order as the
# simulator's compute lists of `check --json` (forward, backward, recompute; zb-h1's B and W), the bubble and the
# makespan are the ones check prints, there is one memory bar per category check shows and pp
# rank, and rsvg-convert renders it (where installed). A plan name with & < > " is escaped. A
# symbolic link at FILE is refused with exit 2 and its target left as it was; so are a folder
# and a missing folder; nothing is printed before the refusal. zb-h1 on the 70B plan prints a
# smaller bubble than 1f1b's, its timeline and picture show W blocks, and the memory table adds its
# W-held line.
# usage: check_svg.sh TYCHO   (run from the source folder)
set -u
tycho=$(readlink -f "$1")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
command -v xmllint >/dev/null || { echo "skipped: no xmllint (scripts/install-deps.sh installs libxml2-utils)"; exit 77; }
rsvg=$(command -v rsvg-convert || true)
[ -n "$rsvg" ] || echo "note: no rsvg-convert (librsvg2-bin): the pictures are not rendered"

# "rR K<mb> cC" per compute block, in each rank's order: from check --json's schedule ...
json_blocks() {
  tr -d ' \n' | grep -o -E '"rank":[0-9]+,"busy"|"op":"(fwd|bwd|bwd_b|bwd_w|recompute)","stage":[0-9]+,"chunk":[0-9]+,"mb":[0-9]+' |
    awk -F'[:,"]+' '/busy/ { r = $3; next }
      { k = $3 == "fwd" ? "F" : $3 == "bwd" || $3 == "bwd_b" ? "B" : $3 == "bwd_w" ? "W" : "R"; print "r" r " " k $9 " c" $7 }'
}
# ... and from the picture's blocks
svg_blocks() {
  grep -o 'class="blk [FBRW] mb[0-9]* r[0-9]* c[0-9]*"' "$1" |
    sed -E 's/class="blk ([FBRW]) mb([0-9]+) r([0-9]+) c([0-9]+)"/r\3 \1\2 c\4/'
}

# one picture: PLAN, its name for messages, then check's arguments
picture() {
  local name=$1; shift
  local svg="$tmp/$name.svg"
  "$tycho" check "$@" --svg "$svg" >"$tmp/$name.txt" 2>"$tmp/$name.err" || fail "$name: exit $? ($(cat "$tmp/$name.err"))"
  [ -s "$tmp/$name.err" ] && fail "$name: stderr: $(cat "$tmp/$name.err")"
  grep -q "^svg        wrote $svg " "$tmp/$name.txt" || fail "$name: check does not say it wrote $svg"
  xmllint --noout "$svg" 2>"$tmp/$name.xml" || fail "$name: not well-formed XML: $(head -3 "$tmp/$name.xml")"
  "$tycho" check "$@" --json >"$tmp/$name.json" || fail "$name: check --json failed"
  json_blocks <"$tmp/$name.json" >"$tmp/$name.want"
  svg_blocks "$svg" >"$tmp/$name.got"
  [ -s "$tmp/$name.want" ] || fail "$name: no compute instructions in check --json"
  diff "$tmp/$name.want" "$tmp/$name.got" >"$tmp/$name.diff" ||
    fail "$name: blocks differ from the simulator's lists (json < > svg): $(head -5 "$tmp/$name.diff")"
  # the bubble and makespan as check prints them (its timeline, where pp > 1)
  local bubble makespan
  bubble=$(grep -o 'bubble [0-9.]*% (idle / (pp × makespan)) = [0-9.]*% of the ideal time (idle / busy)' "$tmp/$name.txt")
  makespan=$(grep -o '^makespan [0-9.e+]*' "$tmp/$name.txt")
  [ -n "$bubble" ] && [ -n "$makespan" ] || fail "$name: check printed no bubble"
  grep -qF "$bubble" "$svg" || fail "$name: the picture lacks '$bubble'"
  grep -qF "$makespan units" "$svg" || fail "$name: the picture lacks '$makespan'"
  # one bar segment per category the bill shows, per pipeline rank
  local pp cats
  pp=$(grep -o -E '^mesh .* pp [0-9]+ ' "$tmp/$name.txt" | grep -o -E '[0-9]+ $' | tr -d ' ')
  cats=$(sed -n '/^   pp rank  stages/{s/   pp rank  stages *//;s/ *total.*//;p;q}' "$tmp/$name.txt" | wc -w)
  [ "$(grep -c 'class="mem ' "$svg")" -eq $((pp * cats)) ] ||
    fail "$name: $(grep -c 'class="mem ' "$svg") memory segments, expected $pp pp ranks × $cats categories"
  if [ -n "$rsvg" ]; then
    "$rsvg" -o "$tmp/$name.png" "$svg" 2>"$tmp/$name.rsvg" || fail "$name: rsvg-convert failed: $(cat "$tmp/$name.rsvg")"
    [ -s "$tmp/$name.png" ] || fail "$name: rsvg-convert wrote nothing"
  fi
}

picture llama70b plans/llama2_70b.lua --world 64
picture llama70b_h100 plans/llama2_70b.lua --world 64 --cluster plans/clusters/h100_80g_ib.lua
grep -q 's per step' "$tmp/llama70b_h100.svg" || fail "the picture on a cluster has no step time"
grep -q 'class="capacity"' "$tmp/llama70b_h100.svg" || fail "the picture on a cluster has no device-memory line"
grep -q 'class="capacity"' "$tmp/llama70b.svg" && fail "a device-memory line without a cluster"
grep -q 'no step time without --cluster' "$tmp/llama70b.svg" || fail "the picture without a cluster does not say it has no time"

# a pp-2 plan of uneven stages (embed + 1 layer, then 4 layers + head) under every schedule kind
uneven=tests/plans/good/pp_uneven.lua
picture gpipe "$uneven" --world 2 --set schedule.kind=gpipe
picture 1f1b "$uneven" --world 2 --set schedule.kind=1f1b --set 'name=a & <b> "c"'
picture interleaved "$uneven" --world 2 --set schedule.kind=interleaved --set virtual_stages=2 \
  --set "stages={{'embed',0},{1},{2},{3,4,'head'}}" --set recompute=full
grep -q 'class="blk R ' "$tmp/interleaved.svg" || fail "recompute=full drew no recompute block"
grep -q 'class="blk F mb[0-9]* r1 c1"' "$tmp/interleaved.svg" || fail "interleaved: no block of chunk 1"
picture zb "$uneven" --world 2 --set schedule.kind=zb-h1
grep -q 'class="blk W mb1 r1 c0"' "$tmp/zb.svg" || fail "zb-h1: no W block"
grep -q '"op": *"bwd_w"' "$tmp/zb.json" || fail "zb-h1: check --json has no bwd_w"
# zero-bubble on the 70B plan: a smaller bubble than 1F1B's, W in the timeline, the W-held memory
picture llama70b_zb plans/llama2_70b.lua --world 64 --set schedule.kind=zb-h1
pct() { grep -o -E '^makespan [0-9.]+, bubble [0-9.]+%' "$1" | grep -o -E '[0-9.]+%$' | tr -d %; }
b1=$(pct "$tmp/llama70b.txt") bz=$(pct "$tmp/llama70b_zb.txt")
awk -v a="$bz" -v b="$b1" 'BEGIN { exit !(a > 0 && a < b) }' || fail "70B: zb-h1 bubble $bz% is not below 1f1b's $b1%"
grep -q '^F<mb> forward, B<mb> backward (its input gradient), W<mb> weight gradient' "$tmp/llama70b_zb.txt" ||
  fail "70B zb-h1: the timeline has no W legend"
grep -q '^   W-held   zb-h1: after B' "$tmp/llama70b_zb.txt" || fail "70B zb-h1: no W-held memory line"
grep -q -E '^ +3  3 more micro-batches in flight than 1F1B \(their slots\) \+ 4 past B × [0-9.]+ GiB' "$tmp/llama70b_zb.txt" ||
  fail "70B zb-h1: rank 3's W-held line: $(grep -A5 W-held "$tmp/llama70b_zb.txt")"
grep -q 'W-held' "$tmp/llama70b.txt" && fail "a W-held line under 1f1b"
# on a cluster the step-time model prices it too: faster than 1F1B's step
h100=plans/clusters/h100_80g_ib.lua
secs() { "$tycho" check plans/llama2_70b.lua --world 64 --cluster $h100 "$@" | grep -o -E '[0-9.]+ s per step' | tr -dc '0-9.'; }
s1=$(secs) sz=$(secs --set schedule.kind=zb-h1)
awk -v a="$sz" -v b="$s1" 'BEGIN { exit !(a > 0 && a < b) }' || fail "70B on H100: zb-h1 step $sz s is not below 1f1b's $s1 s"
grep -q '<title>a &amp; &lt;b&gt; &quot;c&quot;: tp 1 × pp 2' "$tmp/1f1b.svg" || fail "the plan's name is not escaped"
# uneven: rank 1's forward (4 layers and the head) is longer than rank 0's (1 layer)
w0=$(grep -o 'class="blk F mb0 r0 c0"[^>]*width="[0-9.]*"' "$tmp/1f1b.svg" | grep -o 'width="[0-9.]*"' | tr -dc '0-9.')
w1=$(grep -o 'class="blk F mb0 r1 c0"[^>]*width="[0-9.]*"' "$tmp/1f1b.svg" | grep -o 'width="[0-9.]*"' | tr -dc '0-9.')
awk -v a="$w0" -v b="$w1" 'BEGIN { exit !(a > 0 && b > 2 * a) }' || fail "uneven stages: forward widths $w0 and $w1"

# refusals: exit 2, nothing on stdout, the target of a link untouched
echo keep >"$tmp/target"
ln -s "$tmp/target" "$tmp/link.svg"
"$tycho" check "$uneven" --world 2 --svg "$tmp/link.svg" >"$tmp/out" 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] || fail "--svg at a symbolic link: exit $rc, expected 2 ($(cat "$tmp/err"))"
grep -q "is a symbolic link" "$tmp/err" || fail "--svg at a link: '$(cat "$tmp/err")'"
[ "$(cat "$tmp/target")" = keep ] && [ -L "$tmp/link.svg" ] || fail "--svg at a link changed the link or its target"
[ -s "$tmp/out" ] && fail "--svg at a link printed before refusing: $(head -2 "$tmp/out")"
for bad in "$tmp" "$tmp/no/such/folder/x.svg"; do
  "$tycho" check "$uneven" --world 2 --svg "$bad" >"$tmp/out" 2>"$tmp/err"; rc=$?
  [ "$rc" -eq 2 ] || fail "--svg $bad: exit $rc, expected 2 ($(cat "$tmp/err"))"
  grep -q "^tycho: --svg $bad" "$tmp/err" || fail "--svg $bad: '$(cat "$tmp/err")'"
done
"$tycho" check "$uneven" --world 2 --svg >/dev/null 2>"$tmp/err"; rc=$?
[ "$rc" -eq 2 ] || fail "--svg without a file: exit $rc"
"$tycho" tune "$uneven" --world 2 --svg "$tmp/t.svg" >/dev/null 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "tune --svg: exit $rc, expected 2 (check's option only)"
"$tycho" check --help | grep -q -- '--svg FILE' || fail "tycho check --help does not describe --svg"
echo ok
