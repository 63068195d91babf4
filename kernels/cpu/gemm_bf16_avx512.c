/* The AVX-512 BF16 path of gemm_bf16 (gemm_bf16.h). Built for AVX-512 (F, BW, VL, BF16) alone;
 * gemm_bf16 calls it only where the CPU has those instructions.
 *
 * Both operands are packed as 32-bit pairs of bf16 along K (vdpbf16ps multiplies and adds one
 * pair per 32-bit lane): op(B) as K/2 rows of N pairs, so 16 columns are one vector; op(A)
 * so that the pair (i, p) is one 32-bit word, broadcast. A tile of C of up to 8 rows × 32
 * columns stays in 16 registers while the pairs go by; each element's sum is the pairs in order,
 * whatever the tile, so the blocking does not change the bits. The packing rounds to bf16
 * (vcvtne2ps2bf16: nearest even). op(B) transposed (q·kᵀ, dout·vᵀ: B's rows run along K) is
 * packed 16 rows at a time, the 16 × 16 words turned in registers. */
#include "gemm_bf16.h"

#if defined(__x86_64__)
#if !defined(__AVX512F__) || !defined(__AVX512BW__) || !defined(__AVX512VL__) || !defined(__AVX512BF16__)
#error "gemm_bf16_avx512.c is built with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 (CMakeLists.txt)"
#endif
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>

typedef uint32_t u32;

/* 32 floats, lo then hi, as 16 words of bf16 pairs: word q = (x[2q], x[2q + 1]). */
static inline __m512i pairs(__m512 lo, __m512 hi)
{
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

static inline __mmask16 first(int n)
{
  return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1);
}

/* Rows of X along K (op(A) not transposed): dst[i · K2 + p] = pair (X[i][2p], X[i][2p + 1]). */
static void pack_rows(u32 *dst, const float *X, int ldx, int rows, int K)
{
  const int K2 = (K + 1) / 2;
  for (int i = 0; i < rows; i++) {
    const float *x = X + (size_t)i * ldx;
    for (int k = 0; k < K; k += 32) {
      const __m512 lo = _mm512_maskz_loadu_ps(first(K - k), x + k);
      const __m512 hi = _mm512_maskz_loadu_ps(first(K - k - 16), x + k + 16);
      _mm512_mask_storeu_epi32(dst + (size_t)i * K2 + k / 2, first(K2 - k / 2), pairs(lo, hi));
    }
  }
}

/* X's rows run along K and its columns along the other dimension (n of them):
 * dst[p · ldd + j] = pair (X[2p][j], X[2p + 1][j]), columns n .. ldd − 1 zero (ldd a multiple of
 * 16). */
static void pack_interleave(u32 *dst, size_t ldd, const float *X, int ldx, int K, int n)
{
  const int K2 = (K + 1) / 2;
  /* words 0..15 of pairs() are row 2p's, 16..31 row 2p + 1's: interleave them */
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int p = 0; p < K2; p++) {
    const float *r0 = X + (size_t)(2 * p) * ldx, *r1 = 2 * p + 1 < K ? r0 + ldx : NULL;
    for (size_t j = 0; j < ldd; j += 16) {
      const __mmask16 m = first(n - (int)j);
      const __m512 lo = _mm512_maskz_loadu_ps(m, r0 + j);
      const __m512 hi = r1 ? _mm512_maskz_loadu_ps(m, r1 + j) : _mm512_setzero_ps();
      _mm512_storeu_si512(dst + (size_t)p * ldd + j, _mm512_permutexvar_epi16(idx, pairs(lo, hi)));
    }
  }
}

/* r[i] word c becomes r[c] word i. */
static inline void transpose16(__m512i r[16])
{
  __m512i t[16];
  for (int i = 0; i < 8; i++) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; i++) { /* lane L of r[4i + c]: rows 4i .. 4i + 3 of word 4L + c */
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int c = 0; c < 4; c++) {
    const __m512i x0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88), x1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xdd);
    const __m512i x2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88),
                  x3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xdd);
    t[c] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    t[4 + c] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    t[8 + c] = _mm512_shuffle_i32x4(x0, x2, 0xdd);
    t[12 + c] = _mm512_shuffle_i32x4(x1, x3, 0xdd);
  }
  for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* X's rows run along K, n of them (op(B) transposed): dst[p · ldd + j] = pair (X[j][2p],
 * X[j][2p + 1]), columns n .. ldd − 1 zero. */
static void pack_transpose(u32 *dst, size_t ldd, const float *X, int ldx, int n, int K)
{
  const int K2 = (K + 1) / 2;
  for (size_t j0 = 0; j0 < ldd; j0 += 16)
    for (int k = 0; k < K; k += 32) {
      __m512i r[16];
      for (int i = 0; i < 16; i++) {
        const int j = (int)j0 + i;
        if (j < n) {
          const float *x = X + (size_t)j * ldx + k;
          r[i] = pairs(_mm512_maskz_loadu_ps(first(K - k), x), _mm512_maskz_loadu_ps(first(K - k - 16), x + 16));
        } else {
          r[i] = _mm512_setzero_si512();
        }
      }
      transpose16(r);
      const int p0 = k / 2, np = K2 - p0 < 16 ? K2 - p0 : 16;
      for (int q = 0; q < np; q++) _mm512_storeu_si512(dst + (size_t)(p0 + q) * ldd + j0, r[q]);
    }
}

