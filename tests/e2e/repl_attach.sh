#!/usr/bin/env bash
# `tycho run --listen` and `tycho repl --attach`: a 2-rank run listens on a Unix socket (0600,
# with a 0600 token file next to it); a front-end without the token is refused and the job logs
# it; the front-end with it attaches, pauses the job, reads the step k, sets the learning rate and
# detaches; the job trains to its end. Its losses equal, bit for bit, those of the same plan in
# `tycho repl` with the same change scripted at step k. After the run the socket and the token are
# gone. Then a 1-rank run paused: no step of its own between chunks, t:step(2) steps it, t:close
# and t:replan refused, t:resume() and it finishes. Then clients without the token that never
# finish their hello (3 send a byte every 3 s, 2 say nothing, each connecting again when dropped)
# hold neither an attached session nor the job's steps: the session, paused while they connect,
# runs its chunks (they are refused as busy meanwhile), once it detaches the job drops each after
# 5 s and logs it, and the run ends its 300 steps while they all still go on (with the door on the
# training thread it waited for each hello).
# usage: repl_attach.sh TYCHO   (run from the source folder)
set -u
tycho=$(readlink -f "$1")
command -v mpirun >/dev/null 2>&1 || { echo "skip: no mpirun"; exit 77; }
dir=$(mktemp -d)
trap 'pkill -KILL -f -- "--listen $dir/" 2>/dev/null; [ -s "$dir/trickle.pids" ] && kill $(cat "$dir/trickle.pids") 2>/dev/null; rm -rf "$dir"' EXIT
export HOME="$dir" OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1
fail() { echo "FAIL: $*"; [ -f "$dir/run.out" ] && { echo "--- the run's output:"; tail -20 "$dir/run.out"; }; exit 1; }
steps=60
sets=(--set train.steps=$steps --set log.every=20 --set mesh.dp=2 --set train.eval_every=0)
lr=0.0025

mpirun -np 2 "$tycho" run plans/tiny.lua "${sets[@]}" --set log.metrics="$dir/run.jsonl" \
  --listen "$dir/sock" > "$dir/run.out" 2>&1 &
job=$!
for _ in $(seq 1200); do [ -S "$dir/sock" ] && [ -s "$dir/sock.token" ] && break; sleep 0.1; done
[ -S "$dir/sock" ] || fail "no socket at $dir/sock"
[ "$(stat -c %a "$dir/sock")" = 600 ] || fail "the socket's mode is $(stat -c %a "$dir/sock"), not 600"
[ "$(stat -c %a "$dir/sock.token")" = 600 ] || fail "the token file's mode is $(stat -c %a "$dir/sock.token")"

# without the token: refused, and the job says so
echo 0123456789abcdef0123456789abcdef > "$dir/wrong.token"
out=$(echo '=1' | "$tycho" repl --attach "$dir/sock" --token "$dir/wrong.token" 2>&1)
rc=$?
[ $rc -ne 0 ] || fail "a front-end with a wrong token was let in: $out"
grep -qF "refused this front-end: refused: a wrong token" <<< "$out" || fail "the refusal says: $out"

# with it: pause, the step, the change, detach
cat > "$dir/attach.lua" <<LUA
t:pause()
print("K=" .. t.step)
t:set{optimizer = {lr = $lr}}
print("LR=" .. t:plan().optimizer.lr)
=t.mesh.dp
detach()
LUA
out=$("$tycho" repl --attach "$dir/sock" "$dir/attach.lua" 2>&1) || fail "attach: $out"
k=$(sed -n 's/^\[0,1\] K=\([0-9]*\)$/\1/p' <<< "$out")
[ -n "$k" ] || fail "the attached session printed no step: $out"
grep -qx '\[0,1\] 2' <<< "$out" || fail "=t.mesh.dp did not give 2 on both ranks: $out"
grep -qx "\[0,1\] LR=$lr" <<< "$out" || fail "the live plan's lr is not $lr after t:set: $out"
wait $job || fail "the run failed after the detach"
grep -q "refused a REPL connection (a wrong token)" "$dir/run.out" || fail "the job did not log the refusal"
grep -q "a REPL attached at step" "$dir/run.out" || fail "the job did not log the attach"
grep -q "the REPL detached at step $k; training goes on" "$dir/run.out" || fail "the job did not log the detach at step $k"
grep -q "^done: $steps steps" "$dir/run.out" || fail "the run did not finish its $steps steps"
[ ! -e "$dir/sock" ] && [ ! -e "$dir/sock.token" ] || fail "the socket or its token is left after the run"
[ "$k" -lt "$steps" ] || fail "attached only after the last step ($k)"

# the same change scripted at step k, in the REPL: one loss per step, every digit
cat > "$dir/scripted.lua" <<LUA
for i = 1, $steps do
  if t.step == $k then t:set{optimizer = {lr = $lr}} end
  local loss = t:step(1)
  if t.rank == 0 then io.write(string.format("loss %.17g\n", loss)) end
