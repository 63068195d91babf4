/* The AVX2 path of the vector layer (vec.h): 8 floats a step, the last (n mod 8) under a mask
 * (vmaskmov: masked lanes read as 0 and are not written; only there, as masked stores are slow
 * on some CPUs), both through the same arithmetic. Built with -mavx2 -mfma
 * -ffp-contract=off for this file only (CMakeLists.txt) and called only where vec.c found the
 * CPU has AVX2 and FMA. Its arithmetic is vec_avx512.c's operation for operation (see there
 * for exp), so the two give the same bits; sums keep 16 double lanes as that file does. */
#if defined(__x86_64__)
#if !defined(__AVX2__) || !defined(__FMA__)
#error "vec_avx2.c is built with -mavx2 -mfma (CMakeLists.txt)"
#endif
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "philox.h"
#include "vec.h"

/* Lanes j < left set (all 8 when left ≥ 8). */
static inline __m256i tail_mask(size_t left)
{
  const int k = left >= 8 ? 8 : (int)left;
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* The 8 floats at x + i, 0 in the lanes at or past n. */
static inline __m256 load8(const float *x, size_t i, size_t n)
{
  if (i + 8 <= n)
    return _mm256_loadu_ps(x + i);
  return i < n ? _mm256_maskload_ps(x + i, tail_mask(n - i)) : _mm256_setzero_ps();
}

static inline __m256 neg(__m256 x)
{
  return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(x), _mm256_set1_epi32(INT32_MIN)));
}

/* exp(x), 8 lanes: vec_avx512.c's vexp, the same operations. */
static inline __m256 vexp(__m256 x)
{
  x = _mm256_max_ps(_mm256_set1_ps(-104.0f), _mm256_min_ps(_mm256_set1_ps(89.0f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269502e+00f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r_hi = _mm256_fnmadd_ps(n, _mm256_set1_ps(6.93147182e-01f), x);
  const __m256 c = _mm256_mul_ps(n, _mm256_set1_ps(-1.90465421e-09f));
  const __m256 r = _mm256_sub_ps(r_hi, c);
  const __m256 r_err = _mm256_sub_ps(_mm256_sub_ps(r_hi, r), c);
  __m256 q = _mm256_set1_ps((float)(1.0 / 40320));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps((float)(1.0 / 5040)));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps((float)(1.0 / 720)));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps((float)(1.0 / 120)));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps((float)(1.0 / 24)));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps((float)(1.0 / 6)));
  q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(0.5f));
  const __m256 t = _mm256_add_ps(r, _mm256_fmadd_ps(q, _mm256_mul_ps(r, r), r_err));
  const __m256 p = _mm256_add_ps(_mm256_set1_ps(1.0f), t);
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

static void v_exp(float *out, const float *x, size_t n)
{
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, vexp(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i k = tail_mask(n - i);
    _mm256_maskstore_ps(out + i, k, vexp(_mm256_maskload_ps(x + i, k)));
  }
}

static inline __m256 swiglu(__m256 g, __m256 u)
{
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), vexp(neg(g)))), u);
}

static void v_swiglu_forward(float *out, const float *gate, const float *up, size_t n)
{
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, swiglu(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    const __m256i k = tail_mask(n - i);
    _mm256_maskstore_ps(out + i, k, swiglu(_mm256_maskload_ps(gate + i, k), _mm256_maskload_ps(up + i, k)));
  }
}

/* dgate (returned) and dup (*dup) from g, d, u. */
static inline __m256 swiglu_back(__m256 g, __m256 d, __m256 u, __m256 *dup)
{
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, vexp(neg(g))));
  *dup = _mm256_mul_ps(_mm256_mul_ps(d, g), s);
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(d, u), s),
                       _mm256_add_ps(one, _mm256_mul_ps(g, _mm256_sub_ps(one, s))));
}

static void v_swiglu_backward(float *dgate, float *dup, const float *dout, const float *gate,
                              const float *up, size_t n)
{
  size_t i = 0;
  __m256 du;
  for (; i + 8 <= n; i += 8) {
    const __m256 dg = swiglu_back(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(dout + i),
                                  _mm256_loadu_ps(up + i), &du);
    _mm256_storeu_ps(dup + i, du);
    _mm256_storeu_ps(dgate + i, dg);
  }
  if (i < n) {
    const __m256i k = tail_mask(n - i);
    const __m256 dg = swiglu_back(_mm256_maskload_ps(gate + i, k), _mm256_maskload_ps(dout + i, k),
                                  _mm256_maskload_ps(up + i, k), &du);
    _mm256_maskstore_ps(dup + i, k, du);
    _mm256_maskstore_ps(dgate + i, k, dg);
  }
}

