/* The attention's bf16-operand products (kernels/cpu/gemm_bf16.h): the operands really rounded to
 * bf16 (nearest, ties to even); every transpose, beta, tail and odd K within the fp32 summation
 * bound of a double reference on the rounded operands; the same bits at any thread count, inside
 * or outside a parallel region; beta 0 never reads C. The scalar path (TYCHO_SIMD=scalar) and the
 * AVX2 path (no AVX-512 BF16) give the reference loop's bits; where the CPU has AVX-512 BF16 the vector
 * kernel's agreement with it is counted and printed. */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cpu/gemm_bf16.h"
#include "cpu/vec.h"
#include "kernels.h"

#if !REAL_IS_DOUBLE
static float *filled(size_t n, unsigned seed)
{
  float *p = malloc((n ? n : 1) * sizeof *p);
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = (float)((double)(seed >> 8) / (double)(1u << 24) - 0.5) * 3.0f;
  }
  return p;
}

static double at(const float *X, int ld, int trans, int r, int c)
{
  const float x = trans ? X[(size_t)c * ld + r] : X[(size_t)r * ld + c];
  return (double)bf16_to_float(bf16_from_float(x));
}

static long n_cases, n_bits_same, n_elems;

static void one_case(int M, int N, int K, int ta, int tb, int acc, unsigned seed)
{
  const int lda = ta ? M : K, ldb = tb ? K : N, ldc = N + 3; /* C's rows padded: ldc is honoured */
  const size_t nc = (size_t)M * ldc;
  float *A = filled((size_t)M * K, seed), *B = filled((size_t)K * N, seed + 7);
  float *C0 = filled(nc, seed + 13), *C = malloc(nc * sizeof *C), *one = malloc(nc * sizeof *one);
  float *S = malloc(nc * sizeof *S);
  bf16 *pack = malloc(gemm_bf16_pack_elems(M, N, K) * sizeof(bf16) + 64);
  const enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  const float alpha = 0.75f, beta = acc ? 1.0f : 0.0f;
  if (!acc) /* beta 0: C is not read */
    for (size_t i = 0; i < nc; i++) C0[i] = NAN;
  for (int th = 1; th <= 3; th++) {
    omp_set_num_threads(th);
    memcpy(C, C0, nc * sizeof *C);
    gemm_bf16(TA, TB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack);
    if (th == 1)
      memcpy(one, C, nc * sizeof *C);
    else
      CHECK_MSG(memcmp(C, one, nc * sizeof *C) == 0, "M %d N %d K %d ta %d tb %d beta %d: %d threads' bits "
                "differ from one's", M, N, K, ta, tb, acc, th);
  }
  /* inside a parallel region (the attention's tasks): one thread's product, the same bits */
  memcpy(C, C0, nc * sizeof *C);
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    gemm_bf16(TA, TB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack);
  }
  CHECK_MSG(memcmp(C, one, nc * sizeof *C) == 0, "M %d N %d K %d: inside a parallel region the bits differ", M, N, K);
  memcpy(S, C0, nc * sizeof *S);
  gemm_bf16_scalar(TA, TB, M, N, K, alpha, A, lda, B, ldb, beta, S, ldc);
  /* the scalar path gemm_bf16 takes without AVX-512 BF16 (packed, its sums in double): the
   * reference loop's bits, at 1 and 3 threads */
  const enum vec_isa isa0 = vec_current();
  vec_select(VEC_SCALAR);
  for (int th = 1; th <= 3; th += 2) {
    omp_set_num_threads(th);
    memcpy(C, C0, nc * sizeof *C);
    gemm_bf16(TA, TB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack);
    CHECK_MSG(memcmp(C, S, nc * sizeof *C) == 0, "M %d N %d K %d ta %d tb %d beta %d: the scalar path (%d "
              "threads) differs from the reference loop", M, N, K, ta, tb, acc, th);
  }
  vec_select(isa0);
  /* the AVX2 path (no AVX-512 BF16): the reference loop's bits too, at every thread count above */
  if (!strcmp(gemm_bf16_path(), "avx2"))
    CHECK_MSG(memcmp(one, S, nc * sizeof *S) == 0, "M %d N %d K %d ta %d tb %d beta %d: the avx2 path differs "
              "from the reference loop", M, N, K, ta, tb, acc);
  /* A sum of K exact products in fp32 is within (K − 1)·u·Σ|terms| of the exact sum (u = 2^-24,
   * first order); alpha·acc and the add of beta·C round once more each: (K + 2)·u of
   * |alpha|·Σ|a b| + |beta C|, with 1% for the second-order terms. */
  const double u = FLT_EPSILON / 2;
  for (int i = 0; i < M; i++)
    for (int j = 0; j < N; j++) {
      double exact = 0, mag = 0;
      for (int k = 0; k < K; k++) {
        const double t = at(A, lda, ta, i, k) * at(B, ldb, tb, k, j);
        exact += t, mag += fabs(t);
      }
      const double c0 = acc ? (double)C0[(size_t)i * ldc + j] : 0.0;
      const double want = alpha * exact + beta * c0;
      const double bound = 1.01 * (K + 2) * u * (fabs(alpha) * mag + fabs(beta * c0)) + 1e-30;
      const float got = one[(size_t)i * ldc + j], twin = S[(size_t)i * ldc + j];
      CHECK_MSG(fabs(got - want) <= bound, "M %d N %d K %d ta %d tb %d beta %d: C[%d][%d] %.9g, reference %.9g "
                "(bound %.3g)", M, N, K, ta, tb, acc, i, j, got, want, bound);
      CHECK_MSG(fabs(twin - want) <= bound, "scalar loop: M %d N %d K %d: C[%d][%d] %.9g, reference %.9g", M, N,
                K, i, j, twin, want);
      n_bits_same += memcmp(&got, &twin, sizeof got) == 0;
      n_elems++;
    }
  /* the padding columns of C are untouched */
  for (int i = 0; i < M; i++)
    for (int j = N; j < ldc; j++)
      CHECK_MSG(memcmp(&one[(size_t)i * ldc + j], &C0[(size_t)i * ldc + j], sizeof(float)) == 0,
                "M %d N %d K %d: C[%d][%d] beyond N was written", M, N, K, i, j);
  n_cases++;
  free(A), free(B), free(C0), free(C), free(one), free(S), free(pack);
}

