/* The kernels' matrix products in row tiles (blas.h). OpenBLAS runs on one thread
 * (kernels_init_cpu); the OpenMP threads share a product's tiles. OpenBLAS's own threaded
 * product splits its work by the thread count, and on some of its kernels (Haswell's sgemm among
 * them) the bits of C then change with the count: the same plan gave other weights at 1 and 2
 * threads. The tiles here are fixed by M, so a run's results are the same at any thread count,
 * and the count can change between steps (threads_governor). Against OpenBLAS's threaded sgemm
 * at plans/tiny.lua's and bench_train's dim-256 shapes on 2 cores, the tiled products took
 * 0.94-1.00x its time (bench_gemm). */
#include <omp.h>

#include "blas.h"

enum { TILE_MIN = 64, TILE_ALIGN = 16, TILES_MAX = 64 };

int gemm_row_tile(int M)
{
  int t = (M + TILES_MAX - 1) / TILES_MAX;
  t = (t + TILE_ALIGN - 1) / TILE_ALIGN * TILE_ALIGN;
  return t < TILE_MIN ? TILE_MIN : t;
}

void gemm_rows(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, real alpha,
               const real *A, int lda, const real *B, int ldb, real beta, real *C, int ldc)
{
  if (M <= 0 || N <= 0) return;
  const int tile = gemm_row_tile(M), tiles = (M + tile - 1) / tile;
  const int parallel = tiles > 1 && !omp_in_parallel() && omp_get_max_threads() > 1;
  /* OpenBLAS's OpenMP build sizes its own team from omp_get_max_threads() whatever
   * openblas_set_num_threads said, except inside an active parallel region: a call made outside
   * one runs with the thread count set to 1 for its duration. */
  const int threads = parallel ? 0 : omp_get_max_threads();
  if (threads > 1) omp_set_num_threads(1);
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int t = 0; t < tiles; t++) {
    const int i = t * tile, m = M - i < tile ? M - i : tile;
    /* rows i.. of op(A): rows of A, or columns of A when it is transposed */
    const real *a = ta == CblasNoTrans ? A + (size_t)i * lda : A + i;
    real_gemm(CblasRowMajor, ta, tb, m, N, K, alpha, a, lda, B, ldb, beta, C + (size_t)i * ldc, ldc);
  }
  if (threads > 1) omp_set_num_threads(threads);
}
