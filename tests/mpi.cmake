# Multi-rank tests under mpirun (tests/mpi/). Each runs a few seconds on oversubscribed cores:
# ranks share memory (btl self,vader) and yield when idle, and `timeout` turns a hang into a
# failure rather than a stuck CI job. Included from tests/CMakeLists.txt.
set(TYCHO_MPIEXEC ${MPIEXEC_EXECUTABLE})
if(NOT TYCHO_MPIEXEC)
  find_program(TYCHO_MPIEXEC NAMES mpirun mpiexec)
endif()
find_program(TYCHO_TIMEOUT timeout)
if(NOT TYCHO_MPIEXEC OR NOT TYCHO_TIMEOUT)
  message(STATUS "tycho: MPI tests off (mpirun: ${TYCHO_MPIEXEC}, timeout: ${TYCHO_TIMEOUT})")
  return()
endif()
set(TYCHO_NP_FLAG ${MPIEXEC_NUMPROC_FLAG})
if(NOT TYCHO_NP_FLAG)
  set(TYCHO_NP_FLAG -np)
endif()
# Open MPI reads these; other MPIs ignore them.
set(TYCHO_MPI_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1)

foreach(name mpi_collectives mpi_overlap mpi_errors mpi_watchdog mpi_dp_equiv mpi_tp_convert mpi_trace mpi_groups mpi_oom mpi_reopen mpi_replan mpi_lua_trainer mpi_staged mpi_cp_ring)
  add_executable(${name} ${CMAKE_CURRENT_SOURCE_DIR}/mpi/${name}.c)
  target_include_directories(${name} PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/mpi)
  target_compile_options(${name} PRIVATE ${TYCHO_WARNINGS})
  target_link_libraries(${name} PRIVATE tycho_core)
endforeach()

# The environment of multi-rank test NAME: TYCHO_MPI_ENV and its own Open MPI session folder
# (tycho_session_env, tests/CMakeLists.txt).
function(tycho_mpi_env name out)
  tycho_session_env(${name} session)
  set(${out} "${TYCHO_MPI_ENV};${session}" PARENT_SCOPE)
endfunction()

# tycho_mpi_test(NAME RANKS [ENV var=value...] COMMAND exe args...)
function(tycho_mpi_test name ranks)
  cmake_parse_arguments(T "" "" "ENV;COMMAND" ${ARGN})
  math(EXPR hang "60 * ${TYCHO_TEST_TIME_SCALE}") # under the test's own timeout (90, scaled)
  add_test(NAME ${name} COMMAND ${TYCHO_TIMEOUT} ${hang} ${TYCHO_MPIEXEC} ${TYCHO_NP_FLAG} ${ranks}
    ${MPIEXEC_PREFLAGS} ${T_COMMAND} ${MPIEXEC_POSTFLAGS})
  tycho_mpi_env(${name} env)
  set_tests_properties(${name} PROPERTIES TIMEOUT 90 PROCESSORS ${ranks} LABELS mpi
    ENVIRONMENT "${env};${T_ENV}")
endfunction()

tycho_mpi_test(mpi_collectives.tp2_dp2 4 COMMAND $<TARGET_FILE:mpi_collectives> 2 2 1)
tycho_mpi_test(mpi_collectives.tp2_dp2_pp2 8 COMMAND $<TARGET_FILE:mpi_collectives> 2 2 2)
tycho_mpi_test(mpi_collectives.pp2_tp2_dp2_checked 8 ENV TYCHO_COMM_CHECK=1
  COMMAND $<TARGET_FILE:mpi_collectives> 2 2 2 pp,tp,dp)
tycho_mpi_test(mpi_collectives.dp3 3 COMMAND $<TARGET_FILE:mpi_collectives> 1 3 1)
tycho_mpi_test(mpi_overlap 2 COMMAND $<TARGET_FILE:mpi_overlap> ${CMAKE_CURRENT_BINARY_DIR}/mpi_overlap_trace.json)
set_tests_properties(mpi_overlap PROPERTIES RUN_SERIAL TRUE)
tycho_mpi_test(mpi_errors 4 COMMAND $<TARGET_FILE:mpi_errors>)
# Mesh groups built, used and freed, and built again for another layout, in one process.
tycho_mpi_test(mpi_groups 4 COMMAND $<TARGET_FILE:mpi_groups>)
# Context parallelism's ring attention: each rank's out, lse, dq, dk, dv against the whole-sequence
# kernels, and the ring's bytes against their formula, on rings of 2 and 4.
tycho_mpi_test(mpi_cp_ring.cp2 2 COMMAND $<TARGET_FILE:mpi_cp_ring>)
tycho_mpi_test(mpi_cp_ring.cp4 4 COMMAND $<TARGET_FILE:mpi_cp_ring>)
# One process closes plan A (tp 2) and opens plan B (dp 2, zero 3) from A's checkpoint: the
# losses of the serial run, and no block, group or thread left over.
tycho_mpi_test(mpi_reopen 2 ENV TYCHO_SOURCE_DIR=${PROJECT_SOURCE_DIR} COMMAND $<TARGET_FILE:mpi_reopen>)
# A live trainer re-planned in memory (trainer_replan) against checkpoint-and-resume (bit for bit)
# and the serial run, for 4 pairs of layouts on 4 ranks; refusals and failed opens leave it usable.
tycho_mpi_test(mpi_replan 4 ENV TYCHO_SOURCE_DIR=${PROJECT_SOURCE_DIR} COMMAND $<TARGET_FILE:mpi_replan>)
# The trainer in Lua on 2 ranks (tp 2, dp 2 zero 3, pp 2): layouts, :gather() against the serial
# tensors, t:comm's tp records, a t:set that differs between the ranks refused on both.
tycho_mpi_test(mpi_lua_trainer 2 ENV TYCHO_SOURCE_DIR=${PROJECT_SOURCE_DIR} COMMAND $<TARGET_FILE:mpi_lua_trainer>)
# One rank out of memory in a gather: every rank gets its error, and the trainers go on.
tycho_mpi_test(mpi_oom 2 ENV TYCHO_SOURCE_DIR=${PROJECT_SOURCE_DIR} COMMAND $<TARGET_FILE:mpi_oom>)

# The watchdog: a rank that sleeps past TYCHO_COMM_TIMEOUT, leaves early, is frozen, or dies, before
# a collective.
foreach(mode sleep finalize stopped exit)
  add_test(NAME mpi_watchdog.${mode} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/watchdog.sh
    ${mode} ${TYCHO_MPIEXEC} ${TYCHO_NP_FLAG} $<TARGET_FILE:mpi_watchdog>)
  tycho_mpi_env(mpi_watchdog.${mode} env)
  set_tests_properties(mpi_watchdog.${mode} PROPERTIES TIMEOUT 90 PROCESSORS 4 LABELS mpi
    ENVIRONMENT "${env}")
endforeach()

# The all-to-all with per-peer counts (expert parallelism): uneven counts with zeros against the
# expected data on 2, 3 (a group of one) and 4 ranks, check mode on throughout in one, counters,
# recorder and trace; then the watchdog diagnosing a rank that never arrives at one.
add_executable(mpi_all_to_all ${CMAKE_CURRENT_SOURCE_DIR}/mpi/mpi_all_to_all.c)
target_include_directories(mpi_all_to_all PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/unit ${CMAKE_CURRENT_SOURCE_DIR}/mpi)
target_compile_options(mpi_all_to_all PRIVATE ${TYCHO_WARNINGS})
target_link_libraries(mpi_all_to_all PRIVATE tycho_core)
foreach(np 2 3 4)
  tycho_mpi_test(mpi_all_to_all.np${np} ${np}
    COMMAND $<TARGET_FILE:mpi_all_to_all> ${CMAKE_CURRENT_BINARY_DIR}/mpi_all_to_all_np${np}.json)
