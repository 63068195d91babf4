# Sourced by the shell tests: what the tycho binary under test computes in, and the bound that a
# run compared with another layout's run of the same plan is held to (tests/mpi/mpi_dp_equiv.c
# argues both). usage: . tests/lib/build.sh TYCHO
#   REAL_NAME   fp32 | float64 (`tycho --version`)
#   REAL_BYTES  4 | 8: bytes of a weight, a gradient, an AdamW moment, a message element
#   EQUIV_TOL   relative error of a loss: fp32 1e-5 (layouts differ by rounding, measured ≤ 1e-8
#               per step; a layout bug moves losses by ≥ 1e-3); float64 1e-10 (rounding ~1e-15)
#   NORM_TOL    relative error of a gradient norm: fp32 1e-3 (where the loss bends sharply the
#               norm magnifies rounding-sized weight differences: measured up to 9e-5); float64
#               1e-10
if "$1" --version | grep -q 'float64'; then
  REAL_NAME=float64 REAL_BYTES=8 EQUIV_TOL=1e-10 NORM_TOL=1e-10
else
  REAL_NAME=fp32 REAL_BYTES=4 EQUIV_TOL=1e-5 NORM_TOL=1e-3
fi
