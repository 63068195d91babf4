/* bf16-operand products (gemm_bf16.h): the path chosen once, and the scalar loop. Built without
 * ISA flags and with -ffp-contract=off (every multiply and add as written). */
#include "gemm_bf16.h"

#include <math.h>
#include <omp.h>

#include "vec.h"

static int avx512_bf16(void)
{
  static int have = -1;
  if (have < 0) {
    int ok = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    ok = vec_current() == VEC_AVX512 && __builtin_cpu_supports("avx512bf16");
#endif
    have = ok;
  }
  return have;
}

const char *gemm_bf16_path(void)
{
  return avx512_bf16() ? "avx512_bf16" : "scalar";
}

size_t gemm_bf16_pack_elems(int M, int N, int K)
{
  /* op(A) as 32-bit pairs: M rows of K2 pairs, or K2 rows of M16; op(B): K2 rows of N16 pairs */
  const size_t K2 = (size_t)(K + 1) / 2, M16 = ((size_t)M + 15) / 16 * 16, N16 = ((size_t)N + 15) / 16 * 16;
  return 2 * K2 * (M16 + N16);
}

static float rounded(float x)
{
  return bf16_to_float(bf16_from_float(x));
}

void gemm_bf16_scalar(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc)
{
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      float acc = 0.0f;
      for (int k = 0; k < K; k += 2) {
        const float a0 = rounded(ta == CblasNoTrans ? A[(size_t)i * lda + k] : A[(size_t)k * lda + i]);
        const float b0 = rounded(tb == CblasNoTrans ? B[(size_t)k * ldb + j] : B[(size_t)j * ldb + k]);
        float a1 = 0.0f, b1 = 0.0f;
        if (k + 1 < K) {
          a1 = rounded(ta == CblasNoTrans ? A[(size_t)i * lda + k + 1] : A[(size_t)(k + 1) * lda + i]);
          b1 = rounded(tb == CblasNoTrans ? B[(size_t)(k + 1) * ldb + j] : B[(size_t)j * ldb + k + 1]);
        }
        acc = fmaf(a1, b1, acc); /* exact products: one rounding per addition */
        acc = fmaf(a0, b0, acc);
      }
      float *c = &C[(size_t)i * ldc + j];
      const float scaled = alpha * acc;
      *c = beta == 0.0f ? scaled : scaled + beta * *c;
    }
}

void gemm_bf16(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha,
               const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc,
               bf16 *pack)
{
  if (M <= 0 || N <= 0)
    return;
  if (avx512_bf16()) {
    gemm_bf16_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack);
    return;
  }
  /* rows in blocks of 16 shared among the threads when called outside a parallel region */
  const int blocks = (M + 15) / 16;
  if (blocks > 1 && !omp_in_parallel() && omp_get_max_threads() > 1) {
#pragma omp parallel for
    for (int blk = 0; blk < blocks; blk++) {
      const int i = blk * 16, m = M - i < 16 ? M - i : 16;
      const float *a = ta == CblasNoTrans ? A + (size_t)i * lda : A + i;
      gemm_bf16_scalar(ta, tb, m, N, K, alpha, a, lda, B, ldb, beta, C + (size_t)i * ldc, ldc);
    }
  } else {
    gemm_bf16_scalar(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}
