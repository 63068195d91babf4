# `tycho rehearse` (tests/mpi/rehearse.sh): the launcher starts the ranks itself, so the tests run
# the tycho binary, not mpirun. Included from tests/CMakeLists.txt after mpi.cmake.
if(NOT TYCHO_MPIEXEC OR NOT TYCHO_TIMEOUT)
  return()
endif()
function(tycho_rehearse_test name ranks timeout)
  add_test(NAME mpi_rehearse.${name} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/mpi/rehearse.sh ${ARGN}
    ${TYCHO_MPIEXEC} $<TARGET_FILE:tycho> ${ranks} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  tycho_mpi_env(mpi_rehearse.${name} env)
  set_tests_properties(mpi_rehearse.${name} PROPERTIES TIMEOUT ${timeout} PROCESSORS 2 LABELS mpi
    ENVIRONMENT "${env}")
endfunction()
tycho_rehearse_test(layouts 8 120 layouts)
tycho_rehearse_test(faults 2 120 faults)
tycho_rehearse_test(refusals 2 120 refusals)
# The shipped plans' layouts: Llama-2 7B on 8 ranks (tp 2 × dp 4, ZeRO-1, sequence parallel,
# selective recompute), 70B on 64 (tp 8 × pp 4 × dp 2, 1F1B, 80 layers): about 10 s and 90 s on
# 2 cores. The 64 ranks take the machine: run alone.
tycho_rehearse_test(llama2_7b 8 300 plans/llama2_7b.lua)
# Mixtral 8x7B's layout at pp 4 (16 ranks; rehearse.sh says why not its 64): about 30 s on 2 cores
tycho_rehearse_test(mixtral_8x7b 16 300 mixtral)
tycho_rehearse_test(llama2_70b 64 900 plans/llama2_70b.lua)
set_tests_properties(mpi_rehearse.llama2_70b PROPERTIES RUN_SERIAL TRUE)
