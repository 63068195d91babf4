#!/usr/bin/env bash
# Installs what is missing, builds tycho twice (warnings are errors) and runs the test suite in
# both: the fp32 build (build/) runs every test; the float64 proof build (build-f64/,
# -DTYCHO_FLOAT64=ON) runs every test whose result depends on the element type — kernels,
# model, training, optimizer, weights and checkpoints, the CLI, and every layout against its
# serial run, held there to 1e-10 — and leaves out those that do not (the plan compiler and
# its malformed plans, schedules, the cost model, tokens, the corpus, the comm layer's error and
# overlap tests, the watchdog, the fuzzer; the collectives run in both, COMM_REAL included). Arguments go to both ctest runs (e.g. -R mpi_tp_equiv).
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh || exit 1
element_independent='^(bad_plan|crash_plan|fuzz_plan|e2e\.cli_numbers|e2e\.cluster_refusals|e2e\.data_refusals|e2e\.run_outputs|e2e\.special_files|e2e\.run_signals|e2e\.run_resume_changes|e2e\.run_ckpt_links|mpi_run_signals|e2e\.repl_|e2e\.examples_repl|mpi_watchdog|mpi_run_errors|mpi_overlap|mpi_errors|fuzz_safetensors|test_sched_|test_plan_compile|test_plan_fields|test_tokens|test_addition|test_cost|test_comm_world_of_one|test_srcmap|e2e\.check_many_stages|e2e\.check_long_context|e2e\.check_attention_linear|test_json|test_file|test_repl_value|e2e\.names_utf8|e2e\.tune_written_plan|e2e\.layering|e2e\.run_hf_folder|test_device_choice|test_threads|e2e\.run_threads|e2e\.run_device|e2e\.check_sbatch|slurm\.)'
rc=0
for build in build build-f64; do
  flags=(-DTYCHO_WERROR=ON -DTYCHO_FLOAT64=OFF)
  exclude=()
  if [ "$build" = build-f64 ]; then
    flags=(-DTYCHO_WERROR=ON -DTYCHO_FLOAT64=ON)
    exclude=(-E "$element_independent")
  fi
  echo "== $build (${flags[*]})"
  cmake -S . -B "$build" "${flags[@]}" >/dev/null && cmake --build "$build" -j "$(nproc)" || exit 1
  (cd "$build" && ctest --output-on-failure -j "$(nproc)" "${exclude[@]}" "$@") || rc=1
done
exit $rc
