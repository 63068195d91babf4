# tycho under a real Slurm (tests/slurm/slurm.sh, label `slurm`): a one-node cluster of the test's
# own, Debian's slurm-wlm and munge installed when missing (exit 77, skipped with the reason, where
# they cannot be). About 15 s once installed; the timeout leaves room for the install. Included
# from tests/CMakeLists.txt.
find_program(TYCHO_SLURM_MPIRUN NAMES mpirun)
if(NOT TYCHO_SLURM_MPIRUN)
  return()
endif()
add_test(NAME slurm.run COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/slurm.sh $<TARGET_FILE:tycho>
  WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
tycho_session_env(slurm.run session)
set_tests_properties(slurm.run PROPERTIES TIMEOUT 900 PROCESSORS 4 LABELS slurm SKIP_RETURN_CODE 77
  ENVIRONMENT "${session}")