/* One AdamW step on 8 lanes: the new param (returned), *m and *v updated in place. */
static inline __m256 adamw8(__m256 param, __m256 grad, __m256 *m, __m256 *v,
                            const struct vec_adamw *c)
{
  const __m256 g = _mm256_mul_ps(grad, _mm256_set1_ps(c->grad_scale));
  const __m256 p = _mm256_mul_ps(param, _mm256_set1_ps(c->decay));
  const __m256 mi = _mm256_add_ps(*m, _mm256_mul_ps(_mm256_set1_ps(c->m_weight), _mm256_sub_ps(g, *m)));
  const __m256 vi = _mm256_add_ps(_mm256_mul_ps(*v, _mm256_set1_ps(c->v_decay)),
                                  _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(c->v_weight), g), g));
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi),
                                                   _mm256_set1_ps(c->bias_correction2_sqrt)),
                                     _mm256_set1_ps(c->eps));
  *m = mi;
  *v = vi;
  return _mm256_sub_ps(p, _mm256_div_ps(_mm256_mul_ps(_mm256_set1_ps(c->step_size), mi), denom));
}

static void v_adamw(float *param, const float *grad, float *m, float *v, size_t n,
                    const struct vec_adamw *c)
{
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 mi = _mm256_loadu_ps(m + i), vi = _mm256_loadu_ps(v + i);
    const __m256 p = adamw8(_mm256_loadu_ps(param + i), _mm256_loadu_ps(grad + i), &mi, &vi, c);
    _mm256_storeu_ps(param + i, p);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
  }
  if (i < n) {
    const __m256i k = tail_mask(n - i);
    __m256 mi = _mm256_maskload_ps(m + i, k), vi = _mm256_maskload_ps(v + i, k);
    const __m256 p = adamw8(_mm256_maskload_ps(param + i, k), _mm256_maskload_ps(grad + i, k),
                            &mi, &vi, c);
    _mm256_maskstore_ps(param + i, k, p);
    _mm256_maskstore_ps(m + i, k, mi);
    _mm256_maskstore_ps(v + i, k, vi);
  }
}

/* 16 double lanes in four registers: a0 elements 0–3 of each 16, a1 4–7, a2 8–11, a3 12–15
 * (vec_avx512.c's order); added in lane order. */
struct lanes { __m256d a0, a1, a2, a3; };

static inline void lanes_add(struct lanes *l, __m256 lo8, __m256 hi8)
{
  l->a0 = _mm256_add_pd(l->a0, _mm256_cvtps_pd(_mm256_castps256_ps128(lo8)));
  l->a1 = _mm256_add_pd(l->a1, _mm256_cvtps_pd(_mm256_extractf128_ps(lo8, 1)));
  l->a2 = _mm256_add_pd(l->a2, _mm256_cvtps_pd(_mm256_castps256_ps128(hi8)));
  l->a3 = _mm256_add_pd(l->a3, _mm256_cvtps_pd(_mm256_extractf128_ps(hi8, 1)));
}

static inline __m256d square(__m128 x4)
{
  const __m256d d = _mm256_cvtps_pd(x4);
  return _mm256_mul_pd(d, d);
}

static double lanes_sum(const struct lanes *l)
{
  double v[16], s = 0.0;
  _mm256_storeu_pd(v, l->a0);
  _mm256_storeu_pd(v + 4, l->a1);
  _mm256_storeu_pd(v + 8, l->a2);
  _mm256_storeu_pd(v + 12, l->a3);
  for (int j = 0; j < 16; j++) s += v[j];
  return s;
}

static double v_sumsq(const float *x, size_t n)
{
  struct lanes l = { _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                     _mm256_setzero_pd() };
  for (size_t i = 0; i < n; i += 16) {
    const __m256 lo = load8(x, i, n), hi = load8(x, i + 8, n);
    l.a0 = _mm256_add_pd(l.a0, square(_mm256_castps256_ps128(lo)));
    l.a1 = _mm256_add_pd(l.a1, square(_mm256_extractf128_ps(lo, 1)));
    l.a2 = _mm256_add_pd(l.a2, square(_mm256_castps256_ps128(hi)));
    l.a3 = _mm256_add_pd(l.a3, square(_mm256_extractf128_ps(hi, 1)));
  }
  return lanes_sum(&l);
}

static void v_scale(float *x, size_t n, float s)
{
  const __m256 sv = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
  if (i < n) {
    const __m256i k = tail_mask(n - i);
    _mm256_maskstore_ps(x + i, k, _mm256_mul_ps(_mm256_maskload_ps(x + i, k), sv));
  }
}

