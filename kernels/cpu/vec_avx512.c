/* The AVX-512 path of the vector layer (vec.h): 16 floats a step, the tail under a mask.
 * Built with -mavx512f -mavx512dq -mavx512bw -mavx512vl -mfma -ffp-contract=off for this file
 * only (CMakeLists.txt) and called only where vec.c found the CPU has them. Its arithmetic is
 * vec_avx2.c's operation for operation (same constants, same order, FMA in the same places —
 * only inside exp), so the two give the same bits. */
#if defined(__x86_64__)
#if !defined(__AVX512F__) || !defined(__AVX512DQ__) || !defined(__AVX512BW__) || \
  !defined(__AVX512VL__) || !defined(__FMA__)
#error "vec_avx512.c is built with -mavx512f -mavx512dq -mavx512bw -mavx512vl -mfma (CMakeLists.txt)"
#endif
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "philox.h"
#include "vec.h"

static inline __mmask16 tail_mask(size_t left)
{
  return left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
}

static inline __m512 neg(__m512 x)
{
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
}

/* exp(x), 16 lanes. x = n·ln2 + r with n = rint(x·log2 e), |r| ≲ ln2/2: r_hi = x − n·ln2_hi is
 * exact (n·ln2_hi has ≤ 32 bits and lands within 0.35 of x); r = r_hi − n·ln2_lo rounds, and
 * r_err, what that rounding lost (exact where n·ln2_lo is smaller than r_hi, tiny where not),
 * goes back in with the small terms:
 *   exp(r) = 1 + (r + (r²·(1/2! + r/3! + … + r⁶/8!) + r_err))
 * (Taylor to degree 8: truncation ≤ 0.005 ulp on |r| ≤ 0.347); the last two roundings are the
 * large ones (≤ 0.5 + 0.25 ulp): within 1 ulp, worst 0.844 measured over a dense sweep
 * (test_kernels_vec). The result is p · 2^⌊n/2⌋ · 2^(n−⌊n/2⌋): the first product exact, the
 * second the only rounding of the scaling (to +inf past FLT_MAX, to a denormal or 0 below
 * FLT_MIN). x is first clamped to [−104, 89], outside which exp is 0 or +inf in float anyway; a
 * NaN passes through (min/max return their second operand for a NaN) and makes p NaN. */
static inline __m512 vexp(__m512 x)
{
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), _mm512_min_ps(_mm512_set1_ps(89.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269502e+00f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r_hi = _mm512_fnmadd_ps(n, _mm512_set1_ps(6.93147182e-01f), x);
  const __m512 c = _mm512_mul_ps(n, _mm512_set1_ps(-1.90465421e-09f));
  const __m512 r = _mm512_sub_ps(r_hi, c);
  const __m512 r_err = _mm512_sub_ps(_mm512_sub_ps(r_hi, r), c);
  __m512 q = _mm512_set1_ps((float)(1.0 / 40320));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps((float)(1.0 / 5040)));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps((float)(1.0 / 720)));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps((float)(1.0 / 120)));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps((float)(1.0 / 24)));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps((float)(1.0 / 6)));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0.5f));
  const __m512 t = _mm512_add_ps(r, _mm512_fmadd_ps(q, _mm512_mul_ps(r, r), r_err));
  const __m512 p = _mm512_add_ps(_mm512_set1_ps(1.0f), t);
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i n1 = _mm512_srai_epi32(ni, 1), n2 = _mm512_sub_epi32(ni, n1);
  const __m512i bias = _mm512_set1_epi32(127);
  const __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
  const __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
  return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

/* Each loop runs whole 16-lane blocks with plain loads and stores and the last n mod 16 under
 * a mask (masked stores are slow on some CPUs), both through the same arithmetic. */
#define LOAD(p, i, k, full) ((full) ? _mm512_loadu_ps((p) + (i)) : _mm512_maskz_loadu_ps((k), (p) + (i)))
#define STORE(p, i, k, full, x) \
  ((full) ? _mm512_storeu_ps((p) + (i), (x)) : _mm512_mask_storeu_ps((p) + (i), (k), (x)))

static void v_exp(float *out, const float *x, size_t n)
{
  for (size_t i = 0; i < n; i += 16) {
    const int full = i + 16 <= n;
    const __mmask16 k = tail_mask(n - i);
    STORE(out, i, k, full, vexp(LOAD(x, i, k, full)));
  }
}

static void v_swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
  const __m512 one = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += 16) {
    const int full = i + 16 <= n;
    const __mmask16 k = tail_mask(n - i);
    const __m512 g = LOAD(gate, i, k, full), u = LOAD(up, i, k, full);
    const __m512 o = _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, vexp(neg(g)))), u);
    STORE(out, i, k, full, o);
  }
}

