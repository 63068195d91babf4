#!/usr/bin/env bash
# The layering check (scripts/check-layering.sh, run by every build) holds: the tree as it is
# passes; a copy with one wrong-way include (plan/ reaching up into runtime/), or one that reaches
# a bindings header by its bare name, or one that has text/ (the tokenizers, util/ only) reach
# into data/, fails with exit 1 naming the file, the line and the arrow;
# a table with a cycle between folders fails too. The table is the build's (layers.txt, written
# from TYCHO_LAYERS in CMakeLists.txt, beside the binary).
# usage: layering.sh TYCHO   (run from the source folder)
set -u
table=$(dirname "$1")/layers.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
[ -r "$table" ] || fail "no table at $table"
sh scripts/check-layering.sh . "$table" || fail "the tree itself breaks the layering"

mkdir "$tmp/tree"
cp -r host bindings "$tmp/tree/"
sh scripts/check-layering.sh "$tmp/tree" "$table" || fail "the copy breaks the layering"
n=$(($(wc -l < "$tmp/tree/host/plan/plan.c") + 1))
echo '#include "runtime/train/train.h"' >> "$tmp/tree/host/plan/plan.c"
out=$(sh scripts/check-layering.sh "$tmp/tree" "$table" 2>&1); rc=$?
[ "$rc" -eq 1 ] || fail "wrong-way include: exit $rc, expected 1 ($out)"
want="host/plan/plan.c:$n: wrong-way include \"runtime/train/train.h\": plan -> runtime (plan may include: lua util)"
case "$out" in *"$want"*) ;; *) fail "'$out' lacks '$want'" ;; esac
case "$out" in *"layering: 1 wrong-way include(s)"*) ;; *) fail "'$out' lacks the count" ;; esac

cp host/plan/plan.c "$tmp/tree/host/plan/plan.c"
echo '#include "tycho_runtime.h"' >> "$tmp/tree/host/sched/sched.c"
n=$(wc -l < "$tmp/tree/host/sched/sched.c")
out=$(sh scripts/check-layering.sh "$tmp/tree" "$table" 2>&1); rc=$?
[ "$rc" -eq 1 ] || fail "bare bindings include: exit $rc, expected 1 ($out)"
case "$out" in *"host/sched/sched.c:$n: wrong-way include \"tycho_runtime.h\": sched -> bindings"*) ;;
  *) fail "'$out' lacks the bindings arrow" ;; esac

cp host/sched/sched.c "$tmp/tree/host/sched/sched.c"
# text/ (the tokenizers) may use util/ alone: reaching into data/ is a wrong-way include
echo '#include "data/tokens.h"' >> "$tmp/tree/host/text/tokenizer.c"
n=$(wc -l < "$tmp/tree/host/text/tokenizer.c")
out=$(sh scripts/check-layering.sh "$tmp/tree" "$table" 2>&1); rc=$?
[ "$rc" -eq 1 ] || fail "text reaching data: exit $rc, expected 1 ($out)"
case "$out" in *"host/text/tokenizer.c:$n: wrong-way include \"data/tokens.h\": text -> data (text may include: util)"*) ;;
  *) fail "'$out' lacks the text arrow" ;; esac
cp host/text/tokenizer.c "$tmp/tree/host/text/tokenizer.c"
sed 's/^util:.*/util: plan/' "$table" > "$tmp/cycle.txt"
out=$(sh scripts/check-layering.sh "$tmp/tree" "$tmp/cycle.txt" 2>&1); rc=$?
[ "$rc" -eq 1 ] || fail "cyclic table: exit $rc, expected 1 ($out)"
case "$out" in *"layering: the table has a cycle among:"*" util"*) ;; *) fail "'$out' lacks the cycle" ;; esac
case "$out" in *" plan"*) ;; *) fail "'$out' does not name plan in the cycle" ;; esac
echo ok
