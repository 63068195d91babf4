/* The kernels' matrix products in row tiles (blas.h). The OpenMP threads share a product's tiles;
 * each tile is one single-threaded call of oneDNN's sgemm (fp32 with oneDNN) or OpenBLAS (which
 * stays on one thread, kernels_init_cpu). OpenBLAS's own threaded product split its work by the
 * thread count, and under its Haswell kernel the bits of C then changed with the count: the same
 * plan trained other weights at 1 and 2 threads. The tiles are fixed by M, so a run's results are
 * the same at any thread count, and the count can change between steps (threads_adapt.h).
 * Measured on 2 cores (bench_train, host/runtime/README.md "Threads" and "fp32 products"): the
 * OpenBLAS tiles ran the tiny plan's step as fast as its threaded sgemm and the dim-256 model's
 * 12-16% faster; oneDNN's tiles are as fast or faster than OpenBLAS's under every kernel OpenBLAS
 * picks, 1.4-1.9x under Haswell's. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"

#if defined(TYCHO_HAVE_DNNL) && !REAL_IS_DOUBLE
#include <oneapi/dnnl/dnnl.h>
#define GEMM_HAVE_DNNL 1
#else
#define GEMM_HAVE_DNNL 0
#endif

/* The engine of the fp32 tiles: oneDNN's sgemm where the build has oneDNN, unless TYCHO_GEMM=openblas
 * (decided once, before the first product). */
static int dnnl_tiles = -1;

static int tiles_on_dnnl(void)
{
  if (dnnl_tiles < 0) {
    const char *env = getenv("TYCHO_GEMM");
    int on = GEMM_HAVE_DNNL;
    if (env && *env) {
      if (strcmp(env, "openblas") == 0)
        on = 0;
      else if (strcmp(env, "onednn") != 0 || !GEMM_HAVE_DNNL)
        fprintf(stderr, "tycho: TYCHO_GEMM=%s: %s; the products use %s\n", env,
                strcmp(env, "onednn") == 0 ? "this build has no oneDNN (or is the float64 build)"
                                           : "not one of openblas, onednn",
                on ? "oneDNN's sgemm" : "OpenBLAS");
    }
    dnnl_tiles = on;
  }
  return dnnl_tiles;
}

const char *gemm_engine(void)
{
  return tiles_on_dnnl() ? "oneDNN's sgemm" : REAL_IS_DOUBLE ? "OpenBLAS's dgemm" : "OpenBLAS's sgemm";
}

/* One tile on one thread. oneDNN fails only on arguments the kernels never pass; should it, the
 * tile is OpenBLAS's (other bits, said once). */
static void tile_gemm(int dnnl, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int m, int N, int K,
                      real alpha, const real *a, int lda, const real *B, int ldb, real beta, real *c,
                      int ldc)
{
#if GEMM_HAVE_DNNL
  if (dnnl) {
    if (dnnl_sgemm(ta == CblasNoTrans ? 'N' : 'T', tb == CblasNoTrans ? 'N' : 'T', m, N, K, alpha, a, lda,
                   B, ldb, beta, c, ldc) == dnnl_success)
      return;
#pragma omp critical(gemm_said)
    {
      static int said;
      if (!said)
        fprintf(stderr, "tycho: oneDNN's sgemm refused a %d x %d x %d product; OpenBLAS computes it\n", m, N, K);
      said = 1;
    }
  }
#else
  (void)dnnl;
#endif
  real_gemm(CblasRowMajor, ta, tb, m, N, K, alpha, a, lda, B, ldb, beta, c, ldc);
}

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
   * openblas_set_num_threads said, and oneDNN does the same, except inside an active parallel
   * region: a call made outside one runs with the thread count set to 1 for its duration. */
  const int threads = parallel ? 0 : omp_get_max_threads(), dnnl = tiles_on_dnnl();
  if (threads > 1) omp_set_num_threads(1);
  /* rows i.. of op(A): rows of A, or columns of A when it is transposed */
#define TILE(t)                                                                                      \
  do {                                                                                               \
    const int i = (t) * tile, m = M - i < tile ? M - i : tile;                                       \
    const real *a = ta == CblasNoTrans ? A + (size_t)i * lda : A + i;                                \
    tile_gemm(dnnl, ta, tb, m, N, K, alpha, a, lda, B, ldb, beta, C + (size_t)i * ldc, ldc);         \
  } while (0)
  if (parallel) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < tiles; t++) TILE(t);
  } else { /* a plain loop: an inactive parallel region costs a call into the runtime */
    for (int t = 0; t < tiles; t++) TILE(t);
  }
#undef TILE
  if (threads > 1) omp_set_num_threads(threads);
}
