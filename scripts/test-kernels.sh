#!/usr/bin/env bash
# Runs the numerical tests once per OpenBLAS kernel set: the suite must pass whichever gemm
# kernel OpenBLAS picks. OpenBLAS here is a DYNAMIC_ARCH build and OPENBLAS_CORETYPE chooses
# the kernel set (sgemm, dgemm and the rest). For each, prints the kernel OpenBLAS actually
# ran (OPENBLAS_VERBOSE=2 makes it say "Core: NAME" when it loads), then a table kernel ->
# passed/FAILED with the failing tests; exits 1 if any failed.
#
#   scripts/test-kernels.sh [--build DIR] [CTEST ARGS...]
#
# --build DIR: the build folder (default build/; a float64 one, made with -DTYCHO_FLOAT64=ON,
# works too: its cache keeps the option). Other arguments go to every ctest run.
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
if [ "${1:-}" = "--build" ]; then
  build=${2:?--build needs a folder}
  shift 2
fi

./scripts/install-deps.sh
cmake -S . -B "$build" -DTYCHO_WERROR=ON >/dev/null
cmake --build "$build" -j "$(nproc)"

tests='^(test_kernels.*|test_model.*|test_train.*|test_reference_torch|test_optimizer|test_weights'
tests+='|mpi_dp_equiv\..*|mpi_tp_equiv\..*|mpi_tp_convert\..*|mpi_ckpt\..*|mpi_init_export\..*'
tests+='|mpi_run\..*|mpi_bill\..*)$'

# auto: OPENBLAS_CORETYPE (and OPENBLAS_L2_SIZE) unset, OpenBLAS detects the CPU. OpenBLAS
# 0.3.21 knows neither "Cooperlake" nor "SapphireRapids" as a name to force ("Core not found")
# and falls back to detection, which on an AVX-512 BF16 CPU is Cooperlake again. Sandybridge is
# the AVX-only kernel set (no FMA, no AVX2).
kernels=(auto Haswell SkylakeX Cooperlake SapphireRapids Sandybridge)
declare -A result picked failed

for k in "${kernels[@]}"; do
  if [ "$k" = auto ]; then
    run=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
  else
    run=(env OPENBLAS_CORETYPE="$k")
  fi
  banner=$("${run[@]}" OPENBLAS_VERBOSE=2 "$build/tycho" --version 2>&1 || true)
  picked[$k]=$(sed -n 's/^Core: //p' <<<"$banner" | head -n 1)
  grep -q '^Core not found' <<<"$banner" && picked[$k]+=" (name unknown, detected)"
  echo "=== OPENBLAS_CORETYPE=$k: OpenBLAS runs ${picked[$k]:-?}"
  if (cd "$build" && "${run[@]}" ctest --output-on-failure -j "$(nproc)" -R "$tests" "$@"); then
    result[$k]=passed
    failed[$k]=
  else
    result[$k]=FAILED
    failed[$k]=$(cut -d: -f2 "$build/Testing/Temporary/LastTestsFailed.log" 2>/dev/null | tr '\n' ' ')
  fi
done

status=0
printf '\n%-16s %-36s %-7s %s\n' OPENBLAS_CORETYPE "OpenBLAS runs" result "failed tests"
for k in "${kernels[@]}"; do
  printf '%-16s %-36s %-7s %s\n' "$k" "${picked[$k]:-?}" "${result[$k]}" "${failed[$k]}"
  [ "${result[$k]}" = passed ] || status=1
done
exit $status
