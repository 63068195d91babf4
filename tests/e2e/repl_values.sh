#!/usr/bin/env bash
# What `tycho repl` shows and leaves: a returned table by its contents (=t.mesh on one line, a
# longer one indented, keys sorted, strings quoted), the same text on every rank so two ranks'
# lines collapse; the note that output was cut on a line of its own even after a partial line;
# t:save on part of the job (@0) refused with nothing left on disk, neither the folder nor its
# .tmp.
# usage: repl_values.sh TYCHO   (run from the source folder)
set -u
tycho=$1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
same() { # same NAME EXPECTED ACTUAL
  [ "$2" == "$3" ] || { diff <(printf '%s\n' "$2") <(printf '%s\n' "$3"); fail "$1: output differs (above: < expected, > got)"; }
}

out=$(printf '%s\n' '=t.mesh' '=t:plan().optimizer' '=t.step, t.path' '=t:plan().data' |
  "$tycho" repl plans/tiny.lua 2>&1)
want='> =t.mesh
{ dp = 1, ep = 1, pp = 1, tp = 1, zero = 0 }
> =t:plan().optimizer
{
  beta1 = 0.9,
  beta2 = 0.95,
  eps = 1e-08,
  grad_clip = 1,
  kind = "adamw",
  lr = 0.001,
  weight_decay = 0.1,
}
> =t.step, t.path
0	plans/tiny.lua
> =t:plan().data
{ shuffle = false, synthetic = "addition" }'
same "one rank" "$want" "$out"

# output past the limit: the note starts a line of its own though the output ended mid-line
out=$(printf '%s\n' 'io.write(string.rep("x", 300000))' '=1' | "$tycho" repl 2>&1)
grep -qx '(37856 more bytes of output cut)' <<<"$out" || fail "the cut note is not on a line of its own: $(tail -c 300 <<<"$out")"
grep -qx '> =1' <<<"$out" || fail "the session did not go on after the cut output"

# two ranks: the same table on both collapses; @0 t:save is refused and leaves nothing
out=$(printf '%s\n' '=t.mesh' "@0 t:save('$tmp/ck/a')" '=t.step' |
  mpirun -np 2 "$tycho" repl plans/tiny.lua 2>/dev/null)
grep -qxF '[0,1] { dp = 2, ep = 1, pp = 1, tp = 1, zero = 0 }' <<<"$out" || fail "=t.mesh did not collapse on 2 ranks"$'\n'"$out"
grep -qF "[0] stdin:1: t:save on group world needs ranks 1, which this chunk does not run on (it runs on 0)" <<<"$out" ||
  fail "@0 t:save was not refused before it began"$'\n'"$out"
[ ! -e "$tmp/ck" ] || fail "the refused @0 t:save left $(find "$tmp/ck")"
grep -qxF '[0,1] 0' <<<"$out" || fail "the session did not go on after the refused save"$'\n'"$out"
echo "repl_values: ok"