static void v_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, size_t n)
{
  const __m512 one = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += 16) {
    const int full = i + 16 <= n;
    const __mmask16 k = tail_mask(n - i);
    const __m512 g = LOAD(gate, i, k, full), d = LOAD(dout, i, k, full);
    const __m512 u = LOAD(up, i, k, full);
    const __m512 s = _mm512_div_ps(one, _mm512_add_ps(one, vexp(neg(g))));
    const __m512 dg = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(d, u), s),
                                    _mm512_add_ps(one, _mm512_mul_ps(g, _mm512_sub_ps(one, s))));
    STORE(dup, i, k, full, _mm512_mul_ps(_mm512_mul_ps(d, g), s));
    STORE(dgate, i, k, full, dg);
  }
}

static void v_adamw(float *param, const float *grad, float *m, float *v, size_t n,
                    const struct vec_adamw *c)
{
  const __m512 grad_scale = _mm512_set1_ps(c->grad_scale), decay = _mm512_set1_ps(c->decay);
  const __m512 m_weight = _mm512_set1_ps(c->m_weight), v_decay = _mm512_set1_ps(c->v_decay);
  const __m512 v_weight = _mm512_set1_ps(c->v_weight), step_size = _mm512_set1_ps(c->step_size);
  const __m512 bc2 = _mm512_set1_ps(c->bias_correction2_sqrt), eps = _mm512_set1_ps(c->eps);
  for (size_t i = 0; i < n; i += 16) {
    const int full = i + 16 <= n;
    const __mmask16 k = tail_mask(n - i);
    const __m512 g = _mm512_mul_ps(LOAD(grad, i, k, full), grad_scale);
    const __m512 m0 = LOAD(m, i, k, full), v0 = LOAD(v, i, k, full);
    const __m512 p = _mm512_mul_ps(LOAD(param, i, k, full), decay);
    const __m512 mi = _mm512_add_ps(m0, _mm512_mul_ps(m_weight, _mm512_sub_ps(g, m0)));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(v0, v_decay),
                                    _mm512_mul_ps(_mm512_mul_ps(v_weight, g), g));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
    const __m512 pn = _mm512_sub_ps(p, _mm512_div_ps(_mm512_mul_ps(step_size, mi), denom));
    STORE(param, i, k, full, pn);
    STORE(m, i, k, full, mi);
    STORE(v, i, k, full, vi);
  }
}

/* Σ of 16 double lanes, element i of the input in lane i mod 16, added in lane order. */
static double lanes_sum(__m512d a, __m512d b)
{
  double l[16], s = 0.0;
  _mm512_storeu_pd(l, a);
  _mm512_storeu_pd(l + 8, b);
  for (int j = 0; j < 16; j++) s += l[j];
  return s;
}

static double v_sumsq(const float *x, size_t n)
{
  __m512d a = _mm512_setzero_pd(), b = _mm512_setzero_pd();
  for (size_t i = 0; i < n; i += 16) {
    const __m512 xv = LOAD(x, i, tail_mask(n - i), i + 16 <= n);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(xv));
    const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(xv, 1));
    a = _mm512_add_pd(a, _mm512_mul_pd(lo, lo));
    b = _mm512_add_pd(b, _mm512_mul_pd(hi, hi));
  }
  return lanes_sum(a, b);
}

static void v_scale(float *x, size_t n, float s)
{
  const __m512 sv = _mm512_set1_ps(s);
  for (size_t i = 0; i < n; i += 16) {
    const int full = i + 16 <= n;
    const __mmask16 k = tail_mask(n - i);
    STORE(x, i, k, full, _mm512_mul_ps(LOAD(x, i, k, full), sv));
  }
}

static float v_max(const float *x, size_t n)
{
  const __m512 ninf = _mm512_set1_ps(-INFINITY);
  __m512 acc = ninf;
  for (size_t i = 0; i < n; i += 16) { /* max(x, acc): acc where x is NaN */
    const __m512 xv = i + 16 <= n ? _mm512_loadu_ps(x + i)
                                  : _mm512_mask_loadu_ps(ninf, tail_mask(n - i), x + i);
    acc = _mm512_max_ps(xv, acc);
  }
  return _mm512_reduce_max_ps(acc);
}

static double v_exp_sum(float *out, const float *x, float shift, size_t n)
{
  const __m512 sh = _mm512_set1_ps(shift);
  __m512d a = _mm512_setzero_pd(), b = _mm512_setzero_pd();
  for (size_t i = 0; i < n; i += 16) {
    const int full = i + 16 <= n;
    const __mmask16 k = tail_mask(n - i);
    const __m512 e = _mm512_maskz_mov_ps(k, vexp(_mm512_sub_ps(LOAD(x, i, k, full), sh)));
    if (out)
      STORE(out, i, k, full, e);
    a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    b = _mm512_add_pd(b, _mm512_cvtps_pd(_mm512_extractf32x8_ps(e, 1)));
  }
  return lanes_sum(a, b);
}