/* C rows [0, MR) × columns [0, 16 NV) (ncols of them real) from the packed pairs. */
static inline __attribute__((always_inline)) void tile(const int MR, const int NV, int K2, const u32 *ap,
                                                       size_t rs, size_t ks, const u32 *bp, size_t ldbp,
                                                       float alpha, float beta, float *C, size_t ldc,
                                                       int ncols)
{
  __m512 acc[8][2];
  for (int r = 0; r < MR; r++)
    for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
  for (int p = 0; p < K2; p++) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + (size_t)p * ldbp);
    const __m512bh b1 = NV > 1 ? (__m512bh)_mm512_loadu_si512(bp + (size_t)p * ldbp + 16) : b0;
    for (int r = 0; r < MR; r++) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[(size_t)r * rs + (size_t)p * ks]);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
      if (NV > 1)
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int r = 0; r < MR; r++)
    for (int v = 0; v < NV; v++) {
      const __mmask16 m = first(ncols - 16 * v);
      float *c = C + (size_t)r * ldc + 16 * v;
      __m512 s = _mm512_mul_ps(va, acc[r][v]);
      if (beta != 0.0f)
        s = _mm512_add_ps(s, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m, c)));
      _mm512_mask_storeu_ps(c, m, s);
    }
}

/* A product's packed operands and its C. */
struct tiles {
  int K2;
  const u32 *ap;
  size_t rs, ks;
  const u32 *bp;
  size_t N16;
  float alpha, beta;
  float *C;
  size_t ldc;
  int M, N;
};

/* Tile t of C: rows 8 (t mod row blocks) .., columns 32 (t div row blocks) .. */
static void one_tile(const struct tiles *w, int t)
{
  const int rblocks = (w->M + 7) / 8;
  const int r0 = (t % rblocks) * 8, j0 = (t / rblocks) * 32;
  const int mr = w->M - r0 < 8 ? w->M - r0 : 8, ncols = w->N - j0 < 32 ? w->N - j0 : 32;
  const int nv = w->N16 - (size_t)j0 >= 32 ? 2 : 1;
  const u32 *a = w->ap + (size_t)r0 * w->rs, *b = w->bp + j0;
  float *c = w->C + (size_t)r0 * w->ldc + j0;
#define TILE(mr_)                                                                                   \
  case mr_:                                                                                         \
    if (nv == 2)                                                                                    \
      tile(mr_, 2, w->K2, a, w->rs, w->ks, b, w->N16, w->alpha, w->beta, c, w->ldc, ncols);         \
    else                                                                                            \
      tile(mr_, 1, w->K2, a, w->rs, w->ks, b, w->N16, w->alpha, w->beta, c, w->ldc, ncols);         \
    break;
  switch (mr) {
    TILE(8) TILE(7) TILE(6) TILE(5) TILE(4) TILE(3) TILE(2) TILE(1)
  }
#undef TILE
}

void gemm_bf16_avx512(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc, bf16 *pack)
{
  if (M <= 0 || N <= 0)
    return;
  const int K2 = (K + 1) / 2;
  const size_t M16 = ((size_t)M + 15) / 16 * 16, N16 = ((size_t)N + 15) / 16 * 16;
  u32 *ap = (u32 *)pack, *bp = ap + (size_t)K2 * M16;
  size_t rs, ks;
  if (ta == CblasNoTrans) {
    pack_rows(ap, A, lda, M, K);
    rs = (size_t)K2, ks = 1;
  } else {
    pack_interleave(ap, M16, A, lda, K, M);
    rs = 1, ks = M16;
  }
  if (tb == CblasNoTrans)
    pack_interleave(bp, N16, B, ldb, K, N);
  else
    pack_transpose(bp, N16, B, ldb, N, K);

  /* tiles of 8 rows × 32 columns, column-block major (a block of op(B) stays in cache while the
   * rows go by); shared among the threads when called outside a parallel region (the attention's
   * tasks call it inside one: a plain loop then, without the cost of an inactive region) */
  const struct tiles w = { K2, ap, rs, ks, bp, N16, alpha, beta, C, (size_t)ldc, M, N };
  const int n_tiles = ((M + 7) / 8) * ((N + 31) / 32);
  if (n_tiles > 1 && !omp_in_parallel() && omp_get_max_threads() > 1) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n_tiles; t++) one_tile(&w, t);
  } else {
    for (int t = 0; t < n_tiles; t++) one_tile(&w, t);
  }
}
#else
/* not x86-64: gemm_bf16 never takes this path (gemm_bf16_path() is "scalar") */
void gemm_bf16_avx512(enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                      float alpha, const float *A, int lda, const float *B, int ldb, float beta,
                      float *C, int ldc, bf16 *pack)
{
  (void)pack;
  gemm_bf16_scalar(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
#endif
