/* The CPU kernels' matrix product. real_gemm is cblas_sgemm on fp32 and cblas_dgemm in the
 * float64 build (kernels/real.h), called on one thread only (oneDNN's sgemm stands in for it in
 * fp32 where the build has oneDNN, gemm_engine); gemm_rows is what the kernels call:
 * the same arguments, the product cut into row tiles fixed by the shape and the tiles shared
 * among the OpenMP threads. */
#ifndef TYCHO_KERNELS_CPU_BLAS_H
#define TYCHO_KERNELS_CPU_BLAS_H
#include <cblas.h>

#include "real.h"

#if REAL_IS_DOUBLE
#define real_gemm cblas_dgemm
#else
#define real_gemm cblas_sgemm
#endif

/* What computes the tiles: "oneDNN's sgemm" (fp32 where the build has oneDNN: ~2x OpenBLAS's
 * Haswell kernel on the step's shapes, 1.04-1.10x its Cooperlake one), else "OpenBLAS's sgemm"
 * ("OpenBLAS's dgemm" in the float64 build). TYCHO_GEMM=openblas chooses OpenBLAS. */
const char *gemm_engine(void);

/* Rows of C per tile for an M-row product: at least 64, a multiple of 16, and at most 64 tiles.
 * A function of M alone, never of the thread count. */
int gemm_row_tile(int M);

/* Row-major C = alpha · op(A) · op(B) + beta · C (cblas's arguments), computed as row tiles of C
 * (gemm_row_tile), each by a one-threaded BLAS call on its rows of op(A) and the whole op(B),
 * handed to the OpenMP threads as they come free. Every tile is the same call whichever thread
 * runs it, so C's bits do not depend on the thread count, and a thread that the system delays
 * holds back only the tile it has. Inside a parallel region the tiles run one after another. */
void gemm_rows(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, real alpha,
               const real *A, int lda, const real *B, int ldb, real beta, real *C, int ldc);

#endif