end
LUA
mpirun -np 2 "$tycho" repl plans/tiny.lua "$dir/scripted.lua" "${sets[@]}" > "$dir/repl.out" 2>&1 ||
  fail "the scripted run failed: $(tail -5 "$dir/repl.out")"
sed -n 's/.*"loss": \([^,]*\),.*/loss \1/p' "$dir/run.jsonl" > "$dir/a"
grep -o 'loss [0-9][0-9.e+-]*$' "$dir/repl.out" > "$dir/b"
[ "$(wc -l < "$dir/a")" = $steps ] || fail "the run logged $(wc -l < "$dir/a") losses, not $steps"
cmp -s "$dir/a" "$dir/b" || fail "the attached change and the scripted change differ: $(diff "$dir/a" "$dir/b" | head -6)"

# paused, the job takes no step of its own between chunks (1 s apart), t:step(n) steps it, t:close
# and t:replan are refused (the job's), and t:resume() lets it go on: it finishes
"$tycho" run plans/tiny.lua --set train.steps=150 --set log.every=1000 --listen "$dir/p.sock" > "$dir/p.out" 2>&1 &
job=$!
for _ in $(seq 1200); do [ -S "$dir/p.sock" ] && [ -s "$dir/p.sock.token" ] && break; sleep 0.1; done
out=$( (printf '%s\n' 't:pause()' 'k = t.step'; sleep 1; printf '%s\n' 'print("held", t.step - k)' 't:step(2)' \
  'print("stepped", t.step - k)' 'print(pcall(t.close, t))' 'print(pcall(t.replan, t))' 't:resume()' 'detach()') |
  "$tycho" repl --attach "$dir/p.sock" 2>&1) || fail "the paused session: $out"
grep -qx 'held	0' <<< "$out" || fail "the job stepped while paused: $out"
grep -qx 'stepped	2' <<< "$out" || fail "t:step(2) while paused did not take 2 steps: $out"
grep -q "^false	.*t:close: t is the running job's trainer" <<< "$out" || fail "t:close was not refused: $out"
grep -q "^false	.*t:replan: t is the running job's trainer" <<< "$out" || fail "t:replan was not refused: $out"
wait $job || fail "the paused run failed after the detach: $(tail -5 "$dir/p.out")"
grep -q '^done: 150 steps' "$dir/p.out" || fail "the paused run did not finish: $(tail -5 "$dir/p.out")"

# clients without the token that never end their hello: they delay neither the attached session
# nor a step. They live 120 s; the session and the run's 300 steps take about 15 s quiet. While
# the session is attached they are refused as busy; once it detaches they wait in the job's door
# and, their hello unfinished after 5 s, are dropped: the run lasts past that (40 steps ended
# 1.5 s after the detach on a quiet 2-core machine, before any deadline came).
trickle=${TYCHO_TRICKLE:-$(dirname "$tycho")/tests/trickle}
[ -x "$trickle" ] || fail "no trickle tool at $trickle"
"$tycho" run plans/tiny.lua --set train.steps=300 --set log.every=1000 --listen "$dir/s.sock" > "$dir/s.out" 2>&1 &
job=$!
for _ in $(seq 1200); do [ -S "$dir/s.sock" ] && [ -s "$dir/s.sock.token" ] && break; sleep 0.1; done
out=$( (printf '%s\n' 't:pause()' 'k = t.step'; sleep 1
  for mode in trickle trickle trickle silent silent; do
    "$trickle" "$dir/s.sock" 120 $mode > /dev/null 2>&1 &
    echo $! >> "$dir/trickle.pids"
  done
  sleep 6; printf '%s\n' 'print("held", t.step - k)' 't:step(2)' 'print("stepped", t.step - k)' 't:resume()' 'detach()') |
  "$tycho" repl --attach "$dir/s.sock" 2>&1) || fail "the session beside slow clients: $out"
alive() { for p in $(cat "$dir/trickle.pids"); do kill -0 "$p" 2>/dev/null || return 1; done; }
alive || fail "the attached session ended only after the slow clients gave up: $out"
grep -qx 'held	0' <<< "$out" || fail "the job stepped while paused beside slow clients: $out"
grep -qx 'stepped	2' <<< "$out" || fail "t:step(2) beside slow clients did not take 2 steps: $out"
wait $job || fail "the run beside slow clients failed: $(tail -5 "$dir/s.out")"
alive || fail "the run ended only after the slow clients gave up: $(tail -5 "$dir/s.out")"
grep -q '^done: 300 steps' "$dir/s.out" || fail "the run beside slow clients did not finish: $(tail -5 "$dir/s.out")"
grep -q 'refused a REPL connection (no hello)' "$dir/s.out" ||
  fail "the job did not drop the clients without a hello: $(grep -v '^step' "$dir/s.out" | tail -8)"
echo "ok: attach at step $k, lr set, detached; $steps losses equal the scripted change's; pause held, t:step(2) stepped; 5 slow clients held nothing"
