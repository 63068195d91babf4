#!/usr/bin/env bash
# `tycho run` tries everything it will write before step 1 and holds what only one run may
# write. Refused with exit 1 and no step run, naming the field and the path: export.path under a
# regular file or in /proc (a folder, a FIFO or a device there: special_files.sh); log.metrics in
# /proc or under a file; checkpoint.dir under a file; log.trace in /proc/self. A second run on
# the checkpoint.dir or log.metrics of a live run is refused naming the holder (pid, host) and
# leaves that run's step_N.tmp alone; the first run, ended by SIGTERM, gives its locks back (a
# third run takes them), and so is a REPL's t:save there. A link where a lock belongs, and a
# log.metrics that is a link, are refused with exit 2. A stale step_N.tmp is removed at start, and a checkpoint write that
# fails removes its own. A metrics write that fails mid-run (prlimit's file-size limit) names the
# path and strerror.
# usage: run_outputs.sh TYCHO   (run from the source folder)
set -u
tycho=$1
plan=tests/plans/good/train_small.lua
tmp=$(mktemp -d)
bg=
trap '[ -n "$bg" ] && kill -KILL "$bg" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- stdout"; cat "$tmp/out"; echo "--- stderr"; cat "$tmp/err"; exit 1; }
refused() { # refused TEXT ARGS...: exit $code (1 unless set) before any step, TEXT in the first stderr line
  local text=$1 rc first want=${code:-1}
  shift
  "$tycho" run "$plan" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ "$rc" -eq "$want" ] || fail "$*: exit code $rc, expected $want"
  first=$(head -n 1 "$tmp/err")
  case "$first" in *"$text"*) ;; *) fail "$*: first stderr line '$first' lacks '$text'" ;; esac
  grep -q '^step' "$tmp/out" && fail "$*: a step ran before the refusal"
  return 0
}
: >"$tmp/file"
refused "tycho: export.path $tmp/file/model.safetensors: $tmp/file: not a folder" \
  --set export.path="$tmp/file/model.safetensors"
refused "tycho: export.path /proc/model.safetensors: cannot create files in the folder /proc: " \
  --set export.path=/proc/model.safetensors
refused "tycho: export.path /proc/tycho-test/model.safetensors: cannot create the folder /proc/tycho-test: " \
  --set export.path=/proc/tycho-test/model.safetensors
refused "tycho: log.metrics /proc/metrics.jsonl: cannot create files in the folder /proc: " \
  --set log.metrics=/proc/metrics.jsonl
refused "tycho: log.metrics $tmp/file/metrics.jsonl: $tmp/file: not a folder" --set log.metrics="$tmp/file/metrics.jsonl"
refused "tycho: checkpoint.dir $tmp/file/ck: cannot create the folder $tmp/file/ck: Not a directory" \
  --set checkpoint.dir="$tmp/file/ck"
refused "tycho: log.trace /proc/self/trace.json: cannot create files in the folder /proc/self: " \
  --set log.trace=/proc/self/trace.json
echo "ok: unwritable outputs refused before step 1"

# A link where a lock belongs is refused (exit 2) naming the field, the path and the lock file,
# and nothing is written through it: a link to a file leaves the file as it was, a dangling one
# creates nothing. log.metrics itself a symbolic link, or a hard link to another file, is refused
# too (two runs would append to one file, each holding its own lock). Before, each ran and
# wrote "pid host" into the link's target.
echo precious >"$tmp/precious"
mkdir "$tmp/lk"
ln -s "$tmp/precious" "$tmp/lk/e.safetensors.lock"
ln -s "$tmp/nowhere" "$tmp/lk/m.jsonl.lock"
mkdir "$tmp/lk/ck" && ln -s "$tmp/precious" "$tmp/lk/ck/.lock"
ln -s "$tmp/precious" "$tmp/lk/linked.jsonl"
ln "$tmp/precious" "$tmp/lk/hard.jsonl"
is_link="is a symbolic link; remove it (tycho never writes a lock through a link)"
code=2
refused "tycho: plan error: export.path $tmp/lk/e.safetensors: the lock file $tmp/lk/e.safetensors.lock $is_link" \
  --set export.path="$tmp/lk/e.safetensors"
