/* The CPU kernels' matrix product: cblas_sgemm on fp32, cblas_dgemm in the float64 build
 * (kernels/real.h). Same arguments, so every call site reads the same in both builds. */
#ifndef TYCHO_KERNELS_CPU_BLAS_H
#define TYCHO_KERNELS_CPU_BLAS_H
#include <cblas.h>

#include "real.h"

#if REAL_IS_DOUBLE
#define real_gemm cblas_dgemm
#else
#define real_gemm cblas_sgemm
#endif

#endif
