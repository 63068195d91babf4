# Plan tests: each malformed plan under tests/plans/bad/ (files not starting with "_") is one
# ctest that must be refused with its expected message and line.
file(GLOB TYCHO_BAD_PLANS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/plans/bad/*.lua)
foreach(plan ${TYCHO_BAD_PLANS})
  get_filename_component(name ${plan} NAME_WE)
  if(name MATCHES "^_")
    continue()
  endif()
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${plan})
  add_test(NAME bad_plan.${name}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/plans/check_bad_plan.sh $<TARGET_FILE:tycho> ${rel}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(bad_plan.${name} PROPERTIES TIMEOUT 60)
endforeach()

# Crash inputs: plans that once crashed or hung tycho (issue 14); each must now be refused like a
# bad plan, exit code 2 with its message and line.
file(GLOB TYCHO_CRASH_PLANS CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/plans/crash/*.lua)
foreach(plan ${TYCHO_CRASH_PLANS})
  get_filename_component(name ${plan} NAME_WE)
  if(name MATCHES "^_")
    continue()
  endif()
  file(RELATIVE_PATH rel ${PROJECT_SOURCE_DIR} ${plan})
  add_test(NAME crash_plan.${name}
    COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/plans/check_bad_plan.sh $<TARGET_FILE:tycho> ${rel}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(crash_plan.${name} PROPERTIES TIMEOUT 60)
endforeach()

# The crash plans that hit a limit, under mpirun with 2 ranks: every rank's limit fires alike and
# the job stops with exit code 2 and the message, never a hang.
find_program(TYCHO_CRASH_MPIRUN NAMES mpirun mpiexec)
if(TYCHO_CRASH_MPIRUN)
  foreach(name pcall_swallows_limit xpcall_swallows_limit pattern_backtracking_pcall index_endless_loop)
    add_test(NAME crash_plan_mpi.${name}
      COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/plans/crash/check_mpi.sh ${TYCHO_CRASH_MPIRUN}
        $<TARGET_FILE:tycho> tests/plans/crash/${name}.lua
      WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    tycho_session_env(crash_plan_mpi.${name} session)
    set_tests_properties(crash_plan_mpi.${name} PROPERTIES TIMEOUT 90 PROCESSORS 2 LABELS mpi
      ENVIRONMENT "${session};OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1;OMPI_MCA_btl=self,vader;OMPI_MCA_mpi_yield_when_idle=1;OPENBLAS_NUM_THREADS=1;OMP_NUM_THREADS=1")
  endforeach()
endif()

# The command line: help, exit codes, check output for the shipped plans, --json, --set, sandbox.
add_test(NAME cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/test_cli.sh $<TARGET_FILE:tycho>
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
tycho_session_env(cli session)
set_tests_properties(cli PROPERTIES TIMEOUT 120 ENVIRONMENT "${session}")

# Checkpoints that go wrong: corrupt, truncated, cut short, another model, a crash's leftover.
add_test(NAME cli_ckpt_errors COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/ckpt_errors.sh $<TARGET_FILE:tycho>
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
tycho_session_env(cli_ckpt_errors session)
set_tests_properties(cli_ckpt_errors PROPERTIES TIMEOUT 120 ENVIRONMENT "${session}")

# Exit codes by class: bad content in weights, token files, a manifest, a cluster file, a lock held.
add_test(NAME cli_input_errors COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/input_errors.sh $<TARGET_FILE:tycho>
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
tycho_session_env(cli_input_errors session)
set_tests_properties(cli_input_errors PROPERTIES TIMEOUT 120 ENVIRONMENT "${session};OPENBLAS_NUM_THREADS=1")