static void v_exp_scale(float *out, const float *x, float shift, float s, size_t n)
{
  const __m512 sh = _mm512_set1_ps(shift), sv = _mm512_set1_ps(s);
  for (size_t i = 0; i < n; i += 16) {
    const int full = i + 16 <= n;
    const __mmask16 k = tail_mask(n - i);
    const __m512 e = vexp(_mm512_sub_ps(LOAD(x, i, k, full), sh));
    STORE(out, i, k, full, _mm512_mul_ps(e, sv));
  }
}

/* The 1 of the one-hot goes in one lane of the block holding target; every lane subtracts (0
 * elsewhere) and multiplies, as the scalar loop does. */
static void v_ce_backward(float *out, const float *p, ptrdiff_t target, float s, size_t n)
{
  const __m512 sv = _mm512_set1_ps(s), one = _mm512_set1_ps(1.0f);
  for (size_t i = 0; i < n; i += 16) {
    const int full = i + 16 <= n;
    const __mmask16 k = tail_mask(n - i);
    const ptrdiff_t t = target - (ptrdiff_t)i;
    const __m512 oh = t >= 0 && t < 16 ? _mm512_maskz_mov_ps((__mmask16)(1u << t), one)
                                       : _mm512_setzero_ps();
    STORE(out, i, k, full, _mm512_mul_ps(_mm512_sub_ps(LOAD(p, i, k, full), oh), sv));
  }
}

/* Philox4x32-10 (kernels/philox.h) on 8 · sets blocks (sets 1 or 2) with counters (ctr0 + l, c1,
 * c2, c3), the first word wrapping at 2^32: one block per 64-bit lane, its words in the lanes'
 * low halves. _mm512_mul_epu32 reads only the low halves and gives the whole 64-bit product, so
 * what the high halves collect is never read. Round 0's product of c2 is the same in every
 * lane, taken once. The 32 · sets words, block l's word w at 4 l + w (the elements' order),
 * become dropout values in out. Two sets keep two chains of multiplies in flight. */
static inline void philox_keep(float *out, int sets, uint32_t ctr0, const struct vec_dropout *d)
{
  const __m512i m0 = _mm512_set1_epi32((int)PHILOX_M0), m1 = _mm512_set1_epi32((int)PHILOX_M1);
  const uint64_t q = (uint64_t)PHILOX_M1 * d->c2;
  const __m512i base = _mm512_set1_epi64(ctr0);
  const __m512i ctr[2] = { _mm512_add_epi64(base, _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7)),
                           _mm512_add_epi64(base, _mm512_setr_epi64(8, 9, 10, 11, 12, 13, 14, 15)) };
  __m512i c0[2], c1[2], c2[2], c3[2];
  for (int s = 0; s < sets; s++) {
    const __m512i p0 = _mm512_mul_epu32(ctr[s], m0);
    c0[s] = _mm512_set1_epi32((int)((uint32_t)(q >> 32) ^ d->c1 ^ d->k0[0]));
    c1[s] = _mm512_set1_epi32((int)(uint32_t)q);
    c2[s] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), _mm512_set1_epi32((int)d->c3),
                                      _mm512_set1_epi32((int)d->k1[0]), 0x96);
    c3[s] = p0;
  }
  for (int r = 1; r < 10; r++) {
    const __m512i k0 = _mm512_set1_epi32((int)d->k0[r]), k1 = _mm512_set1_epi32((int)d->k1[r]);
    for (int s = 0; s < sets; s++) {
      const __m512i p0 = _mm512_mul_epu32(c0[s], m0), p1 = _mm512_mul_epu32(c2[s], m1);
      c0[s] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), c1[s], k0, 0x96);
      c2[s] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), c3[s], k1, 0x96);
      c1[s] = p1;
      c3[s] = p0;
    }
  }
  const __m512i lo = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11);
  const __m512i hi = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
  const __m512 pv = _mm512_set1_ps(d->p), keep = _mm512_set1_ps(d->keep);
  const __m512 unit = _mm512_set1_ps(1.0f / 16777216.0f), zero = _mm512_setzero_ps();
  for (int s = 0; s < sets; s++) {
    /* each lane's words 0, 1 and 2, 3 as one 64-bit pair, then the pairs in block order */
    const __m512i w01 = _mm512_mask_blend_epi32(0xAAAA, c0[s], _mm512_slli_epi64(c1[s], 32));
    const __m512i w23 = _mm512_mask_blend_epi32(0xAAAA, c2[s], _mm512_slli_epi64(c3[s], 32));
    const __m512i w[2] = { _mm512_permutex2var_epi64(w01, lo, w23),
                           _mm512_permutex2var_epi64(w01, hi, w23) };
    for (int h = 0; h < 2; h++) {
      const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(w[h], 8)), unit);
      const __mmask16 drop = _mm512_cmp_ps_mask(u, pv, _CMP_LT_OQ);
      _mm512_storeu_ps(out + 32 * s + 16 * h, _mm512_mask_blend_ps(drop, keep, zero));
    }
  }
}

