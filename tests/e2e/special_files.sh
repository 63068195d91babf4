#!/usr/bin/env bash
# Special files are refused, not waited on, and never replaced. Every input tycho reads (the
# plan, a module it requires, --cluster, init.from, data.train, data.val, the manifest a run
# resumes from, `ckpt inspect|verify`'s manifest) given a FIFO, a character device (/dev/zero's
# numbers) or a folder, and every output it writes (export.path, log.metrics, log.trace,
# calibrate's and tune's --out) given a FIFO, a character device (/dev/null's numbers), a folder
# or a link to a device: exit 2 at once, naming the path and what it is ("is a FIFO, not a
# regular file"), and the node is still a node afterwards. A checkpoint's shard that is a FIFO:
# exit 2 naming it, unread. Before, a FIFO hung four of the inputs, /dev/zero as a cluster file
# was read until memory ran out, and export.path onto a device replaced the device with a
# regular file. An export.path that becomes a FIFO while the run trains is refused at the
# export, left as it is; a second run on the export.path of a live run is refused naming the
# holder, as for checkpoint.dir and log.metrics.
# usage: special_files.sh TYCHO   (run from the source folder)
set -u
tycho=$1
small=tests/plans/good/train_small.lua
tokens_plan=tests/golden/llama_ref_plan.lua
cluster=plans/clusters/h100_80g_ib.lua
tmp=$(mktemp -d)
bg=
trap '[ -n "$bg" ] && kill -KILL "$bg" 2>/dev/null; rm -rf "$tmp"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }

mkfifo "$tmp/fifo"
mkdir "$tmp/dir"
kinds="fifo dir"
if mknod "$tmp/zero" c 1 5 2>/dev/null && mknod "$tmp/null" c 1 3 2>/dev/null; then
  kinds="fifo zero null link dir"
  ln -s "$tmp/null" "$tmp/link"
else
  echo "skipped: the character-device cases (mknod failed: not root, or no device nodes here)"
fi
kind_of() {
  case $1 in
    fifo) echo "a FIFO" ;; zero | null | link) echo "a character device" ;; dir) echo "a folder" ;;
  esac
}
still_there() { # the node is what it was
  case $1 in
    fifo) [ -p "$tmp/fifo" ] ;; zero) [ -c "$tmp/zero" ] ;; null | link) [ -c "$tmp/null" ] && [ -L "$tmp/link" ] ;;
    dir) [ -d "$tmp/dir" ] ;;
  esac || fail "$tmp/$1 is no longer what it was: $(ls -la "$tmp")"
}
# expect NODE TEXT ARGS...: `tycho ARGS` exits 2 within 120 s, TEXT (NODE's kind appended) in
# its first stderr line, and NODE is still there
expect() {
  local node=$1 text="$2: is $(kind_of "$1"), not a regular file" rc first
  shift 2
  timeout 120 "$tycho" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  rc=$?
  first=$(head -n 1 "$tmp/err")
  if [ "$rc" -ne 2 ]; then
    fail "tycho $*: exit code $rc, expected 2 (124: it hung); stderr: $(head -c 400 "$tmp/err")"
  else
    case "$first" in
      "$text") echo "ok   tycho $*" ;;
      *) fail "tycho $*: first stderr line '$first', expected '$text'" ;;
    esac
  fi
  grep -q '^step' "$tmp/out" && fail "tycho $*: a step ran before the refusal"
  still_there "$node"
}

# inputs: a FIFO, a device and a folder (each `tycho run` costs MPI's start, most of a second:
# the run's fields take a share of the kinds each)
mkdir "$tmp/mods" "$tmp/ck" "$tmp/ck/step_00000005"
printf 'return require "m"\n' >"$tmp/mods/plan.lua"
for k in $kinds; do
  [ "$k" = null ] || [ "$k" = link ] && continue # /dev/zero stands for the devices among inputs
  n=$tmp/$k
  expect "$k" "tycho: plan error: $n" check "$n"
  expect "$k" "tycho: cluster error: $n" check $small --cluster "$n"
  case $k in fifo | zero) expect "$k" "tycho: plan error: init.from $n" run $small --set init.from="$n" ;; esac
  expect "$k" "tycho: plan error: data.train $n" run $tokens_plan --set data.train="$n"
  [ "$k" = fifo ] && expect "$k" "tycho: plan error: data.val $n" run $tokens_plan --set data.val="$n"
  # a module and a manifest are names tycho looks for: the node takes that name
  if [ "$k" != dir ]; then # a folder named m.lua is not a module (m/init.lua is looked for)
    mv "$n" "$tmp/mods/m.lua"
    timeout 120 "$tycho" check "$tmp/mods/plan.lua" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    text="tycho: plan error: $tmp/mods/plan.lua:1: $tmp/mods/m.lua: is $(kind_of "$k"), not a regular file"
    [ "$rc" -eq 2 ] && [ "$(head -n 1 "$tmp/err")" = "$text" ] && echo "ok   require of a module that is $k" ||
      fail "require of a module that is $k: exit $rc, stderr '$(head -n 1 "$tmp/err")', expected '$text'"
    mv "$tmp/mods/m.lua" "$n"
  fi
  m=$tmp/ck/step_00000005/manifest.json
  mv "$n" "$m"
  ln -s "$m" "$n" # still_there follows it
  expect "$k" "tycho: plan error: checkpoint.dir $tmp/ck: $m" run $small --set checkpoint.dir="$tmp/ck"
  expect "$k" "tycho: $m" ckpt inspect "$tmp/ck"
  expect "$k" "tycho: $m" ckpt verify "$tmp/ck/step_00000005"
  rm "$n"
  mv "$m" "$n"