static float v_max(const float *x, size_t n)
{
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 acc = ninf;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) /* max(x, acc): acc where x is NaN */
    acc = _mm256_max_ps(_mm256_loadu_ps(x + i), acc);
  if (i < n) {
    const __m256i k = tail_mask(n - i);
    const __m256 xv = _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + i, k), _mm256_castsi256_ps(k));
    acc = _mm256_max_ps(xv, acc);
  }
  float l[8], m = -INFINITY;
  _mm256_storeu_ps(l, acc);
  for (int j = 0; j < 8; j++) m = l[j] > m ? l[j] : m;
  return m;
}

/* exp(x − shift) for the 8 lanes at x + i (0 in the lanes past n), stored to out if any. */
static inline __m256 exp_shifted(float *out, const float *x, __m256 sh, size_t i, size_t n)
{
  if (i >= n)
    return _mm256_setzero_ps();
  if (i + 8 <= n) {
    const __m256 e = vexp(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
    if (out)
      _mm256_storeu_ps(out + i, e);
    return e;
  }
  const __m256i k = tail_mask(n - i);
  const __m256 e = _mm256_and_ps(vexp(_mm256_sub_ps(_mm256_maskload_ps(x + i, k), sh)),
                                 _mm256_castsi256_ps(k));
  if (out)
    _mm256_maskstore_ps(out + i, k, e);
  return e;
}

static double v_exp_sum(float *out, const float *x, float shift, size_t n)
{
  const __m256 sh = _mm256_set1_ps(shift);
  struct lanes l = { _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                     _mm256_setzero_pd() };
  for (size_t i = 0; i < n; i += 16) {
    const __m256 lo = exp_shifted(out, x, sh, i, n), hi = exp_shifted(out, x, sh, i + 8, n);
    lanes_add(&l, lo, hi);
  }
  return lanes_sum(&l);
}

static void v_exp_scale(float *out, const float *x, float shift, float s, size_t n)
{
  const __m256 sh = _mm256_set1_ps(shift), sv = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_mul_ps(vexp(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh)), sv));
  if (i < n) {
    const __m256i k = tail_mask(n - i);
    const __m256 e = vexp(_mm256_sub_ps(_mm256_maskload_ps(x + i, k), sh));
    _mm256_maskstore_ps(out + i, k, _mm256_mul_ps(e, sv));
  }
}

/* vec_avx512.c's v_ce_backward in 8 lanes: the 1 in one lane of the block holding target. */
static inline __m256 one_hot8(ptrdiff_t target, size_t i)
{
  const ptrdiff_t t = target - (ptrdiff_t)i;
  if (t < 0 || t >= 8)
    return _mm256_setzero_ps();
  const __m256i hit = _mm256_cmpeq_epi32(_mm256_set1_epi32((int)t),
                                         _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_and_ps(_mm256_castsi256_ps(hit), _mm256_set1_ps(1.0f));
}

static void v_ce_backward(float *out, const float *p, ptrdiff_t target, float s, size_t n)
{
  const __m256 sv = _mm256_set1_ps(s);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(p + i), one_hot8(target, i));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(d, sv));
  }
  if (i < n) {
    const __m256i k = tail_mask(n - i);
    const __m256 d = _mm256_sub_ps(_mm256_maskload_ps(p + i, k), one_hot8(target, i));
    _mm256_maskstore_ps(out + i, k, _mm256_mul_ps(d, sv));
  }
}

/* vec_avx512.c's philox_keep on 4 · sets blocks (counters ctr0 + l): one block per 64-bit lane,
 * its words in the lanes' low halves (_mm256_mul_epu32 reads only those); the 16 · sets words in
 * the elements' order become dropout values in out. */
