/* The bf16-operand product's AVX2 path (gemm_bf16.h): for CPUs with AVX2 and FMA but no AVX-512
 * BF16. Built for AVX2 with -ffp-contract=off: every multiply and add as written.
 *
 * The bits are the scalar path's: op(A) is packed rounded to bf16 as M rows of K (as the scalar
 * path packs it), op(B) rounded to bf16 and widened back as K rows of N16 floats; each C element
 * then adds its K exact products in the scalar order (each pair's odd term first, k ^ 1), with
 * a vector multiply (exact: a product of two bf16 fits fp32; subnormal products flushed as the
 * scalar multiply flushes them) and a vector add (one rounding), eight columns a lane. Rows in
 * fours, columns in sixteens; a tail row or column is computed and not stored. */
#include "gemm_bf16.h"

#if defined(__x86_64__)
#if !defined(__AVX2__) || !defined(__FMA__)
#error "gemm_bf16_avx2.c is built with -mavx2 -mfma (CMakeLists.txt)"
#endif
#include <immintrin.h>

void gemm_bf16_avx2_rows(int i0, int i1, int N, int N16, int K, float alpha, const bf16 *a,
                         const float *bw, float beta, float *C, int ldc)
{
  const int even = K & ~1;
  for (int i = i0; i < i1; i += 4) {
    const bf16 *row[4];
    for (int r = 0; r < 4; r++) row[r] = a + (size_t)(i + r < i1 ? i + r : i1 - 1) * K;
    for (int j = 0; j < N; j += 16) {
      __m256 acc[4][2];
      for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
      for (int t = 0; t < even + (K & 1); t++) {
        const int k = t < even ? t ^ 1 : K - 1; /* an odd K's last term after its zero partner */
        const float *b = bw + (size_t)k * N16 + j;
        const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
        for (int r = 0; r < 4; r++) {
          const __m256 x = _mm256_set1_ps(bf16_to_float(row[r][k]));
          acc[r][0] = _mm256_add_ps(acc[r][0], _mm256_mul_ps(x, b0));
          acc[r][1] = _mm256_add_ps(acc[r][1], _mm256_mul_ps(x, b1));
        }
      }
      const int nj = N - j < 16 ? N - j : 16;
      for (int r = 0; r < 4 && i + r < i1; r++) {
        float s[16];
        _mm256_storeu_ps(s, acc[r][0]);
        _mm256_storeu_ps(s + 8, acc[r][1]);
        float *c = C + (size_t)(i + r) * ldc + j;
        for (int q = 0; q < nj; q++) {
          const float scaled = alpha * s[q];
          c[q] = beta == 0.0f ? scaled : scaled + beta * c[q];
        }
      }
    }
  }
}
#else
/* not x86-64: gemm_bf16 never takes this path */
void gemm_bf16_avx2_rows(int i0, int i1, int N, int N16, int K, float alpha, const bf16 *a,
                         const float *bw, float beta, float *C, int ldc)
{
  (void)i0, (void)i1, (void)N, (void)N16, (void)K, (void)alpha, (void)a, (void)bw, (void)beta, (void)C, (void)ldc;
}
#endif