/* Groups of 64 elements (16 blocks), the last one of 32 where 8 blocks cover what is left.
 * A group that starts before e0 (e0 not a multiple of 4) or ends past n goes through a buffer;
 * the others straight to out. */
static void v_dropout_keep(float *out, const struct vec_dropout *d, uint64_t e0, size_t n)
{
  uint64_t block = e0 >> 2;
  size_t skip = (size_t)(e0 & 3), done = 0;
  float buf[64];
  while (done < n) {
    const size_t size = skip + (n - done) <= 32 ? 32 : 64;
    const size_t take = n - done < size - skip ? n - done : size - skip;
    float *dst = take == size ? out + done : buf;
    if (size == 64)
      philox_keep(dst, 2, (uint32_t)block, d);
    else
      philox_keep(dst, 1, (uint32_t)block, d);
    if (dst == buf)
      memcpy(out + done, buf + skip, take * sizeof(float));
    done += take;
    skip = 0;
    block += size / 4;
  }
}

static void v_mul(float *x, const float *m, size_t n)
{
  for (size_t i = 0; i < n; i += 16) {
    const int full = i + 16 <= n;
    const __mmask16 k = tail_mask(n - i);
    STORE(x, i, k, full, _mm512_mul_ps(LOAD(x, i, k, full), LOAD(m, i, k, full)));
  }
}

static void v_rope(float *y, const float *x, const float *c, const float *s, float sign, size_t half)
{
  const __m512 sg = _mm512_set1_ps(sign);
  for (size_t i = 0; i < half; i += 16) {
    const int full = i + 16 <= half;
    const __mmask16 k = tail_mask(half - i);
    const __m512 x1 = LOAD(x, i, k, full), x2 = LOAD(x + half, i, k, full), ci = LOAD(c, i, k, full);
    const __m512 si = _mm512_mul_ps(sg, LOAD(s, i, k, full));
    STORE(y, i, k, full, _mm512_sub_ps(_mm512_mul_ps(x1, ci), _mm512_mul_ps(x2, si)));
    STORE(y + half, i, k, full, _mm512_add_ps(_mm512_mul_ps(x2, ci), _mm512_mul_ps(x1, si)));
  }
}

static void v_norm_wgrad(double *acc, const float *d, const float *x, double r, size_t n)
{
  const __m512d vr = _mm512_set1_pd(r);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d p = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(d + i)), _mm512_cvtps_pd(_mm256_loadu_ps(x + i)));
    _mm512_storeu_pd(acc + i, _mm512_add_pd(_mm512_loadu_pd(acc + i), _mm512_mul_pd(p, vr)));
  }
  for (; i < n; i++) acc[i] += (double)d[i] * x[i] * r;
}

static void v_norm_dx(float *dx, const float *w, const float *d, const float *x, float r, float k, size_t n)
{
  const __m512 vr = _mm512_set1_ps(r), vk = _mm512_set1_ps(k);
  for (size_t i = 0; i < n; i += 16) {
    const int full = i + 16 <= n;
    const __mmask16 m = tail_mask(n - i);
    const __m512 a = _mm512_mul_ps(_mm512_mul_ps(vr, LOAD(w, i, m, full)), LOAD(d, i, m, full));
    STORE(dx, i, m, full, _mm512_sub_ps(a, _mm512_mul_ps(vk, LOAD(x, i, m, full))));
  }
}

const struct vec_ops vec_ops_avx512 = {
  .name = "avx512",
  .exp = v_exp,
  .swiglu_forward = v_swiglu_forward,
  .swiglu_backward = v_swiglu_backward,
  .adamw = v_adamw,
  .sumsq = v_sumsq,
  .scale = v_scale,
  .max = v_max,
  .exp_sum = v_exp_sum,
  .exp_scale = v_exp_scale,
  .ce_backward = v_ce_backward,
  .dropout_keep = v_dropout_keep,
  .mul = v_mul,
  .rope = v_rope,
  .norm_wgrad = v_norm_wgrad,
  .norm_dx = v_norm_dx,
};
#endif