refused "tycho: plan error: log.metrics $tmp/lk/m.jsonl: the lock file $tmp/lk/m.jsonl.lock $is_link" \
  --set log.metrics="$tmp/lk/m.jsonl"
refused "tycho: plan error: checkpoint.dir $tmp/lk/ck: the lock file $tmp/lk/ck/.lock $is_link" \
  --set checkpoint.dir="$tmp/lk/ck"
refused "tycho: plan error: log.metrics $tmp/lk/linked.jsonl: is a symbolic link; give the file itself" \
  --set log.metrics="$tmp/lk/linked.jsonl"
refused "tycho: plan error: log.metrics $tmp/lk/hard.jsonl: has 2 names (hard links); give a file of its own" \
  --set log.metrics="$tmp/lk/hard.jsonl"
code=
# an output opened for writing (tune's --out here) is not written through a link either
"$tycho" tune plans/tiny.lua --world 2 --cluster plans/clusters/h100_80g_ib.lua --out "$tmp/lk/linked.jsonl" \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 2 ] && grep -qF "tycho: --out $tmp/lk/linked.jsonl: is a symbolic link; give the file itself" "$tmp/err" ||
  fail "tune --out onto a link: exit $rc"
[ "$(cat "$tmp/precious")" = precious ] || fail "a lock was written through a link: $(cat "$tmp/precious")"
[ -e "$tmp/nowhere" ] && fail "a dangling lock link made $tmp/nowhere"
echo "ok: links where locks belong, and a linked log.metrics, refused by name"

# export.path is normalised before its lock is named: X/. is X (lock X.lock, X.tmp beside it;
# before, the lock X/..lock went into X and the export refused it after training). What the
# export would refuse at the end is refused before step 1 with exit 2 naming the path: a path
# ending in '..', an old export holding a folder under a shard's name, a foreign file in X.old,
# a folder at a file export's PATH.tmp (before: exit 1 after the steps, X.tmp left behind).
"$tycho" run "$plan" --set train.steps=2 --set export.format=hf --set export.path="$tmp/hx/." >"$tmp/out" 2>"$tmp/err" ||
  fail "export.path $tmp/hx/.: exit $?"
grep -qx "exported $tmp/hx after step 2" "$tmp/out" || fail "no 'exported $tmp/hx after step 2' line (2 steps)"
[ -f "$tmp/hx/config.json" ] && [ ! -e "$tmp/hx/..lock" ] && [ ! -e "$tmp/hx.lock" ] && [ ! -e "$tmp/hx.tmp" ] ||
  fail "export.path $tmp/hx/.: $(ls -a "$tmp" "$tmp/hx")"
code=2
refused "tycho: plan error: export.path $tmp/hx/..: names no file of its own" --set export.format=hf \
  --set export.path="$tmp/hx/.."
shard=$(cd "$tmp/hx" && ls model-*.safetensors)
rm "$tmp/hx/$shard" && mkdir "$tmp/hx/$shard"
refused "tycho: plan error: export.path $tmp/hx: holds '$shard', which an export does not write" \
  --set export.format=hf --set export.path="$tmp/hx"
rmdir "$tmp/hx/$shard"
mkdir "$tmp/hx.old" && echo mine >"$tmp/hx.old/notes.txt"
refused "tycho: plan error: export.path $tmp/hx: $tmp/hx.old: holds 'notes.txt', which an export does not write" \
  --set export.format=hf --set export.path="$tmp/hx"
mkdir "$tmp/e.safetensors.tmp"
refused "tycho: plan error: export.path $tmp/e.safetensors: $tmp/e.safetensors.tmp is a folder;" \
  --set export.path="$tmp/e.safetensors"
code=
[ -e "$tmp/hx.tmp" ] && fail "a refused export left $tmp/hx.tmp"
[ -f "$tmp/hx.old/notes.txt" ] || fail "a refused export removed $tmp/hx.old/notes.txt"
echo "ok: export paths normalised, and what the export would refuse refused before step 1"

