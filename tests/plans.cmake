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
