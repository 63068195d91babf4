/* bf16-operand products (gemm_bf16.h): the choice of path (the CPU's AVX-512 BF16, found once,
 * and the vector layer's path, asked at each call), the scalar path and the reference loop. Built
 * without ISA flags and with -ffp-contract=off (every multiply and add as written). */
#include "gemm_bf16.h"

#include <math.h>
#include <stdint.h>
#include <omp.h>

#include "vec.h"

/* The CPU's AVX-512 BF16, found once; the vector layer's path (TYCHO_SIMD, vec_select) at each
 * call. */
static int avx512_bf16(void)
{
  static int cpu = -1;
  if (cpu < 0) {
    int ok = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    ok = __builtin_cpu_supports("avx512bf16");
#endif
    cpu = ok;
  }
  return cpu && vec_current() == VEC_AVX512;
}

/* The AVX2 path: the CPU's AVX2 and FMA, found once, and the vector layer at avx2 or above. */
static int avx2(void)
{
  static int cpu = -1;
  if (cpu < 0) {
    int ok = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    cpu = ok;
  }
  return cpu && vec_current() >= VEC_AVX2;
}

const char *gemm_bf16_path(void)
{
  return avx512_bf16() ? "avx512_bf16" : avx2() ? "avx2" : "scalar";
}

size_t gemm_bf16_pack_elems(int M, int N, int K)
{
  /* AVX-512 BF16: op(A) as 32-bit pairs, M rows of K2 pairs or K2 rows of M16; op(B) K2 rows of
   * N16 pairs. AVX2: op(A) M rows of K bf16, then, from the next 64 bytes, op(B) widened as K
   * rows of N16 floats (two bf16 elements each). The larger of the two. */
  const size_t K2 = (size_t)(K + 1) / 2, M16 = ((size_t)M + 15) / 16 * 16, N16 = ((size_t)N + 15) / 16 * 16;
  return 2 * K2 * (M16 + 2 * N16) + 32;
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

/* The scalar path at speed: the operands rounded once into the pack buffer (op(A) as M rows of
 * K, op(B) as N rows of K, so the inner loop runs along both), and each exact product added with
 * one float addition, which is what fmaf does with an exact product (this file is built with
 * -ffp-contract=off, so the compiler fuses nothing). So the bits are gemm_bf16_scalar's, without
 * a software fmaf on CPUs the baseline build cannot assume have FMA. Rows [i0, i1) of C. */
static void scalar_rows(int i0, int i1, int N, int K, float alpha, const bf16 *a, const bf16 *b, float beta,
                        float *C, int ldc)
{
  for (int i = i0; i < i1; i++)
    for (int j = 0; j < N; j++) {
      const bf16 *x = a + (size_t)i * K, *y = b + (size_t)j * K;
      /* each pair odd element first: k ^ 1. (Written as two adds per pair, the loop came out of
       * Debian 12's GCC 12.2 at -O3 wrong: six products of 1 summed to 7. test_gemm_bf16 holds
       * this path to the reference loop bit for bit.) */
      float acc = 0.0f;
      const int even = K & ~1;
      for (int k = 0; k < even; k++) acc += bf16_to_float(x[k ^ 1]) * bf16_to_float(y[k ^ 1]);
      if (K % 2) /* the odd K's last term, after its zero partner */
        acc += bf16_to_float(x[K - 1]) * bf16_to_float(y[K - 1]);
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
  /* M·K + N·K elements: within gemm_bf16_pack_elems */
  bf16 *a = pack, *b = pack + (size_t)M * K;
  for (int i = 0; i < M; i++)
    for (int k = 0; k < K; k++)
      a[(size_t)i * K + k] = bf16_from_float(ta == CblasNoTrans ? A[(size_t)i * lda + k] : A[(size_t)k * lda + i]);
  if (avx2()) { /* op(B) rounded and widened, K rows of N16 floats from the next 64-byte boundary */
    const int N16 = (N + 15) / 16 * 16;
    const size_t at = ((size_t)(uintptr_t)(a + (size_t)M * K) + 63) / 64 * 64;
    float *bw = (float *)(uintptr_t)at;
    for (int k = 0; k < K; k++) {
      for (int j = 0; j < N; j++)
        bw[(size_t)k * N16 + j] = bf16_to_float(
          bf16_from_float(tb == CblasNoTrans ? B[(size_t)k * ldb + j] : B[(size_t)j * ldb + k]));
      for (int j = N; j < N16; j++) bw[(size_t)k * N16 + j] = 0.0f;
    }
    const int blocks = (M + 15) / 16;
    if (blocks > 1 && !omp_in_parallel() && omp_get_max_threads() > 1) {
#pragma omp parallel for
      for (int blk = 0; blk < blocks; blk++)
        gemm_bf16_avx2_rows(blk * 16, blk * 16 + 16 < M ? blk * 16 + 16 : M, N, N16, K, alpha, a, bw, beta, C, ldc);
    } else {
      gemm_bf16_avx2_rows(0, M, N, N16, K, alpha, a, bw, beta, C, ldc);
    }
    return;
  }
  for (int j = 0; j < N; j++)
    for (int k = 0; k < K; k++)
      b[(size_t)j * K + k] = bf16_from_float(tb == CblasNoTrans ? B[(size_t)k * ldb + j] : B[(size_t)j * ldb + k]);
  /* rows in blocks of 16 shared among the threads when called outside a parallel region */
  const int blocks = (M + 15) / 16;
  if (blocks > 1 && !omp_in_parallel() && omp_get_max_threads() > 1) {
#pragma omp parallel for
    for (int blk = 0; blk < blocks; blk++)
      scalar_rows(blk * 16, blk * 16 + 16 < M ? blk * 16 + 16 : M, N, K, alpha, a, b, beta, C, ldc);
  } else {
    scalar_rows(0, M, N, K, alpha, a, b, beta, C, ldc);
  }
}
