-- A session on 4 ranks, replayed by the tests (tests/e2e/examples_repl.sh):
--   mpirun -np 4 tycho repl plans/tiny.lua examples/repl/session.lua --set zero=3
-- Each chunk runs on every rank; rank 0 shows what they print, identical lines once.
t
=t.mesh.dp, t.mesh.zero
loss = t:step(4)
=string.format("%.4f", loss)
-- a weight, sharded by ZeRO-3 over the 4 data-parallel ranks
q = t:param("layers.0.q")
=q
=#q, q.shape[1], q.shape[2]
=string.format("%.4f", q:gather():norm())
-- the learning rate, live
t:set{ optimizer = { lr = 5e-4 } }
=t:plan().optimizer.lr
loss = t:step(2)
-- memory: what check predicted against what the allocator measured, per rank
m = t:memory()
=m.predicted.params == m.measured.params, m.predicted.grads == m.measured.grads
=string.format("params %.2f MiB, grads %.2f MiB", m.measured.params / 2^20, m.measured.grads / 2^20)
-- the same job, another layout: tp 2 × dp 2, without a file
t:replan{ mesh = { tp = 2, dp = 2 }, zero = 1 }
=t.mesh.tp, t.mesh.dp, t.tp, t.dp
=q
loss = t:step(2)
m = t:memory()
=m.predicted.params == m.measured.params, m.predicted.grads == m.measured.grads
=string.format("params %.2f MiB, grads %.2f MiB", m.measured.params / 2^20, m.measured.grads / 2^20)
@tp=1 print("tp rank 1, in dp group", t.dp)
-- a step on part of the job is refused before it waits, and nothing moves
@0 t:step(1)
=t.step
dir = os.getenv("TYCHO_EXAMPLE_DIR") or "/tmp"
=t:save(dir .. "/session_ckpt"):match("step_%d+$")