endforeach()
tycho_mpi_test(mpi_all_to_all.np4_checked 4 ENV TYCHO_COMM_CHECK=1
  COMMAND $<TARGET_FILE:mpi_all_to_all> ${CMAKE_CURRENT_BINARY_DIR}/mpi_all_to_all_np4_checked.json)
add_test(NAME mpi_all_to_all.watchdog COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/all_to_all_watchdog.sh
  ${TYCHO_MPIEXEC} ${TYCHO_NP_FLAG} $<TARGET_FILE:mpi_all_to_all>)
tycho_mpi_env(mpi_all_to_all.watchdog env)
set_tests_properties(mpi_all_to_all.watchdog PROPERTIES TIMEOUT 90 PROCESSORS 4 LABELS mpi ENVIRONMENT "${env}")

# Data parallelism and ZeRO against the serial run (tests/plans/good/dp_small.lua: 2 layers of
# dim 32, dropout 0.1, 20 steps): losses, norms, evaluation and final parameters within 1e-5,
# initial parameters bitwise. NAME RANKS [--both ...] [--set ...].
function(tycho_dp_equiv name ranks)
  tycho_mpi_test(mpi_dp_equiv.${name} ${ranks} COMMAND $<TARGET_FILE:mpi_dp_equiv>
    ${PROJECT_SOURCE_DIR}/tests/plans/good/dp_small.lua ${ARGN})
endfunction()
tycho_dp_equiv(dp2 2)
tycho_dp_equiv(dp4 4)
tycho_dp_equiv(dp2_micro2 2 --set batch.micro=2)           # 4 micro-batches per rank
tycho_dp_equiv(dp3_global24 3 --both batch.global=24)       # padding to a multiple of 3
tycho_dp_equiv(dp2_zero1 2 --set zero=1)
tycho_dp_equiv(dp4_zero1 4 --set zero=1)
tycho_dp_equiv(dp2_zero2 2 --set zero=2)
tycho_dp_equiv(dp4_zero2 4 --set zero=2)
tycho_dp_equiv(dp2_zero2_micro2 2 --set zero=2 --set batch.micro=2)
tycho_dp_equiv(dp2_zero3 2 --set zero=3)
tycho_dp_equiv(dp4_zero3 4 --set zero=3)
tycho_dp_equiv(dp2_zero3_micro1_tied 2 --set zero=3 --set batch.micro=1 --both model.tie_embeddings=true)
tycho_dp_equiv(dp4_zero3_8_layers 4 --set zero=3 --both model.n_layers=8 --both bucket_mb=25 --memory-falls)
tycho_dp_equiv(dp4_zero2_8_layers 4 --set zero=2 --both model.n_layers=8 --both bucket_mb=25 --memory-falls)
# zero_every = "step" on one stage: whole gradients accumulated over the micro-batches and one
# reduce-scatter a step; parameters gathered once a step and kept (the peaks: whole + shard).
tycho_dp_equiv(dp2_zero2_grads_step_micro2 2 --set zero=2 --set zero_every.grads=step --set batch.micro=2)
tycho_dp_equiv(dp2_zero3_step_micro2 2 --set zero=3 --set zero_every.grads=step --set zero_every.params=step --set batch.micro=2)

# Context parallelism (mesh.cp): each sequence's 32 tokens over 2 ranks, two balanced chunks
# each, attention through the ring (runtime/parallel/cp.h); dropout 0.1 drawn at the global
# positions. The same bounds: the ring changes only the order of the attention's sums.
# Each case holds its allocator peaks and comm counters (the ring on the cp group, the dp layer on
# dp × cp) to `tycho check`'s bill and traffic, to the byte.
tycho_dp_equiv(cp2 2 --set mesh.cp=2)
tycho_dp_equiv(cp2_dp2 4 --set mesh.cp=2 --set mesh.dp=2)
tycho_dp_equiv(cp2_zero1_micro2 2 --set mesh.cp=2 --set zero=1 --set batch.micro=2)
tycho_dp_equiv(cp2_zero3 2 --set mesh.cp=2 --set zero=3)
tycho_dp_equiv(cp2_recompute 2 --set mesh.cp=2 --set recompute=full)
tycho_dp_equiv(cp2_seq30 2 --set mesh.cp=2 --both batch.seq=30)  # chunks of 7 and 8 tokens
tycho_dp_equiv(cp2_tp2 4 --set mesh.cp=2 --set mesh.tp=2)  # the ring on each tp rank's 2 heads
tycho_dp_equiv(cp2_tp2_sp 4 --set mesh.cp=2 --set mesh.tp=2 --set sequence_parallel=true)  # 8 rows a tp rank
# every layer's own splits (tp_mixed.lua: attention on all heads in one layer, k replicated in
# another): the ring on each layer's heads
tycho_mpi_test(mpi_dp_equiv.cp2_tp2_mixed_sp 4 COMMAND $<TARGET_FILE:mpi_dp_equiv>
  ${PROJECT_SOURCE_DIR}/tests/plans/good/tp_mixed.lua --set mesh.tp=2 --set mesh.cp=2 --set sequence_parallel=true)