# A live run holds checkpoint.dir and log.metrics.
"$tycho" run "$plan" --set train.steps=1000000 --set checkpoint.dir="$tmp/ck" \
  --set log.metrics="$tmp/m.jsonl" >"$tmp/bg_out" 2>"$tmp/bg_err" &
bg=$!
for _ in $(seq 1200); do [ -s "$tmp/m.jsonl" ] && break; sleep 0.1; done
[ -s "$tmp/m.jsonl" ] || fail "the first run wrote no metrics in 120 s: $(cat "$tmp/bg_err")"
host=$(uname -n)
mkdir "$tmp/ck/step_99999999.tmp" # as if the live run were writing it
code=2 # "in use by another run" is an input error (exit 2)
refused "tycho: checkpoint.dir $tmp/ck: in use by another run (pid $bg on host $host; lock $tmp/ck/.lock)" \
  --set checkpoint.dir="$tmp/ck"
[ -d "$tmp/ck/step_99999999.tmp" ] || fail "the refused run removed the live run's .tmp folder"
refused "tycho: log.metrics $tmp/m.jsonl: in use by another run (pid $bg on host $host; lock $tmp/m.jsonl.lock)" \
  --set log.metrics="$tmp/m.jsonl"
code=
# a REPL's t:save into the live run's checkpoint.dir: refused naming the holder, nothing written
# (before, it wrote step_00000001 beside the run's checkpoints)
printf 'print(t:save())\n' | timeout 240 "$tycho" repl "$plan" --set checkpoint.dir="$tmp/ck" >"$tmp/out" 2>&1
grep -qF "t:save $tmp/ck: in use by another run (pid $bg on host $host; lock $tmp/ck/.lock)" "$tmp/out" ||
  fail "a REPL save into a live run's checkpoint.dir: $(cat "$tmp/out")"
[ -e "$tmp/ck/step_00000000" ] && fail "the REPL saved into a live run's checkpoint.dir"
kill -TERM "$bg"
wait "$bg"
rc=$?
bg=
[ "$rc" -eq 143 ] || fail "the first run exited $rc after SIGTERM, expected 143: $(cat "$tmp/bg_err")"
[ -e "$tmp/ck/.lock" ] && fail "the lock file $tmp/ck/.lock is left after the run"
[ -e "$tmp/m.jsonl.lock" ] && fail "the lock file $tmp/m.jsonl.lock is left after the run"
echo "ok: a second run on a live run's checkpoint.dir or log.metrics is refused naming its pid and host"

# The next run takes the locks, removes the stale .tmp and resumes.
steps=$(grep -c '"loss"' "$tmp/m.jsonl")
"$tycho" run "$plan" --set train.steps=$((steps + 2)) --set checkpoint.dir="$tmp/ck" \
  --set log.metrics="$tmp/m.jsonl" >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 0 ] || fail "the third run exited $rc"
grep -qF "checkpoint: removed the partial $tmp/ck/step_99999999.tmp" "$tmp/out" || fail "no line for the removed .tmp"
[ -e "$tmp/ck/step_99999999.tmp" ] && fail "the stale .tmp folder is still there"
grep -q "^resumed from $tmp/ck/step_" "$tmp/out" || fail "the third run did not resume"
echo "ok: stale step_N.tmp removed at start once the lock is held"

# A checkpoint write that fails (File too large: a file-size limit below one shard, set once
# checkpoints are being written): exit 1 naming the shard, and no step_N.tmp left behind.
if command -v prlimit >/dev/null; then
  (trap '' XFSZ; exec "$tycho" run "$plan" --set train.steps=1000000 --set checkpoint.dir="$tmp/ck2" \
    --set checkpoint.every=1) >"$tmp/out" 2>"$tmp/err" &
  bg=$!
  for _ in $(seq 1200); do [ -d "$tmp/ck2/step_00000002" ] && break; sleep 0.1; done
  prlimit --pid "$bg" --fsize=65536 || fail "prlimit failed"
  wait "$bg"
  rc=$?
  bg=
  [ "$rc" -eq 1 ] || fail "checkpoint write failure: exit code $rc, expected 1"
  grep -q '^tycho: .*rank_00000.bin: File too large' "$tmp/err" || fail "checkpoint write failure: no File too large"
  ls -d "$tmp"/ck2/step_*.tmp >/dev/null 2>&1 && fail "a failed checkpoint write left $(ls -d "$tmp"/ck2/step_*.tmp)"
  echo "ok: a failed checkpoint write removes its step_N.tmp"
