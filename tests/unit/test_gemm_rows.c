/* The kernels' matrix product in row tiles (kernels/cpu/blas.h): the same bits at any thread count,
 * inside or outside a parallel region, for every transpose and beta; within rounding of a double
 * reference; and tiles that depend on the rows alone. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/blas.h"
#include "kernels.h"

static real *filled(size_t n, unsigned seed)
{
  real *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (real)((double)(seed >> 8) / (double)(1u << 24) - 0.5);
  }
  return p;
}

static void tiles_depend_on_rows_alone(void)
{
  for (int M = 1; M <= 20000; M += M < 300 ? 1 : 97) {
    const int t = gemm_row_tile(M), tiles = (M + t - 1) / t;
    CHECK_MSG(t >= 64 && t % 16 == 0 && tiles <= 64, "M %d: tile %d, %d tiles", M, t, tiles);
  }
  CHECK(gemm_row_tile(256) == 64);
  CHECK(gemm_row_tile(4096) == 64);
  CHECK(gemm_row_tile(4097) == 80);
}

/* op(A)[i][k] and op(B)[k][j] of row-major A (lda) and B (ldb) */
static double at(const real *X, int ld, int trans, int r, int c)
{
  return trans ? (double)X[(size_t)c * ld + r] : (double)X[(size_t)r * ld + c];
}

static void one_case(int M, int N, int K, int ta, int tb, int acc, unsigned seed)
{
  const int lda = ta ? M : K, ldb = tb ? K : N;
  const size_t nc = (size_t)M * N;
  real *A = filled((size_t)M * K, seed), *B = filled((size_t)K * N, seed + 7);
  real *C0 = filled(nc, seed + 13), *C = malloc(nc * sizeof *C), *one = malloc(nc * sizeof *one);
  const enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  const real beta = acc ? 1.0f : 0.0f;
  const double eps = REAL_IS_DOUBLE ? DBL_EPSILON : FLT_EPSILON;
  for (int th = 1; th <= 4; th++) {
    omp_set_num_threads(th);
    memcpy(C, C0, nc * sizeof *C);
    gemm_rows(TA, TB, M, N, K, 1.0f, A, lda, B, ldb, beta, C, N);
    if (th == 1)
      memcpy(one, C, nc * sizeof *C);
    else
      CHECK_MSG(memcmp(C, one, nc * sizeof *C) == 0, "M %d N %d K %d ta %d tb %d beta %d: %d threads' bits differ from one's",
                M, N, K, ta, tb, acc, th);
  }
  /* within rounding of a reference in double: a sum of K + 1 terms is within (K + 1)·eps of the
   * sum of their magnitudes, and the reference's own rounding (float64 build) as much again */
  double worst = 0.0;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double sum = acc ? (double)C0[(size_t)i * N + j] : 0.0, mag = fabs(sum);
      for (int k = 0; k < K; k++) {
        const double p = at(A, lda, ta, i, k) * at(B, ldb, tb, k, j);
        sum += p;
        mag += fabs(p);
      }
      const double e = fabs((double)one[(size_t)i * N + j] - sum) / (2.0 * (K + 1) * eps * mag + 1e-300);
      worst = e > worst ? e : worst;
    }
  CHECK_MSG(worst <= 1.0, "M %d N %d K %d ta %d tb %d beta %d: error %.3f of its bound", M, N, K, ta, tb, acc, worst);
  /* inside a parallel region (a kernel's task loop): the tiles run one after another, same bits */
  omp_set_num_threads(2);
  memcpy(C, C0, nc * sizeof *C);
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    gemm_rows(TA, TB, M, N, K, 1.0f, A, lda, B, ldb, beta, C, N);
  }
  CHECK_MSG(memcmp(C, one, nc * sizeof *C) == 0, "M %d N %d K %d ta %d tb %d beta %d: inside a parallel region the bits differ",
            M, N, K, ta, tb, acc);
  free(A), free(B), free(C0), free(C), free(one);
}

static void same_bits_at_any_thread_count(void)
{
  static const int shapes[][3] = {{1, 7, 5}, {63, 33, 17}, {64, 64, 64}, {65, 20, 300}, {256, 128, 128},
                                  {200, 384, 128}, {64, 128, 256}, {1000, 72, 96}, {4100, 24, 40}};
  const int threads0 = omp_get_max_threads();
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++)
        for (int acc = 0; acc < 2; acc++)
          one_case(shapes[s][0], shapes[s][1], shapes[s][2], ta, tb, acc, 1 + (unsigned)s);
  omp_set_num_threads(threads0);
}

TEST_MAIN(TEST(tiles_depend_on_rows_alone), TEST(same_bits_at_any_thread_count))