/* The operands are rounded to bf16, ties to even: 1 + 2^-10 is 1; 1 + 2^-8 (halfway) is 1;
 * 1 + 3·2^-8 (halfway) is 1 + 2^-6. An fp32 product would keep them. */
static void operands_rounded(void)
{
  const float a[4] = { 1.0f + 0x1p-10f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.0f };
  const float one4[4] = { 1.0f, 1.0f, 1.0f, 1.0f };
  float c[4];
  bf16 pack[256];
  for (int i = 0; i < 4; i++) { /* c[i] = a[i] · 1 */
    gemm_bf16(CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a[i], 1, one4, 1, 0.0f, &c[i], 1, pack);
  }
  CHECK_MSG(c[0] == 1.0f && c[1] == 1.0f && c[2] == 1.0f + 0x1p-6f && c[3] == -2.0f,
            "bf16 rounding: %.9g %.9g %.9g %.9g", c[0], c[1], c[2], c[3]);
  /* a dot product of two: (1 + 2^-10)·1 + 1·(1 + 2^-9) is 2 in bf16 operands */
  const float x[2] = { 1.0f + 0x1p-10f, 1.0f }, y[2] = { 1.0f, 1.0f + 0x1p-9f };
  float d;
  gemm_bf16(CblasNoTrans, CblasTrans, 1, 1, 2, 1.0f, x, 2, y, 2, 0.0f, &d, 1, pack);
  CHECK_MSG(d == 2.0f, "dot of rounded operands %.9g, want 2", d);
}
#endif

static void products_within_the_bound(void)
{
#if REAL_IS_DOUBLE
  printf("the float64 build has no bf16 compute: gemm_bf16 is fp32 only\n");
  CHECK(1);
#else
  printf("gemm_bf16 path: %s\n", gemm_bf16_path());
  const int threads0 = omp_get_max_threads();
  const int Ms[] = { 1, 7, 8, 9, 33, 64 }, Ns[] = { 1, 15, 16, 17, 32, 33, 130 }, Ks[] = { 0, 1, 2, 31, 32, 33, 128 };
  unsigned seed = 1;
  for (size_t a = 0; a < sizeof Ms / sizeof *Ms; a++)
    for (size_t b = 0; b < sizeof Ns / sizeof *Ns; b++)
      for (size_t c = 0; c < sizeof Ks / sizeof *Ks; c++)
        for (int t = 0; t < 4; t++)
          one_case(Ms[a], Ns[b], Ks[c], t & 1, t >> 1, (int)(seed % 2), seed), seed++;
  one_case(64, 512, 128, 0, 1, 0, 99); /* the attention's widest block: 64 rows x 512 keys */
  one_case(512, 128, 64, 1, 0, 1, 98);
  omp_set_num_threads(threads0);
  printf("%ld products; the vector kernel and the scalar loop agree bit for bit on %ld of %ld elements\n",
         n_cases, n_bits_same, n_elems);
#endif
}

#if REAL_IS_DOUBLE
static void operands_rounded(void)
{
  CHECK(1);
}
#endif

TEST_MAIN(TEST(operands_rounded), TEST(products_within_the_bound))