tycho_dp_equiv(cp4 4 --set mesh.cp=4)
tycho_dp_equiv(cp4_seq29_zero2 4 --set mesh.cp=4 --both batch.seq=29 --set zero=2)  # chunks of 3 and 4 tokens
# with pipeline stages: each boundary carries the rank's rows; ZeRO 3 across stages; GPipe with
# the tied embedding's sum between the first and last stage
tycho_dp_equiv(cp2_pp2 4 --set mesh.cp=2 --set mesh.pp=2)
tycho_dp_equiv(cp2_pp2_zero3_micro2 4 --set mesh.cp=2 --set mesh.pp=2 --set zero=3 --set batch.micro=2)
tycho_dp_equiv(cp2_pp2_gpipe_tied 4 --set mesh.cp=2 --set mesh.pp=2 --set schedule.kind=gpipe --both model.tie_embeddings=true)
# what it does not compose with yet, refused by name by run, check and rehearse; check's figures for
# what it runs
add_test(NAME mpi_run_cp_refusals COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/run_cp_refusals.sh
  ${TYCHO_MPIEXEC} ${TYCHO_NP_FLAG} $<TARGET_FILE:tycho> WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
tycho_mpi_env(mpi_run_cp_refusals env)
set_tests_properties(mpi_run_cp_refusals PROPERTIES TIMEOUT 240 PROCESSORS 4 LABELS mpi ENVIRONMENT "${env}")

# The comparison fails a run that is wrong (so the bounds above are not too loose to see a bug):
# dropout masks drawn from other coordinates (a wrong seed on the parallel side) in either
# build; in the float64 build also a learning rate off by one part in a million, which moves the
# losses by 5e-9 to 2e-7 relative — inside fp32's bound, 50× and more over float64's. Each must fail
# with the message that names the step's loss.
function(tycho_equiv_must_fail name ranks)
  tycho_dp_equiv(${name} ${ranks} ${ARGN})
  set_tests_properties(mpi_dp_equiv.${name} PROPERTIES
    PASS_REGULAR_EXPRESSION "CHECK failed: [^\n]*step [0-9]+: loss")
endfunction()
tycho_equiv_must_fail(broken_dropout_seed 2 --set seeds.dropout=5)

# bf16 compute on the CPU (both runs bf16; the bounds are argued in mpi_dp_equiv.c at
# bf16_bounds): data parallelism with ZeRO 0-3, pipeline stages, recompute; the bill against the
# peaks with the bf16 copies. The broken seed must still fail under the wider bounds.
if(NOT TYCHO_FLOAT64)
  tycho_dp_equiv(bf16_dp2 2 --both precision.compute=bf16)
  tycho_dp_equiv(bf16_dp2_zero2 2 --both precision.compute=bf16 --set zero=2)
  tycho_dp_equiv(bf16_dp2_zero1_tied 2 --both precision.compute=bf16 --set zero=1 --both model.tie_embeddings=true)
  tycho_dp_equiv(bf16_pp2_1f1b 2 --both precision.compute=bf16 --set mesh.pp=2)
  # zero-bubble: W's products on the bf16 output gradients B held (the bill counts them in bf16)
  tycho_dp_equiv(bf16_pp2_zb_h1 2 --both precision.compute=bf16 --set mesh.pp=2 --set schedule.kind=zb-h1)
  tycho_dp_equiv(bf16_zb_h1_tied_one_rank 1 --both precision.compute=bf16 --set schedule.kind=zb-h1
    --both model.tie_embeddings=true)
  tycho_dp_equiv(bf16_pp4_zb_h1_recompute_full 4 --both precision.compute=bf16 --set mesh.pp=4
    --set schedule.kind=zb-h1 --both model.n_layers=4 --set recompute=full)
  # under ZeRO 3: the units' gathered bf16 copies held to the stage's last W
  tycho_dp_equiv(bf16_pp2_dp2_zero3_zb_h1 4 --both precision.compute=bf16 --set mesh.pp=2
    --set schedule.kind=zb-h1 --set zero=3 --set batch.micro=2)
  # at tp 2: the rounded bf16 inputs (in_b, the workspace's) held for W
  tycho_dp_equiv(bf16_tp2_pp2_zb_h1_sp 4 --both precision.compute=bf16 --set mesh.tp=2 --set mesh.pp=2
    --set schedule.kind=zb-h1 --set sequence_parallel=true)
  tycho_dp_equiv(bf16_recompute_full_dp2 2 --both precision.compute=bf16 --set recompute=full)
  # ZeRO 3: each gathered unit's bf16 copies made once it arrives and freed with it (params peak)
  tycho_dp_equiv(bf16_dp2_zero3 2 --both precision.compute=bf16 --set zero=3)
  tycho_dp_equiv(bf16_dp2_zero3_tied 2 --both precision.compute=bf16 --set zero=3 --set batch.micro=1
    --both model.tie_embeddings=true)
  tycho_dp_equiv(bf16_dp2_zero3_step_micro2 2 --both precision.compute=bf16 --set zero=3
    --set zero_every.grads=step --set zero_every.params=step --set batch.micro=2)
  tycho_dp_equiv(bf16_pp2_dp2_zero3 4 --both precision.compute=bf16 --set mesh.pp=2 --set zero=3)
  tycho_dp_equiv(bf16_pp2_dp2_zero3_micro_batch_tied 4 --both precision.compute=bf16 --set mesh.pp=2 --set zero=3
    --set zero_every.grads=micro_batch --set zero_every.params=micro_batch --both model.tie_embeddings=true)
  # 16 steps: past 18 the 8-layer model's bf16 trajectories separate (mpi_dp_equiv.c, bf16_bounds)
  tycho_dp_equiv(bf16_dp4_zero3_8_layers 4 --both precision.compute=bf16 --set zero=3 --both model.n_layers=8
    --both bucket_mb=25 --both train.steps=16 --memory-falls)
  tycho_dp_equiv(bf16_tp2_dp2_zero3 4 --both precision.compute=bf16 --set mesh.tp=2 --set zero=3)
  # tensor parallelism (the fp32 conversions, each product on its input rounded): the default
  # splits (vocab-parallel embedding and head), sequence parallel, a padded vocabulary with tied
  # embeddings, every split choice per module (tp_mixed.lua), recompute (the pieces rerun, their
  # inputs rounded again), beside pipeline stages and ZeRO 1
  tycho_dp_equiv(bf16_tp2 2 --both precision.compute=bf16 --set mesh.tp=2)
  tycho_dp_equiv(bf16_tp2_sp 2 --both precision.compute=bf16 --set mesh.tp=2 --set sequence_parallel=true)
  tycho_dp_equiv(bf16_tp2_sp_recompute_full 2 --both precision.compute=bf16 --set mesh.tp=2
    --set sequence_parallel=true --set recompute=full)
  tycho_dp_equiv(bf16_tp2_vocab 2 --both precision.compute=bf16 --set mesh.tp=2 --set tp_split.embed=vocab
    --set tp_split.head=vocab --both model.vocab=63 --both model.tie_embeddings=true)
  tycho_mpi_test(mpi_dp_equiv.bf16_tp2_mixed_sp 2 COMMAND $<TARGET_FILE:mpi_dp_equiv>
    ${PROJECT_SOURCE_DIR}/tests/plans/good/tp_mixed.lua --both precision.compute=bf16 --set mesh.tp=2
    --set sequence_parallel=true)
  tycho_dp_equiv(bf16_tp2_pp2 4 --both precision.compute=bf16 --set mesh.tp=2 --set mesh.pp=2)
  tycho_dp_equiv(bf16_tp2_dp2_zero1 4 --both precision.compute=bf16 --set mesh.tp=2 --set zero=1)
  tycho_equiv_must_fail(bf16_broken_dropout_seed 2 --both precision.compute=bf16 --set seeds.dropout=5)
  # precision.grads = "bf16": the whole gradients in bf16 (ZeRO 0, 1; each unit's fp32 sums added
  # in once it is final, all-reduced in bf16), or the ZeRO-2/3 shard in bf16, reduce-scattered in
  # bf16; the serial run's gradients bf16 too; every category of the bill to the byte, the bf16
  # reductions' bytes in the comm counters
  tycho_dp_equiv(bf16_grads_dp2 2 --both precision.compute=bf16 --both precision.grads=bf16)
  tycho_dp_equiv(bf16_grads_dp2_zero1_tied 2 --both precision.compute=bf16 --both precision.grads=bf16 --set zero=1
    --both model.tie_embeddings=true)
  tycho_dp_equiv(bf16_grads_pp2_dp2_zero1 4 --both precision.compute=bf16 --both precision.grads=bf16 --set mesh.pp=2
    --set zero=1)
  tycho_dp_equiv(bf16_grads_pp2_dp2_zero3_step 4 --both precision.compute=bf16 --both precision.grads=bf16
    --set mesh.pp=2 --set zero=3 --set zero_every.grads=step --set zero_every.params=step)
  # zero-bubble with bf16 gradients: B's and W's passes each sum their unit's gradients in an area
  # of its own and add it in (W writes each product's at its parameter's place in W's area)
  tycho_dp_equiv(bf16_grads_pp2_zb_h1_tied 2 --both precision.compute=bf16 --both precision.grads=bf16 --set mesh.pp=2
    --set schedule.kind=zb-h1 --both model.tie_embeddings=true)
  tycho_dp_equiv(bf16_grads_zb_h1_tied_one_rank 1 --both precision.compute=bf16 --both precision.grads=bf16
    --set schedule.kind=zb-h1 --both model.tie_embeddings=true)
  tycho_dp_equiv(bf16_grads_pp2_dp2_zero3_zb_h1 4 --both precision.compute=bf16 --both precision.grads=bf16
    --set mesh.pp=2 --set zero=3 --set schedule.kind=zb-h1 --set batch.micro=2)
  tycho_dp_equiv(bf16_grads_dp2_zero2 2 --both precision.compute=bf16 --both precision.grads=bf16 --set zero=2)
  tycho_dp_equiv(bf16_grads_dp2_zero3 2 --both precision.compute=bf16 --both precision.grads=bf16 --set zero=3)
  tycho_dp_equiv(bf16_grads_pp2_dp2_zero2_tied 4 --both precision.compute=bf16 --both precision.grads=bf16
    --set mesh.pp=2 --set zero=2 --set zero_every.grads=micro_batch --both model.tie_embeddings=true)
  tycho_dp_equiv(bf16_grads_tp2_dp2_zero3 4 --both precision.compute=bf16 --both precision.grads=bf16
    --set mesh.tp=2 --set zero=3)
  tycho_equiv_must_fail(bf16_grads_broken_dropout_seed 2 --both precision.compute=bf16 --both precision.grads=bf16
    --set zero=2 --set seeds.dropout=5)
endif()
if(TYCHO_FLOAT64)
  tycho_equiv_must_fail(broken_lr_1e-6 2 --set optimizer.lr=0.003000003)
endif()

# Expert parallelism (mesh.ep) against the serial run, on tests/plans/good/ep_small.lua (layer 1
# sparse: 4 experts, top 2, capacity factor 1, dropout 0.1): ep inside dp with ZeRO, with
# pipeline stages, dropless and at capacity. Routing is discrete: in fp32 a rounding-sized
# difference can move a router logit across a near-tie and flip one token's expert (seen here with
# dropout on at capacity: loss 4.8e-6, final weights 6.2e-4 relative L2, the same at ep 1 and dp
# 2), so the fp32 cases at capacity run without dropout; the float64 build runs every case with
# dropout and capacity dropping and holds all of them to 1e-10.
function(tycho_ep_equiv name ranks)
  tycho_mpi_test(mpi_dp_equiv.${name} ${ranks} COMMAND $<TARGET_FILE:mpi_dp_equiv>
    ${PROJECT_SOURCE_DIR}/tests/plans/good/ep_small.lua ${ARGN})
endfunction()
if(TYCHO_FLOAT64)
  set(ep_capacity_dropout "")
else()
  set(ep_capacity_dropout --both model.dropout=0)
endif()
tycho_ep_equiv(ep2 2 --set mesh.ep=2 ${ep_capacity_dropout})
tycho_ep_equiv(ep2_dropless 2 --set mesh.ep=2 --both model.moe.capacity_factor=0)
tycho_ep_equiv(ep4_zero1 4 --set mesh.ep=4 --set zero=1 ${ep_capacity_dropout})
tycho_ep_equiv(ep4_dropless 4 --set mesh.ep=4 --both model.moe.capacity_factor=0)
tycho_ep_equiv(ep2_dp4_zero3 4 --set mesh.ep=2 --set zero=3 ${ep_capacity_dropout})
tycho_ep_equiv(ep2_pp2 4 --set mesh.ep=2 --set mesh.pp=2 ${ep_capacity_dropout})
tycho_ep_equiv(ep2_pp2_dropless_zero2 4 --set mesh.ep=2 --set mesh.pp=2 --set zero=2
  --both model.moe.capacity_factor=0)
# micro-batches of 3: the evaluation's last chunk of held-out problems is shorter on one rank, so
# at capacity the ranks exchange their block sizes there (a training step's are the plan's)
tycho_ep_equiv(ep2_uneven_eval 2 --set mesh.ep=2 --both batch.global=12 --both batch.micro=3 ${ep_capacity_dropout})
# tensor parallelism beside expert parallelism: attention split over tp 2, the sparse MLP whole on
# each tp rank (replicated over tp), ep 2 over dp; dropless with ZeRO 1 on 4 ranks, and at
# capacity with ZeRO 2 × pp 2 on 8
tycho_ep_equiv(tp2_ep2_dropless_zero1 4 --set mesh.tp=2 --set mesh.ep=2 --set zero=1
  --both model.moe.capacity_factor=0)
tycho_ep_equiv(tp2_ep2_pp2_zero2 8 --set mesh.tp=2 --set mesh.ep=2 --set mesh.pp=2 --set zero=2
  ${ep_capacity_dropout})
# bf16 compute with sparse layers (the router's and the experts' products on bf16 operands, both
# runs bf16, the bf16 bounds, the routing within 1% of its assignments: bf16_bounds): every expert
# on each of dp 2, ep 2, tp 2 beside ep 2. Dropless: at capacity a swapped near-tie displaces
# other tokens from a full expert, and the runs drift past the weights' bound (1.25e-3 at ep 1).
if(NOT TYCHO_FLOAT64)
  tycho_ep_equiv(bf16_moe 2 --both precision.compute=bf16 --both model.moe.capacity_factor=0)
  # 6 steps: with the experts' rows kept in bf16 the near-ties the ep wire's roundings swap reach
  # 3.3% of the routing by step 12 (0.4-3.3% over five seeds), at most 0.7% by step 6
  tycho_ep_equiv(bf16_moe_ep2 2 --both precision.compute=bf16 --set mesh.ep=2 --both model.moe.capacity_factor=0
    --both train.steps=6)
  # precision.grads = "bf16": the expert buckets' shards reduce-scatter in bf16 over the edp group;
  # 6 steps: each step's bf16 gradients move near-ties sooner (12 steps: 2.8% of the routing moved)
  tycho_ep_equiv(bf16_grads_moe_ep2_zero2 2 --both precision.compute=bf16 --both precision.grads=bf16 --set mesh.ep=2
    --set zero=2 --both model.moe.capacity_factor=0 --both train.steps=6)
  # 6 steps: past them the routing's near-ties move more than 1% (mpi_dp_equiv.c, bf16_bounds)
  tycho_ep_equiv(bf16_moe_tp2_ep2 4 --both precision.compute=bf16 --set mesh.tp=2 --set mesh.ep=2
    --both model.moe.capacity_factor=0 --both train.steps=6)
endif()

# Sparse layers without expert parallelism (ep 1: every rank holds every expert) against the serial
# run, on tests/plans/good/moe_small.lua (4 layers, 1 and 3 sparse: 4 experts, top 2, capacity
# factor 1 so that assignments drop, dropout 0.1): data parallelism with ZeRO 1-3, pipeline stages
# under 1F1B, GPipe and interleaved virtual stages, pipeline × data with ZeRO 2 and 3 for each
# zero_every choice; the bill against the peaks, the counters against the traffic and every
# step's routing (assignments per expert and dropped, per layer) against the serial run's on each.
# Dropout and capacity dropping stay on in fp32 too: this plan's routers meet no near-tie in
# these 12 steps (measured: the same routing in every case, final weights within 5.2e-8 relative
# L2; a flipped assignment would show in the routing and as a weights error near 1e-3).
function(tycho_moe_equiv name ranks)
  tycho_mpi_test(mpi_dp_equiv.moe_${name} ${ranks} COMMAND $<TARGET_FILE:mpi_dp_equiv>
    ${PROJECT_SOURCE_DIR}/tests/plans/good/moe_small.lua ${ARGN})
endfunction()
tycho_moe_equiv(dp2 2)
tycho_moe_equiv(dp4_zero1 4 --set zero=1)
tycho_moe_equiv(dp2_dropless 2 --both model.moe.capacity_factor=0)
tycho_moe_equiv(dp2_zero2_micro2 2 --set zero=2 --set batch.micro=2)
# capacity factor 0.5: half of a balanced router's assignments dropped, and expert buffers of
# experts × capacity rows, half the dropless ones (the bill holds them to the byte)
tycho_moe_equiv(dp2_zero2_capacity_half 2 --set zero=2 --both model.moe.capacity_factor=0.5)
tycho_moe_equiv(dp4_zero3 4 --set zero=3)
tycho_moe_equiv(dp2_zero3_step_micro2 2 --set zero=3 --set zero_every.grads=step --set zero_every.params=step --set batch.micro=2)
tycho_moe_equiv(pp2_1f1b 2 --set mesh.pp=2)
tycho_moe_equiv(pp2_gpipe 2 --set mesh.pp=2 --set schedule.kind=gpipe)
tycho_moe_equiv(pp2_interleaved_v2 2 --set mesh.pp=2 --set virtual_stages=2 --set schedule.kind=interleaved)
tycho_moe_equiv(pp2_dp2_zero1 4 --set mesh.pp=2 --set zero=1)
tycho_moe_equiv(pp2_dp2_zero2 4 --set mesh.pp=2 --set zero=2)
tycho_moe_equiv(pp2_dp2_zero3_micro_batch 4 --set mesh.pp=2 --set zero=3 --set zero_every.grads=micro_batch --set zero_every.params=micro_batch)
tycho_moe_equiv(pp2_dp2_zero3_interleaved_v2 4 --set mesh.pp=2 --set virtual_stages=2 --set schedule.kind=interleaved --set zero=3)
# the comparison sees a wrong dropout mask on these layers too, and the routing (the assignments
# per expert and dropped, summed over the ranks, every step) sees another capacity at once
tycho_moe_equiv(broken_dropout_seed 2 --set seeds.dropout=5)
set_tests_properties(mpi_dp_equiv.moe_broken_dropout_seed PROPERTIES
  PASS_REGULAR_EXPRESSION "CHECK failed: [^\n]*step [0-9]+: loss")
tycho_moe_equiv(broken_capacity 2 --set model.moe.capacity_factor=1.25)
set_tests_properties(mpi_dp_equiv.moe_broken_capacity PROPERTIES
  PASS_REGULAR_EXPRESSION "CHECK failed: [^\n]*step [0-9]+: routing: layer 1: [0-9]+ assignments dropped, serial [0-9]+")

# `tycho run` itself under mpirun: rank 0 writes once, the metrics match the serial run's.
foreach(config "2;0" "4;1" "2;3")
  list(GET config 0 ranks)
  list(GET config 1 zero)
  add_test(NAME mpi_run.dp${ranks}_zero${zero} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/run_dp.sh
    ${ranks} ${zero} ${TYCHO_MPIEXEC} ${TYCHO_NP_FLAG} $<TARGET_FILE:tycho> WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  tycho_mpi_env(mpi_run.dp${ranks}_zero${zero} env)
  set_tests_properties(mpi_run.dp${ranks}_zero${zero} PROPERTIES TIMEOUT 90 PROCESSORS ${ranks} LABELS mpi
    ENVIRONMENT "${env}")
endforeach()

# `tycho run` of a plan with sparse layers under mpirun: the metrics' moe object of every step (tokens
# per expert and dropped per layer exactly, the router losses within the bound) is the serial run's.
foreach(config "dp2_zero1;2;--set;zero=1" "pp2_dp2_zero3;4;--set;mesh.pp=2;--set;zero=3"
               "pp2_interleaved_v2;2;--set;mesh.pp=2;--set;virtual_stages=2;--set;schedule.kind=interleaved"
               "broken_capacity;2;--set;model.moe.capacity_factor=1.25")
  list(GET config 0 name)
  list(GET config 1 ranks)
  list(SUBLIST config 2 -1 sets)
  add_test(NAME mpi_run_moe.${name} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/run_moe_metrics.sh ${ranks}
    ${TYCHO_MPIEXEC} ${TYCHO_NP_FLAG} $<TARGET_FILE:tycho> ${sets} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  tycho_mpi_env(mpi_run_moe.${name} env)
  set_tests_properties(mpi_run_moe.${name} PROPERTIES TIMEOUT 90 PROCESSORS ${ranks} LABELS mpi
    ENVIRONMENT "${env}")
endforeach()
# another capacity on the parallel side only must fail the comparison at the routing
set_tests_properties(mpi_run_moe.broken_capacity PROPERTIES
  PASS_REGULAR_EXPRESSION "FAIL: the routing \\(tokens per expert, dropped\\) differs from the serial run's")

# `tycho run` under mpirun when something is wrong: every rank stops within seconds, one message.
foreach(mode world_mismatch hash_mismatch rank_dependent bf16_refused leave_early_pp data_one_rank export_fails leave_early)
  add_test(NAME mpi_run_errors.${mode} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/run_errors.sh
    ${mode} ${TYCHO_MPIEXEC} ${TYCHO_NP_FLAG} $<TARGET_FILE:tycho> WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  tycho_mpi_env(mpi_run_errors.${mode} env)
  set_tests_properties(mpi_run_errors.${mode} PROPERTIES TIMEOUT 90 PROCESSORS 2 LABELS mpi
    ENVIRONMENT "${env}")
endforeach()

# SIGTERM to one rank of two: both stop after the same step with its checkpoint, exit 143.
add_test(NAME mpi_run_signals COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/run_signals.sh
  ${TYCHO_MPIEXEC} ${TYCHO_NP_FLAG} $<TARGET_FILE:tycho> WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
tycho_mpi_env(mpi_run_signals env)
set_tests_properties(mpi_run_signals PROPERTIES TIMEOUT 150 PROCESSORS 2 LABELS mpi SKIP_RETURN_CODE 77
  ENVIRONMENT "${env}")

# Each layout conversion against the unsharded tensor, and the KV expansion against its adjoint.
# Staged comm (runtime/parallel/dcomm.h) on the untouchable table, memory the host cannot touch,
# against the direct run on the CPU's table of the same layout: losses, norms, evaluation, the
# parameters and the gathered model bit for bit, the same comm counters; comm "mpi" and "nccl"
# refused there. A few steps of the small plans, one layout per parallelism.
function(tycho_staged name ranks plan)
  tycho_mpi_test(mpi_staged.${name} ${ranks} COMMAND $<TARGET_FILE:mpi_staged>
    ${PROJECT_SOURCE_DIR}/tests/plans/good/${plan} --set train.steps=3 ${ARGN})
endfunction()
tycho_staged(dp2_zero1 2 dp_small.lua --set zero=1)
tycho_staged(dp2_zero2 2 dp_small.lua --set zero=2)
tycho_staged(dp4_zero3 4 dp_small.lua --set zero=3)
tycho_staged(tp2_sp 2 dp_small.lua --set mesh.tp=2 --set sequence_parallel=true)
tycho_staged(pp2 2 dp_small.lua --set mesh.pp=2)
tycho_staged(ep2 2 moe_small.lua --set mesh.ep=2)
# the bf16 mode (no float64 form): its weight copies and bf16 activations on the untouchable table
if(NOT TYCHO_FLOAT64)
  tycho_staged(dp2_zero2_bf16 2 dp_small.lua --set zero=2 --set precision.compute=bf16)
  tycho_staged(dp2_zero3_bf16 2 dp_small.lua --set zero=3 --set precision.compute=bf16)
endif()
foreach(ranks 2 3 4)
  tycho_mpi_test(mpi_tp_convert.tp${ranks} ${ranks} COMMAND $<TARGET_FILE:mpi_tp_convert>)
endforeach()

# Tensor parallelism against the serial run (the same executable and tolerances; it also holds
# the tp group's counters to tp_comm_list, the figures `tycho check` prints). NAME RANKS PLAN ARGS.
function(tycho_tp_equiv name ranks plan)
  tycho_mpi_test(mpi_tp_equiv.${name} ${ranks} COMMAND $<TARGET_FILE:mpi_dp_equiv>
    ${PROJECT_SOURCE_DIR}/tests/plans/good/${plan} ${ARGN})
endfunction()
tycho_tp_equiv(tp2 2 dp_small.lua --set mesh.tp=2)
tycho_tp_equiv(tp4_kv4 4 dp_small.lua --set mesh.tp=4 --both model.n_kv_heads=4)
tycho_tp_equiv(tp4_kv_expanded 4 dp_small.lua --set mesh.tp=4 --set tp_split.k=replicate --set tp_split.v=replicate)
tycho_tp_equiv(tp2_sp 2 dp_small.lua --set mesh.tp=2 --set sequence_parallel=true)
tycho_tp_equiv(tp4_sp 4 dp_small.lua --set mesh.tp=4 --set sequence_parallel=true --both model.n_kv_heads=4)
tycho_tp_equiv(tp2_mixed 2 tp_mixed.lua --set mesh.tp=2)
tycho_tp_equiv(tp2_mixed_sp 2 tp_mixed.lua --set mesh.tp=2 --set sequence_parallel=true)
tycho_tp_equiv(tp2_vocab63_tied 2 dp_small.lua --set mesh.tp=2 --both model.vocab=63 --both model.tie_embeddings=true)
tycho_tp_equiv(tp2_dp2_zero1 4 dp_small.lua --set mesh.tp=2 --set zero=1)
tycho_tp_equiv(tp2_dp2_zero3_sp 4 dp_small.lua --set mesh.tp=2 --set zero=3 --set sequence_parallel=true)

# Recompute policies against the serial run without recompute (dropout 0.1: the masks drawn
# again must be the forward's): full, Megatron's selective, norms and SwiGLU, whole sub-blocks,
# under data and tensor parallelism; each also holds fewer activations than recompute = "none".
tycho_tp_equiv(recompute_full_dp2 2 dp_small.lua --set recompute=full)
tycho_tp_equiv(recompute_selective_tp2 2 dp_small.lua --set mesh.tp=2 --set recompute=attn_core)
tycho_tp_equiv(recompute_parts_tp2_sp 2 dp_small.lua --set mesh.tp=2 --set sequence_parallel=true --set recompute=attn_norm,mlp_norm,mlp_act)
tycho_tp_equiv(recompute_blocks_tp2_mixed 2 tp_mixed.lua --set mesh.tp=2 --set recompute=attn,mlp)

# Pipeline stages against the serial run: every schedule, uneven stages, interleaved virtual
# stages, tied embeddings across the first and last stage, recompute under the pipeline, and
# pipeline × tensor × data parallelism with ZeRO 1 on 8 ranks.
tycho_tp_equiv(pp2_1f1b 2 dp_small.lua --set mesh.pp=2)
tycho_tp_equiv(pp2_gpipe 2 dp_small.lua --set mesh.pp=2 --set schedule.kind=gpipe)
tycho_tp_equiv(pp4_1f1b 4 dp_small.lua --set mesh.pp=4 --both model.n_layers=4)
tycho_tp_equiv(pp4_gpipe 4 dp_small.lua --set mesh.pp=4 --set schedule.kind=gpipe --both model.n_layers=4)
tycho_tp_equiv(pp2_interleaved_v2 2 dp_small.lua --set mesh.pp=2 --set virtual_stages=2 --set schedule.kind=interleaved --both model.n_layers=4)
tycho_tp_equiv(pp4_interleaved_v2 4 dp_small.lua --set mesh.pp=4 --set virtual_stages=2 --set schedule.kind=interleaved --both model.n_layers=8)
tycho_tp_equiv(pp2_uneven 2 pp_uneven.lua)
tycho_tp_equiv(pp2_function 2 pp_function.lua)
tycho_tp_equiv(pp2_balanced 2 dp_small.lua --set mesh.pp=2 --set stages=balanced --both model.n_layers=5)
tycho_tp_equiv(pp2_tied 2 dp_small.lua --set mesh.pp=2 --both model.tie_embeddings=true)
tycho_tp_equiv(pp4_tied_gpipe 4 dp_small.lua --set mesh.pp=4 --set schedule.kind=gpipe --both model.n_layers=4 --both model.tie_embeddings=true)
tycho_tp_equiv(pp2_recompute_full 2 dp_small.lua --set mesh.pp=2 --set recompute=full)
tycho_tp_equiv(pp2_recompute_selective 2 dp_small.lua --set mesh.pp=2 --set recompute=attn_core,mlp_act)
tycho_tp_equiv(pp2_dp2_zero1 4 dp_small.lua --set mesh.pp=2 --set zero=1)
# ZeRO 2 and 3 with pipeline stages, for each zero_every choice (docs/plans.md): the defaults
# with stages ("step": whole gradients until each stage's last backward, parameters gathered once
# a step), every micro-batch's reduce-scatter and gathers ("micro_batch"), the two mixed; 1F1B,
# GPipe and interleaved virtual stages, a tied embedding across the first and last stage.
tycho_tp_equiv(pp2_dp2_zero2 4 dp_small.lua --set mesh.pp=2 --set zero=2)
tycho_tp_equiv(pp2_dp2_zero2_grads_micro_batch 4 dp_small.lua --set mesh.pp=2 --set zero=2 --set zero_every.grads=micro_batch)
tycho_tp_equiv(pp2_dp2_zero3_6_layers 4 dp_small.lua --set mesh.pp=2 --set zero=3 --both model.n_layers=6)
tycho_tp_equiv(pp2_dp2_zero3_micro_batch 4 dp_small.lua --set mesh.pp=2 --set zero=3 --set zero_every.grads=micro_batch --set zero_every.params=micro_batch)
tycho_tp_equiv(pp2_dp2_zero3_gpipe_tied_params_step 4 dp_small.lua --set mesh.pp=2 --set schedule.kind=gpipe --set zero=3 --set zero_every.grads=micro_batch --both model.tie_embeddings=true)
tycho_tp_equiv(pp2_dp2_zero2_interleaved_v2_tied_micro_batch 4 dp_small.lua --set mesh.pp=2 --set virtual_stages=2 --set schedule.kind=interleaved --both model.n_layers=4 --set zero=2 --set zero_every.grads=micro_batch --both model.tie_embeddings=true)
tycho_tp_equiv(pp2_dp2_zero3_interleaved_v2 4 dp_small.lua --set mesh.pp=2 --set virtual_stages=2 --set schedule.kind=interleaved --both model.n_layers=4 --set zero=3)
tycho_tp_equiv(pp2_dp2_zero3_interleaved_v2_micro_batch 4 dp_small.lua --set mesh.pp=2 --set virtual_stages=2 --set schedule.kind=interleaved --both model.n_layers=4 --set zero=3 --set zero_every.grads=micro_batch --set zero_every.params=micro_batch)
tycho_tp_equiv(tp2_pp2_dp2_zero1 8 dp_small.lua --set mesh.tp=2 --set mesh.pp=2 --set zero=1)
# Zero-bubble ZB-H1 (split backwards: B, then each W later from the held output gradients) against
# the serial run's whole backwards: pp 2 and 4, dp 2 under ZeRO 1, recompute (W recomputes what B
# did), a tied embedding across the first and last stage; the bill holds the held areas and the
# slots kept until W.
tycho_tp_equiv(pp2_zb_h1 2 dp_small.lua --set mesh.pp=2 --set schedule.kind=zb-h1)
tycho_tp_equiv(pp4_zb_h1 4 dp_small.lua --set mesh.pp=4 --set schedule.kind=zb-h1 --both model.n_layers=4)
tycho_tp_equiv(pp2_dp2_zero1_zb_h1 4 dp_small.lua --set mesh.pp=2 --set schedule.kind=zb-h1 --set zero=1)
tycho_tp_equiv(pp2_zb_h1_recompute_full 2 dp_small.lua --set mesh.pp=2 --set schedule.kind=zb-h1 --set recompute=full)
tycho_tp_equiv(pp2_zb_h1_recompute_selective 2 dp_small.lua --set mesh.pp=2 --set schedule.kind=zb-h1
  --set recompute=attn_core,mlp_act)
tycho_tp_equiv(pp2_zb_h1_tied_micro2 2 dp_small.lua --set mesh.pp=2 --set schedule.kind=zb-h1 --set batch.micro=2
  --both model.tie_embeddings=true)
# one rank: the tied embedding's rows wait for W behind the head's product (one gradient, the
# whole backward's order), bit for bit the serial 1F1B run
tycho_tp_equiv(zb_h1_tied_one_rank 1 dp_small.lua --set schedule.kind=zb-h1 --both model.tie_embeddings=true)
# ZB-H1 under ZeRO 2 and 3 (zero_every "step", the default with stages): the whole gradients
# through the step, the stage's last W (not its last B) reduce-scatters them and, under ZeRO 3,
# frees the units gathered once a step; 4 micro-batches a rank (several W's pending at once), a
# tied embedding summed between the stages after the shards' reductions, recompute in W
tycho_tp_equiv(pp2_dp2_zero2_zb_h1 4 dp_small.lua --set mesh.pp=2 --set schedule.kind=zb-h1 --set zero=2
  --set batch.micro=2)
tycho_tp_equiv(pp2_dp2_zero3_zb_h1 4 dp_small.lua --set mesh.pp=2 --set schedule.kind=zb-h1 --set zero=3
  --set batch.micro=2 --both model.n_layers=4)
tycho_tp_equiv(pp2_dp2_zero3_zb_h1_tied_recompute 4 dp_small.lua --set mesh.pp=2 --set schedule.kind=zb-h1
  --set zero=3 --set batch.micro=2 --both model.tie_embeddings=true --set recompute=full)
# one pipeline rank (dp 2) under ZeRO 3 with "step" set (its default there is "micro_batch")
tycho_tp_equiv(dp2_zero3_step_zb_h1 2 dp_small.lua --set schedule.kind=zb-h1 --set zero=3 --set zero_every.grads=step
  --set zero_every.params=step)
# ZB-H1 at tp 2: B holds every product's input beside its output gradient (at tp > 1 the
# workspace's: gathered norm outputs, conversions), W recomputes nothing and runs no collective;
# with sequence parallelism and recompute, every layer's own splits (tp_mixed.lua), and on one
# pipeline rank a tied embedding (its rows added in B, before the head's W)
tycho_tp_equiv(tp2_pp2_zb_h1 4 dp_small.lua --set mesh.tp=2 --set mesh.pp=2 --set schedule.kind=zb-h1)
tycho_tp_equiv(tp2_pp2_zb_h1_sp_recompute 4 dp_small.lua --set mesh.tp=2 --set mesh.pp=2 --set schedule.kind=zb-h1
  --set sequence_parallel=true --set recompute=full)
tycho_tp_equiv(tp2_pp2_zb_h1_mixed_sp 4 tp_mixed.lua --set mesh.tp=2 --set mesh.pp=2 --set schedule.kind=zb-h1
  --set sequence_parallel=true)
tycho_tp_equiv(tp2_zb_h1_tied_one_rank 2 dp_small.lua --set mesh.tp=2 --set schedule.kind=zb-h1
  --both model.tie_embeddings=true)
# tp 2 × pp 2 × dp 2 under ZeRO 3 with sequence parallelism: the held inputs beside the units
# gathered once a step, the last W reduce-scattering
tycho_tp_equiv(tp2_pp2_dp2_zero3_zb_h1_sp 8 dp_small.lua --set mesh.tp=2 --set mesh.pp=2 --set schedule.kind=zb-h1
  --set zero=3 --set sequence_parallel=true --set batch.micro=2)

# log.trace of a tp 2 × pp 2 run (1F1B and interleaved): spans where the schedule says, the
# first trace_steps steps only, every collective with its group, bytes and seq.
tycho_mpi_test(mpi_trace.tp2_pp2_1f1b 4 COMMAND $<TARGET_FILE:mpi_trace> ${PROJECT_SOURCE_DIR}/tests/plans/good/dp_small.lua
  ${CMAKE_CURRENT_BINARY_DIR}/mpi_trace_tp2_pp2_1f1b.json --set mesh.tp=2 --set mesh.pp=2 --set train.steps=3
  --set log.trace_steps=2 --set train.eval_every=1)
tycho_mpi_test(mpi_trace.pp2_interleaved_dp2 4 COMMAND $<TARGET_FILE:mpi_trace> ${PROJECT_SOURCE_DIR}/tests/plans/good/dp_small.lua
  ${CMAKE_CURRENT_BINARY_DIR}/mpi_trace_pp2_interleaved.json --set mesh.pp=2 --set virtual_stages=2
  --set schedule.kind=interleaved --set model.n_layers=4 --set train.steps=3 --set log.trace_steps=2
  --set train.eval_every=1)
tycho_mpi_test(mpi_trace.pp4_zb_h1 4 COMMAND $<TARGET_FILE:mpi_trace> ${PROJECT_SOURCE_DIR}/tests/plans/good/dp_small.lua
  ${CMAKE_CURRENT_BINARY_DIR}/mpi_trace_pp4_zb_h1.json --set mesh.pp=4 --set schedule.kind=zb-h1
  --set model.n_layers=4 --set train.steps=3 --set log.trace_steps=2 --set train.eval_every=1)
tycho_mpi_test(mpi_trace.serial 1 COMMAND $<TARGET_FILE:mpi_trace> ${PROJECT_SOURCE_DIR}/tests/plans/good/dp_small.lua
  ${CMAKE_CURRENT_BINARY_DIR}/mpi_trace_serial.json --set train.steps=3 --set log.trace_steps=2 --set train.eval_every=1)

# The memory bill `tycho check` predicts against the per-rank memory records of `tycho run`.
function(tycho_bill name ranks plan)
  add_test(NAME mpi_bill.${name} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/run_bill.sh ${ranks}
    ${TYCHO_MPIEXEC} ${TYCHO_NP_FLAG} $<TARGET_FILE:tycho> ${PROJECT_SOURCE_DIR}/tests/plans/good/${plan} ${ARGN})
  tycho_mpi_env(mpi_bill.${name} env)
  set_tests_properties(mpi_bill.${name} PROPERTIES TIMEOUT 90 PROCESSORS ${ranks} LABELS mpi
    ENVIRONMENT "${env}")
endfunction()
tycho_bill(serial 1 dp_small.lua)
tycho_bill(dp2_zero3 2 dp_small.lua --set zero=3)
tycho_bill(dp2_zero2_micro2 2 dp_small.lua --set zero=2 --set batch.micro=2)
tycho_bill(tp2_sp_recompute 2 dp_small.lua --set mesh.tp=2 --set sequence_parallel=true --set recompute=full)
tycho_bill(tp2_pp2 4 dp_small.lua --set mesh.tp=2 --set mesh.pp=2)
tycho_bill(pp2_gpipe_dp2_zero1 4 dp_small.lua --set mesh.pp=2 --set schedule.kind=gpipe --set zero=1)
tycho_bill(async_dp2_zero1 2 dp_small.lua --async-checkpoint --set zero=1)
tycho_bill(async_tp2_dp2_zero3 4 dp_small.lua --async-checkpoint --set mesh.tp=2 --set zero=3)
tycho_bill(pp2_dp2_zero3_step 4 dp_small.lua --set mesh.pp=2 --set zero=3 --set model.n_layers=6)
tycho_bill(pp2_interleaved_dp2_zero2_micro_batch 4 dp_small.lua --set mesh.pp=2 --set virtual_stages=2
  --set schedule.kind=interleaved --set model.n_layers=4 --set zero=2 --set zero_every.grads=micro_batch)
# zero-bubble: the split backward's held output gradients and the slots kept until each W
tycho_bill(pp2_zb_h1_dp2_zero1 4 dp_small.lua --set mesh.pp=2 --set schedule.kind=zb-h1 --set zero=1)
tycho_bill(pp2_zb_h1_dp2_zero2 4 dp_small.lua --set mesh.pp=2 --set schedule.kind=zb-h1 --set zero=2 --set batch.micro=2)
tycho_bill(pp2_zb_h1_dp2_zero3 4 dp_small.lua --set mesh.pp=2 --set schedule.kind=zb-h1 --set zero=3 --set batch.micro=2
  --set model.n_layers=4)
tycho_bill(tp2_pp2_zb_h1_sp 4 dp_small.lua --set mesh.tp=2 --set mesh.pp=2 --set schedule.kind=zb-h1
  --set sequence_parallel=true)
# context parallelism: activations of a cp rank's rows, the ring's buffers (comm: its transfers';
# workspace: its blocks' and the rows' ids), the dp layer's shards over dp × cp
tycho_bill(cp2 2 dp_small.lua --set mesh.cp=2)
tycho_bill(cp2_dp2_zero1 4 dp_small.lua --set mesh.cp=2 --set mesh.dp=2 --set zero=1)
tycho_bill(cp2_dp2_zero3 4 dp_small.lua --set mesh.cp=2 --set mesh.dp=2 --set zero=3)
tycho_bill(cp2_tp2_sp 4 dp_small.lua --set mesh.cp=2 --set mesh.tp=2 --set sequence_parallel=true)
tycho_bill(cp2_pp2 4 dp_small.lua --set mesh.cp=2 --set mesh.pp=2)
# sparse layers (ep 1): the experts' parameters and their rows' activations at capacity
tycho_bill(moe_dp2_zero3 2 moe_small.lua --set zero=3)
tycho_bill(moe_pp2_gpipe_dp2_zero1 4 moe_small.lua --set mesh.pp=2 --set schedule.kind=gpipe --set zero=1)
tycho_bill(moe_dropless_serial 1 moe_small.lua --set model.moe.capacity_factor=0)
# bf16: the fp32 master is optimizer state, sharded with the moments from ZeRO 1 on (the async
# snapshot holds the shard), the whole bf16 copies are params under ZeRO 1 and 2; under ZeRO 3
# only the shard's copies are held and each gathered unit's bf16 copies are transient params
if(NOT TYCHO_FLOAT64)
  tycho_bill(async_bf16_dp2_zero3 2 dp_small.lua --async-checkpoint --set zero=3 --set precision.compute=bf16)
  tycho_bill(async_bf16_dp2_zero1 2 dp_small.lua --async-checkpoint --set zero=1 --set precision.compute=bf16)
  tycho_bill(bf16_tp2_dp2_zero2 4 dp_small.lua --set mesh.tp=2 --set zero=2 --set precision.compute=bf16)
  # bf16 gradients: the bf16 shard, each bucket's fp32 sums with their bf16 image, the bf16
  # reduce-scatter outputs and bytes, the widened share of the norm and AdamW
  tycho_bill(bf16_grads_pp2_dp2_zero2_step 4 dp_small.lua --set mesh.pp=2 --set zero=2 --set zero_every.grads=step
    --set precision.compute=bf16 --set precision.grads=bf16)
  tycho_bill(bf16_grads_pp2_zb_h1_dp2_zero1 4 dp_small.lua --set mesh.pp=2 --set schedule.kind=zb-h1 --set zero=1
    --set precision.compute=bf16 --set precision.grads=bf16)
  tycho_bill(bf16_grads_dp2_zero1_tied 2 dp_small.lua --set zero=1 --set precision.compute=bf16
    --set precision.grads=bf16 --set model.tie_embeddings=true)
  tycho_bill(bf16_grads_pp2_dp2_zero3_tied 4 dp_small.lua --set mesh.pp=2 --set zero=3 --set precision.compute=bf16
    --set precision.grads=bf16 --set zero_every.grads=micro_batch --set zero_every.params=micro_batch
    --set model.tie_embeddings=true)
endif()

# init.from read block by block and export put together under tensor and pipeline parallelism.
foreach(config "tp2;2;--set;mesh.tp=2" "tp2_pp2;4;--set;mesh.tp=2;--set;mesh.pp=2"
               "tp2_pp2_tied_vocab63;4;--both;model.vocab=63;--both;model.tie_embeddings=true;--set;mesh.tp=2;--set;mesh.pp=2"
               "hf_tp2;2;--hf;--set;mesh.tp=2")
  list(GET config 0 name)
  list(GET config 1 ranks)
  list(SUBLIST config 2 -1 sets)
  add_test(NAME mpi_init_export.${name} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/run_init_export.sh ${ranks}
    ${TYCHO_MPIEXEC} ${TYCHO_NP_FLAG} $<TARGET_FILE:tycho> ${sets} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  tycho_mpi_env(mpi_init_export.${name} env)
  set_tests_properties(mpi_init_export.${name} PROPERTIES TIMEOUT 90 PROCESSORS ${ranks} LABELS mpi
    ENVIRONMENT "${env}")
endforeach()

# Checkpoints saved on one layout and resumed on another (resharding), against the uninterrupted
# serial run. config: name; ranks saving; ranks resuming; arguments (--both/--save/--load f=v).
foreach(config "serial;1;1"
               "serial_to_tp2_sp_dp2_zero3;1;4;--load;mesh.tp=2;--load;sequence_parallel=true;--load;zero=3"
               "tp2_pp2_dp2_zero1_to_serial;8;1;--save;mesh.tp=2;--save;mesh.pp=2;--save;zero=1"
               "dp4_zero3_to_tp2_pp2;4;4;--save;zero=3;--load;mesh.tp=2;--load;mesh.pp=2"
               "tied_vocab63_tp2_to_pp2_dp2_zero1;2;4;--both;model.vocab=63;--both;model.tie_embeddings=true;--save;mesh.tp=2;--load;mesh.pp=2;--load;zero=1"
               "tied_pp2_dp2_zero3_to_dp2_zero2;4;2;--both;model.tie_embeddings=true;--save;mesh.pp=2;--save;zero=3;--load;zero=2"
               # context parallelism: the cp ranks of a dp rank hold the same state, written once
               "cp2_dp2_zero1_to_serial;4;1;--save;mesh.cp=2;--save;mesh.dp=2;--save;zero=1"
               "serial_to_cp2_zero3;1;2;--load;mesh.cp=2;--load;zero=3"
               # expert parallelism: the experts' state sharded over ep (and under ZeRO over edp),
               # saved and resumed on other ep layouts; no dropout, so an fp32 near-tie in the
               # router cannot flip a routing decision (tests/mpi.cmake's ep cases say why)
               "ep2_zero1_to_serial;4;1;--plan;tests/plans/good/ep_small.lua;--both;model.dropout=0;--save;mesh.ep=2;--save;zero=1"
               "serial_to_ep4_zero3;1;4;--plan;tests/plans/good/ep_small.lua;--both;model.dropout=0;--load;mesh.ep=4;--load;zero=3"
               "ep2_zero2_to_ep4_pp2;4;8;--plan;tests/plans/good/ep_small.lua;--both;model.dropout=0;--save;mesh.ep=2;--save;zero=2;--load;mesh.ep=4;--load;mesh.pp=2"
               # bf16: the fp32 master and moments saved from their dp shards (zero 1), resumed
               # on a layout that shards them otherwise (tp 2, zero 3) and on one rank
               "bf16_dp2_zero1_to_tp2_dp2_zero3;2;4;--tol;1e-4;--both;precision.compute=bf16;--save;zero=1;--load;mesh.tp=2;--load;zero=3"
               "bf16_pp2_dp2_zero2_to_serial;4;1;--tol;1e-4;--both;precision.compute=bf16;--save;mesh.pp=2;--save;zero=2")
  list(GET config 0 name)
  if(TYCHO_FLOAT64 AND name MATCHES "^bf16_") # the float64 build has no bf16 compute
    continue()
  endif()
  list(GET config 1 save_ranks)
  list(GET config 2 load_ranks)
  set(sets "")
  list(LENGTH config n)
  if(n GREATER 3)
    list(SUBLIST config 3 -1 sets)
  endif()
  set(most ${save_ranks})
  if(load_ranks GREATER most)
    set(most ${load_ranks})
  endif()
  add_test(NAME mpi_ckpt.${name} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/run_ckpt.sh ${save_ranks} ${load_ranks}
    ${TYCHO_MPIEXEC} ${TYCHO_NP_FLAG} $<TARGET_FILE:tycho> ${sets} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  tycho_mpi_env(mpi_ckpt.${name} env)
  set_tests_properties(mpi_ckpt.${name} PROPERTIES TIMEOUT 120 PROCESSORS ${most} LABELS mpi
    ENVIRONMENT "${env}")
endforeach()
