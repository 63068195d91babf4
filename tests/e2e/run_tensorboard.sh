#!/usr/bin/env bash
# log.tensorboard: a run writes DIR/events.out.tfevents.<time>.<host>.tycho whose records are
# framed and checksummed as TensorBoard wants (tfevents, a reader of its own that checks every
# length and CRC32C) and whose scalars are the metrics lines' numbers: train/<key> at step s + 1,
# eval/loss and eval/accuracy, memory/<category> and memory/held/<category> at the last step —
# each equal, to float32 rounding, to the value log.metrics has for that step, as tfevents reads
# it and, where a venv with pip's `tensorboard` can be made, as TensorBoard's own EventAccumulator
# reads it (the sparse layers' moe/... tags too). A run interrupted after step 6 and resumed from
# its step-4 checkpoint adds a second file starting with a SessionLog START at step 5, and
# TensorBoard then shows steps 1..8 once each, with the values of an uninterrupted run. With
# tensorboard_ranks "all" each of two ranks writes DIR/rank<N>/. A symbolic link at DIR, or at
# DIR/rank0, is refused with exit 2 and nothing is written through it; a missing parent is an
# error naming the folder.
# usage: run_tensorboard.sh TYCHO   (run from the source folder; $TYCHO_TFEVENTS is the reader)
set -u
tycho=$1
tfevents=${TYCHO_TFEVENTS:?the tfevents reader (tests/tools/tfevents.c)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in out err; do [ -f "$tmp/$f" ] && { echo "--- $f"; tail -20 "$tmp/$f"; }; done; exit 1; }
base=(--set train.steps=8 --set log.every=1 --set train.eval_every=4 --set train.eval_batches=1)
run() { "$tycho" run plans/tiny.lua "${base[@]}" "$@" >"$tmp/out" 2>"$tmp/err"; }

# expected STEP TAG VALUE lines from a metrics file (flat keys; the last line of a step wins, as a
# resumed run's lines follow the interrupted run's in the file)
expected() {
  awk '
    function pairs(s, prefix, step,    k, v) {
      while (match(s, /"[a-z_]+": (-?[0-9.eE+-]+|true)/)) {
        k = substr(s, RSTART + 1, RLENGTH); sub(/".*/, "", k)
        v = substr(s, RSTART, RLENGTH); sub(/.*: /, "", v); if (v == "true") v = 1
        s = substr(s, RSTART + RLENGTH)
        if (k == "step" || k == "rank") continue
        if (prefix == "eval" && k == "val_loss") k = "loss"
        val[step " " prefix "/" k] = v
      }
    }
    /"event": "memory"/ { if ($0 !~ /"rank": 0,/) next
      split($0, h, /"held": /); pairs(h[1], "memory", last); pairs(h[2], "memory/held", last); next }
    { match($0, /"step": [0-9]+/); s = substr($0, RSTART + 8, RLENGTH - 8) + 0 }
    /"loss"/ { last = s + 1; pairs($0, "train", s + 1); next }
    { pairs($0, "eval", s) }
    END { for (k in val) print k, val[k] }' "$1" | sort
}
# compare WANT GOT: the same step-tag pairs, once each, values equal to a relative 1e-6 (float32)
compare() {
  local dups
  dups=$(awk '{print $1, $2}' "$2" | sort | uniq -d | head -3)
  [ -z "$dups" ] || fail "$3: steps written twice: $dups"
  awk -v what="$3" '
    NR == FNR { want[$1 " " $2] = $3; next }
    { k = $1 " " $2; if (!(k in want)) { print what ": unexpected scalar " k " = " $3; bad = 1; next }
      w = want[k]; d = w - $3; if (d < 0) d = -d; m = w < 0 ? -w : w
      if (d > 1e-6 * m + 1e-30) { print what ": " k " is " $3 ", the metrics have " w; bad = 1 }
      seen[k] = 1 }
    END { for (k in want) if (!(k in seen)) { print what ": no scalar " k " (metrics: " want[k] ")"; bad = 1 }
          exit bad }' "$1" "$2" || fail "$3: the scalars differ from the metrics"
}

# (a) an uninterrupted run: the file's framing, and its scalars against the metrics
run --set log.metrics="$tmp/a.jsonl" --set log.tensorboard="$tmp/a" || fail "the run with log.tensorboard failed"
files=("$tmp"/a/*)
[ ${#files[@]} -eq 1 ] || fail "expected one file in DIR, found: $(ls "$tmp/a")"
case ${files[0]##*/} in events.out.tfevents.[0-9]*."$(hostname)".tycho) ;; *) fail "file name ${files[0]##*/}" ;; esac
"$tfevents" "${files[0]}" >"$tmp/a.events" 2>"$tmp/err" || fail "the event file's framing: $(cat "$tmp/err")"
[ "$(head -2 "$tmp/a.events" | tr '\n' ' ')" = "version brain.Event:2 start 1 " ] ||
  fail "the file does not open with the file version and a START at step 1: $(head -2 "$tmp/a.events")"
