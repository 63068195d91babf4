/* kernels_init_cpu puts every thread that computes — the caller, the OpenMP team and the
 * OpenBLAS workers — into flush-to-zero / denormals-are-zero mode. Seen from outside: a
 * denormal input reads as 0 in sgemm and in an OpenMP loop, in every thread's share of the
 * output. OpenBLAS can only pass the mode to workers it starts after the call, which is why
 * the test runs (as ctest does) with OPENBLAS_NUM_THREADS=1 in the environment. */
#include <stdlib.h>

#include "check.h"
#include "kernels.h"

#include <cblas.h>

static void init_sets_flush_to_zero_in_all_threads(void)
{
  const char *env = getenv("OPENBLAS_NUM_THREADS");
  int pool_predates_mode = kernels_init_cpu(4);
  if (!env || strcmp(env, "1") != 0) {
    printf("note: OPENBLAS_NUM_THREADS is not 1, OpenBLAS workers predate the mode; "
           "checking the return value only\n");
    CHECK(pool_predates_mode == (openblas_get_num_procs() > 1));
    return;
  }
  CHECK(pool_predates_mode == 0);
#if defined(__x86_64__)
  /* 256 × 256 × 64 is past OpenBLAS's threading threshold; a · 1 summed 64 times would be
   * 6.4e-38, a normal float, unless the denormal 1e-39 reads as 0. */
  enum { M = 256, N = 256, K = 64 };
  float *a = malloc(M * K * sizeof(float)), *b = malloc(K * N * sizeof(float));
  float *c = malloc(M * N * sizeof(float));
  for (int i = 0; i < M * K; i++) a[i] = 1e-39f;
  for (int i = 0; i < K * N; i++) b[i] = 1.0f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
  int nonzero = 0;
  for (int i = 0; i < M * N; i++) nonzero += c[i] != 0.0f;
  CHECK_MSG(nonzero == 0, "%d of %d sgemm outputs kept denormal inputs", nonzero, M * N);
#if REAL_IS_DOUBLE
  /* The float64 build multiplies with dgemm: the same for a denormal double, 1e-309 summed 64
   * times being 6.4e-308, a normal double. */
  double *da = malloc(M * K * sizeof(double)), *db = malloc(K * N * sizeof(double));
  double *dc = malloc(M * N * sizeof(double));
  for (int i = 0; i < M * K; i++) da[i] = 1e-309;
  for (int i = 0; i < K * N; i++) db[i] = 1.0;
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0, da, K, db, N, 0.0, dc, N);
  nonzero = 0;
  for (int i = 0; i < M * N; i++) nonzero += dc[i] != 0.0;
  CHECK_MSG(nonzero == 0, "%d of %d dgemm outputs kept denormal inputs", nonzero, M * N);
  free(da);
  free(db);
  free(dc);
#endif
  /* An OpenMP loop: x · 1 with x denormal (of the build's real type) is 0 under
   * denormals-are-zero. */
#if REAL_IS_DOUBLE
  const real denormal = 1e-310;
#else
  const real denormal = 1e-39f;
#endif
  real *x = malloc(M * N * sizeof(real));
  for (int i = 0; i < M * N; i++) x[i] = denormal;
  scale_inplace(x, M * N, 1.0f);
  nonzero = 0;
  for (int i = 0; i < M * N; i++) nonzero += x[i] != 0;
  free(x);
  CHECK_MSG(nonzero == 0, "%d of %d OpenMP outputs kept denormals", nonzero, M * N);
  free(a);
  free(b);
  free(c);
#endif
}

TEST_MAIN(TEST(init_sets_flush_to_zero_in_all_threads))