done

# a checkpoint's shard (a real checkpoint, its rank file replaced): read neither by verify nor
# by a resume, refused naming it as bad input (exit 2) before anything is read
timeout 240 "$tycho" run $small --set train.steps=2 --set checkpoint.dir="$tmp/real" >"$tmp/out" 2>"$tmp/err" ||
  fail "the checkpointed run failed: $(cat "$tmp/err")"
s=$tmp/real/step_00000002
rm -f "$s/rank_00000.bin"
mkfifo "$s/rank_00000.bin"
for cmd in "ckpt verify $tmp/real" "ckpt inspect $s" "run $small --set train.steps=4 --set checkpoint.dir=$tmp/real"; do
  timeout 120 "$tycho" $cmd >"$tmp/out" 2>"$tmp/err" </dev/null
  rc=$?
  text="tycho: $s/rank_00000.bin: is a FIFO, not a regular file"
  case $cmd in run*) text="tycho: plan error: checkpoint.dir $tmp/real: $s/rank_00000.bin: is a FIFO, not a regular file" ;; esac
  [ "$rc" -eq 2 ] && [ "$(head -n 1 "$tmp/err")" = "$text" ] && echo "ok   tycho $cmd, its shard a FIFO" ||
    fail "tycho $cmd, its shard a FIFO: exit $rc (124: it hung), stderr '$(head -n 1 "$tmp/err")', expected '$text'"
  [ -p "$s/rank_00000.bin" ] || fail "the shard FIFO is gone"
done

# outputs: a FIFO, a device, a link to a device and a folder
for k in $kinds; do
  [ "$k" = zero ] && continue # /dev/null stands for the devices among outputs
  n=$tmp/$k
  expect "$k" "tycho: plan error: export.path $n" run $small --set export.path="$n"
  case $k in fifo | null) expect "$k" "tycho: plan error: log.metrics $n" run $small --set log.metrics="$n" ;; esac
  case $k in fifo | null | dir) expect "$k" "tycho: plan error: log.trace $n" run $small --set log.trace="$n" ;; esac
  expect "$k" "tycho: --out $n" calibrate --out "$n"
  expect "$k" "tycho: --out $n" tune plans/tiny.lua --world 2 --cluster $cluster --out "$n"
done
[ -e "$tmp/dir.lock" ] || [ -e "$tmp/fifo.lock" ] && fail "a refused run left a lock file: $(ls "$tmp")"

# export.path made a FIFO while the run trains: the export is refused, the FIFO left as it is
"$tycho" run $small --set train.steps=1000000 --set export.every=2 --set export.path="$tmp/w/model.safetensors" \
  >"$tmp/bg_out" 2>"$tmp/bg_err" &
bg=$!
for _ in $(seq 1200); do [ -f "$tmp/w/model.safetensors" ] && break; sleep 0.1; done
[ -f "$tmp/w/model.safetensors" ] || fail "the run exported nothing in 120 s: $(cat "$tmp/bg_err")"
mkfifo "$tmp/w/fifo" && mv -f "$tmp/w/fifo" "$tmp/w/model.safetensors"
for _ in $(seq 1200); do kill -0 "$bg" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$bg" 2>/dev/null; then
  fail "the run still trains 120 s after its export.path became a FIFO"
  kill -KILL "$bg"
  wait "$bg"
else
  wait "$bg"
  rc=$?
  text="tycho: export.path $tmp/w/model.safetensors: $tmp/w/model.safetensors: is a FIFO, not a regular file"
  [ "$rc" -eq 1 ] && [ "$(head -n 1 "$tmp/bg_err")" = "$text" ] && echo "ok   an export.path made a FIFO mid-run" ||
    fail "export.path made a FIFO mid-run: exit $rc, stderr '$(head -n 1 "$tmp/bg_err")', expected '$text'"
fi
bg=
[ -p "$tmp/w/model.safetensors" ] || fail "the export replaced the FIFO: $(ls -la "$tmp/w")"
[ -e "$tmp/w/model.safetensors.tmp" ] && fail "the refused export left its .tmp file"

# a live run holds export.path
"$tycho" run $small --set train.steps=1000000 --set export.path="$tmp/e.safetensors" \
  --set log.metrics="$tmp/m.jsonl" >"$tmp/bg_out" 2>"$tmp/bg_err" &
bg=$!
for _ in $(seq 1200); do [ -s "$tmp/m.jsonl" ] && break; sleep 0.1; done
[ -s "$tmp/m.jsonl" ] || fail "the first run wrote no metrics in 120 s: $(cat "$tmp/bg_err")"
timeout 120 "$tycho" run $small --set export.path="$tmp/e.safetensors" >"$tmp/out" 2>"$tmp/err"
rc=$?
text="tycho: export.path $tmp/e.safetensors: in use by another run (pid $bg on host $(uname -n); lock $tmp/e.safetensors.lock)"
[ "$rc" -eq 2 ] && [ "$(head -n 1 "$tmp/err")" = "$text" ] && echo "ok   a second run on a live run's export.path" ||
  fail "second run on a live run's export.path: exit $rc, stderr '$(head -n 1 "$tmp/err")', expected '$text'"
grep -q '^step' "$tmp/out" && fail "the second run trained"
kill -TERM "$bg"
wait "$bg"
bg=
[ -e "$tmp/e.safetensors.lock" ] && fail "the lock file $tmp/e.safetensors.lock is left after the run"

[ "$failed" -eq 0 ] || exit 1
echo "ok: special files refused, not waited on, never replaced"