grep '^scalar ' "$tmp/a.events" | cut -d' ' -f2- | sort >"$tmp/a.got"
expected "$tmp/a.jsonl" >"$tmp/a.want"
grep -q '^8 eval/accuracy ' "$tmp/a.want" && grep -q '^4 eval/loss ' "$tmp/a.want" &&
  grep -q '^8 memory/params ' "$tmp/a.want" && grep -q '^8 memory/held/params ' "$tmp/a.want" &&
  grep -q '^1 train/grad_norm ' "$tmp/a.want" || fail "the metrics lack what the test compares: $(cat "$tmp/a.want")"
compare "$tmp/a.want" "$tmp/a.got" "tfevents reading the run"

# (c) interrupted after step 6 (checkpoint at 4), resumed to 8 into the same DIR and metrics
ck=(--set checkpoint.dir="$tmp/ck" --set checkpoint.every=4 --set log.metrics="$tmp/r.jsonl" --set log.tensorboard="$tmp/r")
TYCHO_TEST_LEAVE_AFTER_STEP=5 run "${ck[@]}" || fail "the interrupted run failed"
[ "$(ls "$tmp/ck")" = step_00000004 ] || fail "the interrupted run left $(ls "$tmp/ck"), not step_00000004"
sleep 1 # a later second for the second file's name (the same second takes the next one anyway)
run "${ck[@]}" || fail "the resumed run failed"
grep -q "resumed from .*step_00000004" "$tmp/out" || fail "the run did not resume from step 4"
mapfile -t files < <(ls "$tmp"/r/* | sort)
[ ${#files[@]} -eq 2 ] || fail "a resumed run adds a file: found $(ls "$tmp/r")"
"$tfevents" "${files[1]}" >"$tmp/r2.events" 2>"$tmp/err" || fail "the resumed file's framing: $(cat "$tmp/err")"
[ "$(sed -n 2p "$tmp/r2.events")" = "start 5" ] || fail "the resumed file does not START at step 5"
[ "$(grep '^scalar ' "$tmp/r2.events" | awk '{print $2}' | sort -un | tr '\n' ' ')" = "5 6 7 8 " ] ||
  fail "the resumed file's steps are not 5..8"
"$tfevents" "${files[0]}" >/dev/null 2>"$tmp/err" || fail "the interrupted file's framing: $(cat "$tmp/err")"

# (d) a symbolic link at DIR (or, for every rank, at DIR/rank0): exit 2, nothing through it
mkdir "$tmp/real"
ln -s "$tmp/real" "$tmp/link"
run --set train.steps=2 --set log.tensorboard="$tmp/link"
[ $? -eq 2 ] || fail "a link at log.tensorboard: exit code not 2"
grep -q "log.tensorboard $tmp/link: is a symbolic link" "$tmp/err" || fail "a link at DIR: no message"
grep -q '^step' "$tmp/out" && fail "a link at DIR: a step ran"
mkdir "$tmp/d"
ln -s "$tmp/real" "$tmp/d/rank0"
run --set train.steps=2 --set log.tensorboard="$tmp/d" --set log.tensorboard_ranks=all
[ $? -eq 2 ] || fail "a link at DIR/rank0: exit code not 2"
grep -q "log.tensorboard $tmp/d/rank0: is a symbolic link" "$tmp/err" || fail "a link at DIR/rank0: no message"
[ -z "$(ls -A "$tmp/real")" ] || fail "something was written through the link: $(ls -A "$tmp/real")"
run --set train.steps=2 --set log.tensorboard="$tmp/none/tb"
[ $? -eq 1 ] || fail "a missing parent folder: exit code not 1"
grep -q "log.tensorboard $tmp/none/tb: cannot make the folder: No such file or directory (its parent folder must exist)" \
  "$tmp/err" || fail "a missing parent folder: no message"
"$tycho" check plans/tiny.lua --set log.tensorboard="$tmp/x" >"$tmp/out" 2>"$tmp/err" || fail "check failed"
grep -q "^log .*tensorboard $tmp/x" "$tmp/out" || fail "tycho check does not list the tensorboard folder"
"$tycho" check plans/tiny.lua --world 1 --cluster tests/slurm/local4.lua --sbatch --set log.tensorboard="$tmp/x" \
  >"$tmp/out" 2>"$tmp/err" || fail "check --sbatch failed"
grep -qx "# tensorboard: $tmp/x" "$tmp/out" || fail "the batch script does not name the tensorboard folder"
"$tycho" check plans/tiny.lua --set log.tensorboard="$tmp/x" --set log.tensorboard_ranks=0 >"$tmp/out" 2>"$tmp/err" ||
  fail "log.tensorboard_ranks=0 (an integer) refused"
"$tycho" check plans/tiny.lua --set log.tensorboard="$tmp/x" --set log.tensorboard_ranks=2 >"$tmp/out" 2>"$tmp/err"
[ $? -eq 2 ] && grep -q 'log.tensorboard_ranks = 2: must be one of "0", "all"' "$tmp/err" ||
  fail "log.tensorboard_ranks=2: not refused with exit 2 and the names"

# every rank, in DIR/rank<N>/: two data-parallel ranks, the same losses in both files
if command -v mpirun >/dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  timeout 300 mpirun -np 2 "$tycho" run plans/tiny.lua --set train.steps=3 --set mesh.dp=2 \
    --set log.metrics="$tmp/m.jsonl" --set log.tensorboard="$tmp/all" --set log.tensorboard_ranks=all \
    >"$tmp/out" 2>"$tmp/err" || fail "the 2-rank run with tensorboard_ranks=all failed"
  for r in 0 1; do
    set -- "$tmp/all/rank$r"/events.out.tfevents.*
    [ $# -eq 1 ] && [ -f "$1" ] || fail "rank $r: no event file of its own in DIR/rank$r"
    "$tfevents" "$1" >"$tmp/rank$r.events" 2>"$tmp/err" || fail "rank $r's file: $(cat "$tmp/err")"
    grep '^scalar [0-9]* train/loss ' "$tmp/rank$r.events" | cut -d' ' -f2- >"$tmp/rank$r.loss"
    grep -q '^scalar 3 memory/params ' "$tmp/rank$r.events" || fail "rank $r: no memory/params of its own"
  done
  [ -s "$tmp/rank0.loss" ] && cmp -s "$tmp/rank0.loss" "$tmp/rank1.loss" || fail "the ranks' train/loss differ"
  expected "$tmp/m.jsonl" | grep ' train/loss ' >"$tmp/m.loss"
  compare "$tmp/m.loss" "$tmp/rank0.loss" "rank 0's train/loss"
  grep -q 'eval/' "$tmp/rank1.events" && fail "rank 1 wrote rank 0's evaluation"
fi

# (b) TensorBoard's own reader, from a venv of its own (skipped, saying why, where that fails)
venv=${XDG_CACHE_HOME:-$HOME/.cache}/tycho-test-venv
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import tensorboard' 2>/dev/null; then
  { /usr/bin/python3 -m venv --system-site-packages "$venv" && "$venv/bin/pip" install -q --timeout 20 --retries 1 tensorboard; } \
    >"$tmp/pip.txt" 2>&1
fi
if ! "$venv/bin/python" -c 'from tensorboard.backend.event_processing import event_accumulator' 2>/dev/null; then
  echo "skipped: TensorBoard's reader (no venv with pip's tensorboard: $(tail -1 "$tmp/pip.txt" 2>/dev/null))"
  exit 0
fi
# every scalar of every tag in DIR, as TensorBoard shows it (the files of a run merged)
read_tb() {
  "$venv/bin/python" - "$1" <<'PY' 2>"$tmp/err"
import sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.SCALARS: 0})
acc.Reload()
for tag in acc.Tags()["scalars"]:
    for e in acc.Scalars(tag):
        print(e.step, tag, repr(e.value))
PY
}
# the metrics' every number under its tag, nested objects (moe) included, by tensorboard.h's rule
want_py() {
  "$venv/bin/python" - "$1" <<'PY'
import json, sys
want = {}
def walk(v, tag, step):
    if isinstance(v, bool):
        if v: want[(step, tag)] = 1.0
    elif isinstance(v, (int, float)):
        want[(step, tag)] = float(v)
    elif isinstance(v, dict):
        for k, x in v.items(): walk(x, tag + "/" + k, step)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            if isinstance(x, dict) and "layer" in x:
                base = tag.rsplit("/", 1)[0] + "/layer%d" % x["layer"]
                for k, y in x.items():
                    if k != "layer": walk(y, base + "/" + k, step)
            else:
                walk(x, tag + ("/expert%d" % i if tag.endswith("/tokens") else "/%d" % i), step)
last = 0
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d.get("event") == "memory":
        if d["rank"] == 0:
            walk(d["peak"], "memory", last); walk(d["held"], "memory/held", last)
    elif "loss" in d:
        last = d["step"] + 1
        for k, v in d.items():
            if k != "step": walk(v, k if k == "moe" else "train/" + k, last)
    else:
        for k, v in d.items():
            if k != "step": walk(v, "eval/" + ("loss" if k == "val_loss" else k), d["step"])
for (s, t), v in sorted(want.items()):
    print(s, t, repr(v))
PY
}
read_tb "$tmp/a" >"$tmp/a.tb" || fail "TensorBoard's reader failed: $(tail -3 "$tmp/err")"
want_py "$tmp/a.jsonl" >"$tmp/a.want.py"
compare "$tmp/a.want.py" "$tmp/a.tb" "TensorBoard reading the run"
# the resumed folder: steps 1..8 once each, the last metrics line of each step (the resumed run's
# from step 5), and the computed values equal to the uninterrupted run's
read_tb "$tmp/r" >"$tmp/r.tb" || fail "TensorBoard's reader failed on the resumed run: $(tail -3 "$tmp/err")"
want_py "$tmp/r.jsonl" >"$tmp/r.want"
compare "$tmp/r.want" "$tmp/r.tb" "TensorBoard reading the resumed run"
[ "$(grep ' train/loss ' "$tmp/r.tb" | awk '{print $1}' | sort -n | tr '\n' ' ')" = "1 2 3 4 5 6 7 8 " ] ||
  fail "the resumed run's train/loss steps are not 1..8 once each"
for tag in train/loss train/lr train/grad_norm train/tokens eval/loss eval/accuracy; do
  grep " $tag " "$tmp/a.want.py"
done >"$tmp/a.computed"
grep -E ' (train/(loss|lr|grad_norm|tokens)|eval/(loss|accuracy)) ' "$tmp/r.tb" >"$tmp/r.computed"
compare "$tmp/a.computed" "$tmp/r.computed" "the resumed run against the uninterrupted one"
# the sparse layers' statistics: moe/aux, moe/layer<L>/..., moe/layer<L>/tokens/expert<E>
"$tycho" run plans/tiny_moe.lua --set train.steps=2 --set log.every=1 --set train.eval_every=0 \
  --set train.eval_batches=0 --set log.metrics="$tmp/moe.jsonl" --set log.tensorboard="$tmp/moe" \
  >"$tmp/out" 2>"$tmp/err" || fail "the MoE run failed"
read_tb "$tmp/moe" >"$tmp/moe.tb" || fail "TensorBoard's reader failed on the MoE run"
grep -q ' moe/layer[0-9]*/tokens/expert0 ' "$tmp/moe.tb" || fail "no moe/layer<L>/tokens/expert<E> tag"
want_py "$tmp/moe.jsonl" >"$tmp/moe.want"
compare "$tmp/moe.want" "$tmp/moe.tb" "TensorBoard reading the MoE run"
echo "ok"