fi

# A metrics write that fails mid-run: the path and strerror (File too large: the file-size
# limit lowered with prlimit once the run is training; SIGXFSZ ignored, so the write fails).
if command -v prlimit >/dev/null; then
  (trap '' XFSZ; exec "$tycho" run "$plan" --set train.steps=1000000 --set log.metrics="$tmp/small.jsonl") \
    >"$tmp/out" 2>"$tmp/err" &
  bg=$!
  for _ in $(seq 1200); do [ -s "$tmp/small.jsonl" ] && break; sleep 0.1; done
  prlimit --pid "$bg" --fsize=$(( $(stat -c %s "$tmp/small.jsonl") + 4096 )) || fail "prlimit failed"
  wait "$bg"
  rc=$?
  bg=
  [ "$rc" -eq 1 ] || fail "metrics write failure: exit code $rc, expected 1"
  first=$(head -n 1 "$tmp/err")
  [ "$first" = "tycho: log.metrics: cannot write to $tmp/small.jsonl: File too large" ] ||
    fail "metrics write failure: first stderr line '$first'"
  echo "ok: a failed metrics write names the path and strerror"
else
  echo "skipped: the failed metrics write (no prlimit)"
fi

# A full disk (a 64 KiB tmpfs; skipped when it cannot be mounted). log.metrics: each line is
# written whole or not at all, and the message gives the cause (before: a record cut in the
# middle). log.trace: written to a temporary name and renamed, so a failed write leaves no file
# under the final name (before: a 0-byte trace.json), with the cause in the message.
mnt=$tmp/small_disk
mkdir "$mnt"
if mount -t tmpfs -o size=64k tmpfs "$mnt" 2>/dev/null; then
  trap '[ -n "$bg" ] && kill -KILL "$bg" 2>/dev/null; umount "$mnt" 2>/dev/null; rm -rf "$tmp"' EXIT
  head -c 57344 /dev/zero >"$mnt/filler" # some 8 KiB left: tens of records
  "$tycho" run "$plan" --set train.steps=1000000 --set log.metrics="$mnt/m.jsonl" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ "$rc" -eq 1 ] || fail "metrics on a full disk: exit $rc, expected 1"
  first=$(head -n 1 "$tmp/err")
  [ "$first" = "tycho: log.metrics: cannot write to $mnt/m.jsonl: No space left on device" ] ||
    fail "metrics on a full disk: first stderr line '$first'"
  [ -s "$mnt/m.jsonl" ] && [ "$(tail -c 1 "$mnt/m.jsonl" | od -An -c | tr -d ' ')" = '\n' ] ||
    fail "metrics on a full disk: the file does not end with a whole line: $(tail -c 200 "$mnt/m.jsonl")"
  grep -qv '}$' "$mnt/m.jsonl" && fail "metrics on a full disk: a cut record: $(grep -v '}$' "$mnt/m.jsonl" | head -c 300)"
  rm -f "$mnt/m.jsonl" "$mnt/m.jsonl.lock"
  head -c 65536 /dev/zero >>"$mnt/filler" 2>/dev/null # full
  "$tycho" run "$plan" --set train.steps=3 --set log.trace="$mnt/trace.json" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ "$rc" -eq 1 ] || fail "trace on a full disk: exit $rc, expected 1"
  grep -q "^tycho: log.trace: .*$mnt/trace.json.tmp: No space left on device" "$tmp/err" ||
    fail "trace on a full disk: no cause in '$(head -n 1 "$tmp/err")'"
  [ -e "$mnt/trace.json" ] || [ -e "$mnt/trace.json.tmp" ] && fail "trace on a full disk left $(ls -la "$mnt")"
  umount "$mnt"
  echo "ok: a full disk cuts no metrics record and leaves no trace file, naming the cause"
else
  echo "skipped: the full-disk cases (cannot mount a tmpfs)"
fi