static inline void philox_keep(float *out, int sets, uint32_t ctr0, const struct vec_dropout *d)
{
  const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
  const uint64_t q = (uint64_t)PHILOX_M1 * d->c2;
  const __m256i base = _mm256_set1_epi64x(ctr0);
  const __m256i ctr[2] = { _mm256_add_epi64(base, _mm256_setr_epi64x(0, 1, 2, 3)),
                           _mm256_add_epi64(base, _mm256_setr_epi64x(4, 5, 6, 7)) };
  __m256i c0[2], c1[2], c2[2], c3[2];
  for (int s = 0; s < sets; s++) {
    const __m256i p0 = _mm256_mul_epu32(ctr[s], m0);
    c0[s] = _mm256_set1_epi32((int)((uint32_t)(q >> 32) ^ d->c1 ^ d->k0[0]));
    c1[s] = _mm256_set1_epi32((int)(uint32_t)q);
    c2[s] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32),
                                              _mm256_set1_epi32((int)d->c3)),
                             _mm256_set1_epi32((int)d->k1[0]));
    c3[s] = p0;
  }
  for (int r = 1; r < 10; r++) {
    const __m256i k0 = _mm256_set1_epi32((int)d->k0[r]), k1 = _mm256_set1_epi32((int)d->k1[r]);
    for (int s = 0; s < sets; s++) {
      const __m256i p0 = _mm256_mul_epu32(c0[s], m0), p1 = _mm256_mul_epu32(c2[s], m1);
      c0[s] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[s]), k0);
      c2[s] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[s]), k1);
      c1[s] = p1;
      c3[s] = p0;
    }
  }
  const __m256 pv = _mm256_set1_ps(d->p), keep = _mm256_set1_ps(d->keep);
  const __m256 unit = _mm256_set1_ps(1.0f / 16777216.0f);
  for (int s = 0; s < sets; s++) {
    /* each lane's words 0, 1 and 2, 3 as one 64-bit pair, then the pairs in block order */
    const __m256i w01 = _mm256_blend_epi32(c0[s], _mm256_slli_epi64(c1[s], 32), 0xAA);
    const __m256i w23 = _mm256_blend_epi32(c2[s], _mm256_slli_epi64(c3[s], 32), 0xAA);
    const __m256i lo = _mm256_unpacklo_epi64(w01, w23), hi = _mm256_unpackhi_epi64(w01, w23);
    const __m256i w[2] = { _mm256_permute2x128_si256(lo, hi, 0x20),
                           _mm256_permute2x128_si256(lo, hi, 0x31) };
    for (int h = 0; h < 2; h++) {
      const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(w[h], 8)), unit);
      const __m256 drop = _mm256_cmp_ps(u, pv, _CMP_LT_OQ);
      _mm256_storeu_ps(out + 16 * s + 8 * h, _mm256_andnot_ps(drop, keep));
    }
  }
}

/* vec_avx512.c's v_dropout_keep in groups of 32 elements, the last one of 16 where that covers
 * what is left. */
static void v_dropout_keep(float *out, const struct vec_dropout *d, uint64_t e0, size_t n)
{
  uint64_t block = e0 >> 2;
  size_t skip = (size_t)(e0 & 3), done = 0;
  float buf[32];
  while (done < n) {
    const size_t size = skip + (n - done) <= 16 ? 16 : 32;
    const size_t take = n - done < size - skip ? n - done : size - skip;
    float *dst = take == size ? out + done : buf;
    if (size == 32)
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
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(m + i)));
  if (i < n) {
    const __m256i k = tail_mask(n - i);
    _mm256_maskstore_ps(x + i, k, _mm256_mul_ps(_mm256_maskload_ps(x + i, k),
                                                _mm256_maskload_ps(m + i, k)));
  }
}

static void v_rope(float *y, const float *x, const float *c, const float *s, float sign, size_t half)
{
  const __m256 sg = _mm256_set1_ps(sign);
  size_t i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + half + i), ci = _mm256_loadu_ps(c + i);
    const __m256 si = _mm256_mul_ps(sg, _mm256_loadu_ps(s + i));
    _mm256_storeu_ps(y + i, _mm256_sub_ps(_mm256_mul_ps(x1, ci), _mm256_mul_ps(x2, si)));
    _mm256_storeu_ps(y + half + i, _mm256_add_ps(_mm256_mul_ps(x2, ci), _mm256_mul_ps(x1, si)));
  }
  for (; i < half; i++) { /* the same operations one at a time (-ffp-contract=off) */
    const float x1 = x[i], x2 = x[i + half], si = sign * s[i];
    y[i] = x1 * c[i] - x2 * si;
    y[i + half] = x2 * c[i] + x1 * si;
  }
}

static void v_norm_wgrad(double *acc, const float *d, const float *x, double r, size_t n)
{
  const __m256d vr = _mm256_set1_pd(r);
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d p = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(d + i)), _mm256_cvtps_pd(_mm_loadu_ps(x + i)));
    _mm256_storeu_pd(acc + i, _mm256_add_pd(_mm256_loadu_pd(acc + i), _mm256_mul_pd(p, vr)));
  }
  for (; i < n; i++) acc[i] += (double)d[i] * x[i] * r;
}

static void v_norm_dx(float *dx, const float *w, const float *d, const float *x, float r, float k, size_t n)
{
  const __m256 vr = _mm256_set1_ps(r), vk = _mm256_set1_ps(k);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_mul_ps(_mm256_mul_ps(vr, _mm256_loadu_ps(w + i)), _mm256_loadu_ps(d + i));
    _mm256_storeu_ps(dx + i, _mm256_sub_ps(a, _mm256_mul_ps(vk, _mm256_loadu_ps(x + i))));
  }
  for (; i < n; i++) dx[i] = r * w[i] * d[i] - k * x[i];
}

const struct vec_ops vec_ops_avx2 = {
  .name = "avx2",
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
