/* The vector layer (kernels/cpu/vec.h): every path this CPU has (avx2, avx512) against the
 * scalar path, the reference, on sizes that leave every kind of tail (0, 1, 15, 16, 17, 1000,
 * 4099, and 20000 over more than one block of the threads' split), at unaligned addresses.
 *   - exp: a sweep over the float range against exp in double: within 1 ulp (EXP_ULPS), exact
 *     at 0, inf above ln FLT_MAX, 0 at −inf and below the smallest denormal, NaN for NaN,
 *     denormals (or 0 under flush-to-zero) between.
 *   - adamw_update and scale_inplace: the scalar path's bits; adamw with a gradient scale gives
 *     the bits of scale_inplace followed by adamw with scale 1 (clipping folded into the sweep).
 *   - swiglu and cross-entropy: bounds from the exp's error (below, per kernel).
 *   - sumsq: the same parts as the scalar sum, added in another order (double): relative bound.
 *   - avx2 and avx512 give the same bits as each other everywhere, and an element's result does
 *     not depend on where in the tensor it is.
 * The float64 build takes the scalar path whatever is selected (checked), and the vector
 * paths' fp32 functions are tested directly in both builds. */
#define _POSIX_C_SOURCE 200809L
#include <float.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels.h"
#include "cpu/vec.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

/* The measured exp error is printed; the bound is what vec.h states. */
#define EXP_ULPS 1.0

static const size_t sizes[] = { 0, 1, 15, 16, 17, 1000, 4099, 20000 };
enum { N_SIZES = sizeof sizes / sizeof sizes[0], MAX_N = 20000, OFFSET = 3 };

static uint32_t rng = 12345;
static double uniform(void) /* xorshift32 in [0, 1) */
{
  rng ^= rng << 13;
  rng ^= rng >> 17;
  rng ^= rng << 5;
  return (double)(rng >> 8) / 16777216.0;
}

/* A buffer of n + OFFSET reals; the kernels get it from element OFFSET (unaligned). */
static real *buf(size_t n, double lo, double hi)
{
  real *x = malloc((n + OFFSET + 1) * sizeof(real));
  for (size_t i = 0; i < n + OFFSET + 1; i++) x[i] = (real)(lo + (hi - lo) * uniform());
  return x;
}

static real *copy(const real *x, size_t n)
{
  real *y = malloc((n + OFFSET + 1) * sizeof(real));
  memcpy(y, x, (n + OFFSET + 1) * sizeof(real));
  return y;
}

static int n_paths;
static enum vec_isa paths[VEC_N_ISAS]; /* the vector paths this CPU has */

static void find_paths(void)
{
  n_paths = 0;
  for (int i = VEC_AVX2; i < VEC_N_ISAS; i++)
    if (vec_supported((enum vec_isa)i))
      paths[n_paths++] = (enum vec_isa)i;
}

/* Distance in representable floats between a and b (same sign assumed near equality). */
static double ulp_steps(float a, float b)
{
  if (a == b)
    return 0;
  int32_t ia, ib;
  memcpy(&ia, &a, 4);
  memcpy(&ib, &b, 4);
  if (ia < 0) ia = INT32_MIN - ia;
  if (ib < 0) ib = INT32_MIN - ib;
  return fabs((double)ia - (double)ib);
}

/* The ulp of a normal float of size |r|: 2^(⌊log2 |r|⌋ − 23). */
static double ulp_of(double r)
{
  int e;
  frexp(fabs(r), &e);
  return ldexp(1.0, e - 24);
}

static void the_environment_chooses_the_path(void)
{
  /* The first call makes the choice: TYCHO_SIMD=scalar, set before anything called a kernel. */
  setenv("TYCHO_SIMD", "scalar", 1);
  CHECK(vec_current() == VEC_SCALAR && vec_active() == NULL);
  unsetenv("TYCHO_SIMD");
  find_paths();
  printf("paths: scalar");
  for (int i = 0; i < n_paths; i++) printf(" %s", vec_isa_name(paths[i]));
  printf("\n");
  CHECK(vec_supported(VEC_SCALAR) && vec_select(VEC_SCALAR) == 0);
  CHECK(vec_select(VEC_N_ISAS) == -1 && vec_current() == VEC_SCALAR);
  for (int i = VEC_AVX2; i < VEC_N_ISAS; i++) {
    const int ok = vec_supported((enum vec_isa)i);
    CHECK(vec_select((enum vec_isa)i) == (ok ? 0 : -1));
    CHECK(vec_current() == (ok ? (enum vec_isa)i : VEC_SCALAR));
    CHECK(ok ? vec_active() == vec_ops_of((enum vec_isa)i) && vec_active() != NULL
             : vec_ops_of((enum vec_isa)i) == NULL);
    vec_select(VEC_SCALAR);
  }
  CHECK(strcmp(vec_isa_name(VEC_AVX512), "avx512") == 0);
#if defined(__x86_64__)
  /* Every x86-64 this was built for has AVX2 in practice; one that does not still passes. */
  if (vec_supported(VEC_AVX512))
    CHECK(vec_supported(VEC_AVX2));
#endif
}

/* ---- exp ---------------------------------------------------------------------------------- */

static double exp_err_max[VEC_N_ISAS], exp_libm_steps_max[VEC_N_ISAS];

/* Checks the path's exp on xs[0..n): against exp in double where the result is a normal float,
 * against the denormal (or 0) the float range gives below that. */
static void check_exp_block(const struct vec_ops *v, enum vec_isa isa, const float *xs, float *ys,
                            size_t n, int ftz)
{
  v->exp(ys, xs, n);
  for (size_t i = 0; i < n; i++) {
    const float x = xs[i], y = ys[i];
    const double r = exp((double)x);
    if (isnan(x)) {
      CHECK_MSG(isnan(y), "%s exp(nan) = %g", v->name, y);
      continue;
    }
    if (r > FLT_MAX) { /* overflow: +inf (or FLT_MAX within half an ulp of it, 1 ulp off) */
      if (!(y == INFINITY || (y == FLT_MAX && r < FLT_MAX * (1 + 0x1p-24))))
        CHECK_MSG(y == INFINITY, "%s exp(%.9g) = %g, want inf", v->name, x, y);
      continue;
    }
    if (r < FLT_MIN) {
      /* below the normal range: a denormal within one step 2^-149 (the scaling's rounding),
       * or 0 under flush-to-zero, which also takes a result that rounds up to FLT_MIN */
      if (ftz)
        CHECK_MSG(y == 0.0f || (y == FLT_MIN && r > FLT_MIN * (1 - 0x1p-23)),
                  "%s exp(%.9g) = %g under FTZ", v->name, x, y);
      else
        CHECK_MSG(fabs((double)y - r) <= 0x1p-149, "%s exp(%.9g) = %.9g, want %.9g", v->name,
                  x, y, r);
      continue;
    }
    const double err = fabs((double)y - r) / ulp_of(r);
    if (err > exp_err_max[isa]) exp_err_max[isa] = err;
    if (!(err <= EXP_ULPS)) /* counted once per failing value, not once per element */
      CHECK_MSG(err <= EXP_ULPS, "%s exp(%.9g) = %.9g, want %.17g: %.3f ulp", v->name, x, y, r, err);
    const double steps = ulp_steps(y, expf(x));
    if (steps > exp_libm_steps_max[isa]) exp_libm_steps_max[isa] = steps;
  }
}

static void exp_is_within_one_ulp_over_the_float_range(void)
{
  enum { BLOCK = 4096 };
  float *xs = malloc(BLOCK * sizeof(float)), *ys = malloc(BLOCK * sizeof(float));
  int ran = 0;
  for (int pi = 0; pi < n_paths; pi++) {
    const struct vec_ops *v = vec_ops_of(paths[pi]);
    size_t k = 0;
    /* 1. every 61st float bit pattern: every sign, magnitude and binade, inf and NaN too */
    for (uint64_t u = 0; u < (1ull << 32); u += 61) {
      uint32_t b = (uint32_t)u;
      memcpy(&xs[k], &b, 4);
      if (++k == BLOCK) check_exp_block(v, paths[pi], xs, ys, k, 0), k = 0;
    }
    /* 2. 2^24 evenly spaced points of [−104, 89] (where exp is neither 0 nor inf nor ≈ 1) */
    for (uint32_t i = 0; i < (1u << 24); i++) {
      xs[k] = (float)(-104.0 + 193.0 * i / (1u << 24));
      if (++k == BLOCK) check_exp_block(v, paths[pi], xs, ys, k, 0), k = 0;
    }
    check_exp_block(v, paths[pi], xs, ys, k, 0);
    /* 3. under flush-to-zero (as the process runs), the bottom of the range */
#if defined(__x86_64__)
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);
    k = 0;
    for (uint32_t i = 0; i < BLOCK; i++) xs[k++] = (float)(-104.0 + 20.0 * i / BLOCK);
    check_exp_block(v, paths[pi], xs, ys, k, 1);
    _mm_setcsr(csr);
#endif
    /* 4. the special values, exactly */
    const float special[] = { 0.0f, -0.0f, INFINITY, -INFINITY, NAN, 88.7228317f, 88.7228394f,
                              89.0f, 1000.0f, -103.0f, -104.0f, -1000.0f, FLT_MIN, -FLT_MIN,
                              1e-30f, -1e-30f, 1.0f };
    const int n_special = (int)(sizeof special / sizeof special[0]);
    v->exp(ys, special, (size_t)n_special);
    CHECK(ys[0] == 1.0f && ys[1] == 1.0f);
    CHECK(ys[2] == INFINITY && ys[3] == 0.0f && !signbit(ys[3]) && isnan(ys[4]));
    CHECK(isfinite(ys[5]) && ys[5] > 3.4e38f); /* just below ln FLT_MAX */
    CHECK(ys[6] == INFINITY && ys[7] == INFINITY && ys[8] == INFINITY);
    CHECK(ys[9] > 0.0f && ys[10] == 0.0f && ys[11] == 0.0f); /* exp(−103) is a denormal */
    CHECK(ys[12] == 1.0f && ys[13] == 1.0f && ys[14] == 1.0f && ys[15] == 1.0f);
    CHECK(ulp_steps(ys[16], 2.71828183f) <= 1);
    /* in place */
    memcpy(xs, special, sizeof special);
    v->exp(xs, xs, (size_t)n_special);
    CHECK(memcmp(xs, ys, sizeof special) == 0 || isnan(xs[4]));
    printf("%s exp: max error %.3f ulp (bound %.1f); at most %.0f float steps from libm's expf\n",
           v->name, exp_err_max[paths[pi]], EXP_ULPS, exp_libm_steps_max[paths[pi]]);
    ran++;
  }
  /* The paths agree bit for bit (the same operations). */
  if (n_paths == 2) {
    const struct vec_ops *a = vec_ops_of(paths[0]), *b = vec_ops_of(paths[1]);
    size_t differ = 0;
    for (uint64_t u = 0; u < (1ull << 32); u += 61 * BLOCK) {
      for (uint32_t j = 0; j < BLOCK; j++) {
        uint32_t bits = (uint32_t)(u + 61ull * j);
        memcpy(&xs[j], &bits, 4);
      }
      a->exp(ys, xs, BLOCK);
      float *zs = malloc(BLOCK * sizeof(float));
      b->exp(zs, xs, BLOCK);
      for (uint32_t j = 0; j < BLOCK; j++)
        differ += memcmp(&ys[j], &zs[j], 4) != 0 && !(isnan(ys[j]) && isnan(zs[j]));
      free(zs);
    }
    CHECK_MSG(differ == 0, "avx2 and avx512 exp differ in %zu values", differ);
  }
  if (!ran)
    CHECK(n_paths == 0); /* a CPU without a vector path: nothing to measure */
  free(xs);
  free(ys);
}

/* ---- the kernels against the scalar path -------------------------------------------------- */

/* The body once with each path selected, the scalar one first, as isa_var. */
#define FOR_EACH_PATH(isa_var) \
  for (int pi_ = -1; pi_ < n_paths; pi_++) \
    for (enum vec_isa isa_var = pi_ < 0 ? VEC_SCALAR : paths[pi_]; \
         isa_var != VEC_N_ISAS && vec_select(isa_var) == 0; isa_var = VEC_N_ISAS)

static double worst_swiglu_fwd, worst_swiglu_dg, worst_swiglu_dup, worst_prob, worst_loss;
static double worst_sumsq;

/* out vs reference: |out − ref| ≤ tol; "what" names the check. */
static int near(double out, double ref, double tol, double *worst, double unit)
{
  const double err = fabs(out - ref);
  if (unit > 0 && err / unit > *worst) *worst = err / unit;
  return err <= tol;
}

/* Results differ from the scalar path only through the exp (REAL_U relative each way for a
 * rounding): the scalar path's expf is within 0.5 ulp, the vector one within 1 (EXP_ULPS), so
 * e = exp(−g) differs by ≤ 1.5 ulp ≤ 3 REAL_U relative, and 1 + e by as much at most. After
 * that both run the same operations, each adding ≤ 1 rounding on each side:
 *   out = g / (1 + e) · up: 3 REAL_U + 2 · 2 roundings → bound 8 REAL_U relative;
 *   s = 1 / (1 + e): 3 + 2 REAL_U relative (≤ 5 REAL_U of s ≤ 1 absolute, and 1 − s then
 *     ≤ 5 REAL_U + 1 rounding absolute); dup = dout · g · s: 5 + 4 → bound 10 REAL_U relative;
 *   dgate = dout·up·s·(1 + g(1 − s)): the factor (1 + g(1 − s)) is off by ≤ 7 REAL_U·|g| + 3
 *     roundings absolute, the rest relative 5 + 6: bound 16 REAL_U · |dout · up| · (1 + |g|). */
static void swiglu_paths_match_the_scalar_path(void)
{
  for (int si = 0; si < N_SIZES; si++) {
    const size_t n = sizes[si];
    real *g0 = buf(n, -20, 20), *u0 = buf(n, -3, 3), *d0 = buf(n, -2, 2);
    real *g = g0 + OFFSET, *u = u0 + OFFSET, *d = d0 + OFFSET;
    real *out_ref = malloc((n + 1) * sizeof(real)), *dg_ref = malloc((n + 1) * sizeof(real));
    real *dup_ref = malloc((n + 1) * sizeof(real));
    real *out_first = malloc((n + 1) * sizeof(real)), *dg_first = malloc((n + 1) * sizeof(real));
    real *out = malloc((n + 1) * sizeof(real)), *dg = malloc((n + 1) * sizeof(real));
    real *dup = malloc((n + 1) * sizeof(real));
    int first = 1;
    FOR_EACH_PATH(isa) {
      swiglu_forward(out, g, u, n);
      swiglu_backward(dg, dup, d, g, u, n);
      if (isa == VEC_SCALAR) {
        memcpy(out_ref, out, n * sizeof(real));
        memcpy(dg_ref, dg, n * sizeof(real));
        memcpy(dup_ref, dup, n * sizeof(real));
        CHECK(n == 0 || isfinite(out[0]));
        continue;
      }
      for (size_t i = 0; i < n; i++) {
        const double fo = fabs((double)out_ref[i]), du = fabs((double)d[i] * u[i]);
        CHECK_MSG(near(out[i], out_ref[i], 8 * REAL_U * fo, &worst_swiglu_fwd, REAL_U * fo),
                  "%s swiglu_forward n %zu [%zu] g %.9g: %.9g vs %.9g", vec_isa_name(isa), n, i,
                  (double)g[i], (double)out[i], (double)out_ref[i]);
        CHECK_MSG(near(dup[i], dup_ref[i], 10 * REAL_U * fabs((double)dup_ref[i]),
                       &worst_swiglu_dup, REAL_U * fabs((double)dup_ref[i])),
                  "%s swiglu_backward dup n %zu [%zu]", vec_isa_name(isa), n, i);
        const double scale = du * (1 + fabs((double)g[i]));
        CHECK_MSG(near(dg[i], dg_ref[i], 16 * REAL_U * scale, &worst_swiglu_dg, REAL_U * scale),
                  "%s swiglu_backward dgate n %zu [%zu] g %.9g: %.9g vs %.9g", vec_isa_name(isa),
                  n, i, (double)g[i], (double)dg[i], (double)dg_ref[i]);
      }
      /* the vector paths agree bit for bit */
      if (first) {
        memcpy(out_first, out, n * sizeof(real));
        memcpy(dg_first, dg, n * sizeof(real));
        first = 0;
      } else {
        CHECK(memcmp(out_first, out, n * sizeof(real)) == 0);
        CHECK(memcmp(dg_first, dg, n * sizeof(real)) == 0);
      }
      /* in place (ops_list.h: dgate may be gate, dup may be up; a bf16 model's experts run it
       * so, model_moe.c): the same bits */
      {
        real *gi = malloc((n + 1) * sizeof(real)), *ui = malloc((n + 1) * sizeof(real));
        memcpy(gi, g, n * sizeof(real));
        memcpy(ui, u, n * sizeof(real));
        swiglu_backward(gi, ui, d, gi, ui, n);
        CHECK_MSG(memcmp(gi, dg, n * sizeof(real)) == 0 && memcmp(ui, dup, n * sizeof(real)) == 0,
                  "%s swiglu_backward in place n %zu", vec_isa_name(isa), n);
        free(gi), free(ui);
      }
      /* an element's result does not depend on where it is: the tensor from element 5 on */
      if (n > 5) {
        real *out5 = malloc(n * sizeof(real));
        swiglu_forward(out5, g + 5, u + 5, n - 5);
        CHECK(memcmp(out5, out + 5, (n - 5) * sizeof(real)) == 0);
        free(out5);
      }
    }
    free(g0); free(u0); free(d0); free(out_ref); free(dg_ref); free(dup_ref);
    free(out_first); free(dg_first); free(out); free(dg); free(dup);
  }
  vec_select(VEC_SCALAR);
  printf("swiglu vs scalar, worst in REAL_U: forward %.2f (bound 8), dup %.2f (10), dgate %.2f "
         "(16, of |dout up|(1+|g|))\n", worst_swiglu_fwd, worst_swiglu_dup, worst_swiglu_dg);
}

/* The fused gate|up product's SwiGLU (rows of [gate | up]) gives, on every path, the bits of the
 * separate-buffer kernels on the same gate and up: the fused layout changes where the operands
 * lie, not what is computed. */
static void swiglu_rows_give_the_separate_kernels_bits(void)
{
  const int shapes[][2] = { { 1, 1 }, { 3, 17 }, { 7, 688 }, { 64, 384 }, { 2, 9000 } };
  FOR_EACH_PATH(isa) {
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
      const int R = shapes[si][0], F = shapes[si][1];
      const size_t n = (size_t)R * F;
      real *gu = buf(2 * n, -20, 20), *d = buf(n, -2, 2), *g = malloc(n * sizeof(real));
      real *u = malloc(n * sizeof(real)), *out = malloc(n * sizeof(real)), *out_r = malloc(n * sizeof(real));
      real *dg = malloc(n * sizeof(real)), *dup = malloc(n * sizeof(real)), *dgu = malloc(2 * n * sizeof(real));
      for (int r = 0; r < R; r++) {
        memcpy(g + (size_t)r * F, gu + (size_t)r * 2 * F, F * sizeof(real));
        memcpy(u + (size_t)r * F, gu + (size_t)r * 2 * F + F, F * sizeof(real));
      }
      swiglu_forward(out, g, u, n);
      swiglu_forward_rows(out_r, gu, R, F);
      CHECK_MSG(memcmp(out, out_r, n * sizeof(real)) == 0, "%s rows %d × %d forward", vec_isa_name(isa), R, F);
      swiglu_backward(dg, dup, d, g, u, n);
      swiglu_backward_rows(dgu, d, gu, R, F);
      int same = 1;
      for (int r = 0; r < R; r++)
        same &= !memcmp(dgu + (size_t)r * 2 * F, dg + (size_t)r * F, F * sizeof(real)) &&
                !memcmp(dgu + (size_t)r * 2 * F + F, dup + (size_t)r * F, F * sizeof(real));
      CHECK_MSG(same, "%s rows %d × %d backward", vec_isa_name(isa), R, F);
#if !REAL_IS_DOUBLE
      bf16 *ob = malloc(n * sizeof(bf16)), *obr = malloc(n * sizeof(bf16));
      swiglu_forward_bf16(ob, g, u, n);
      swiglu_forward_rows_bf16(obr, gu, R, F);
      CHECK_MSG(memcmp(ob, obr, n * sizeof(bf16)) == 0, "%s rows %d × %d bf16", vec_isa_name(isa), R, F);
      free(ob), free(obr);
#endif
      free(gu), free(d), free(g), free(u), free(out), free(out_r), free(dg), free(dup), free(dgu);
    }
  }
  vec_select(VEC_SCALAR);
}

static void adamw_and_scale_give_the_scalar_bits(void)
{
  const real scales[] = { 1, 0.37f, (real)(1.0 / 3.0) };
  for (int si = 0; si < N_SIZES; si++) {
    const size_t n = sizes[si];
    real *p0 = buf(n, -1, 1), *g0 = buf(n, -1e-2, 1e-2), *m0 = buf(n, -1e-3, 1e-3);
    real *v0 = buf(n, 0, 1e-5);
    for (int sc = 0; sc < 3; sc++) {
      real *ref[3] = { NULL, NULL, NULL };
      FOR_EACH_PATH(isa) {
        real *p = copy(p0, n), *m = copy(m0, n), *v = copy(v0, n), *g = copy(g0, n);
        real *pf = copy(p0, n), *mf = copy(m0, n), *vf = copy(v0, n), *gs = copy(g0, n);
        for (int t = 1; t <= 3; t++) {
          adamw_update(p + OFFSET, g + OFFSET, m + OFFSET, v + OFFSET, n, 1e-3, 0.9, 0.95, 1e-8,
                       t == 2 ? 0.0 : 0.1, t, scales[sc]);
          /* clipping as it was: the gradients scaled in memory, then the step with scale 1 */
          memcpy(gs, g0, (n + OFFSET + 1) * sizeof(real));
          scale_inplace(gs + OFFSET, n, scales[sc]);
          adamw_update(pf + OFFSET, gs + OFFSET, mf + OFFSET, vf + OFFSET, n, 1e-3, 0.9, 0.95,
                       1e-8, t == 2 ? 0.0 : 0.1, t, 1);
        }
        CHECK_MSG(memcmp(p, pf, (n + OFFSET + 1) * sizeof(real)) == 0 &&
                  memcmp(m, mf, (n + OFFSET + 1) * sizeof(real)) == 0 &&
                  memcmp(v, vf, (n + OFFSET + 1) * sizeof(real)) == 0,
                  "%s n %zu scale %g: the folded scale differs from scaling first",
                  vec_isa_name(isa), n, (double)scales[sc]);
        CHECK(memcmp(g, g0, (n + OFFSET + 1) * sizeof(real)) == 0); /* grad only read */
        if (isa == VEC_SCALAR) {
          ref[0] = p, ref[1] = m, ref[2] = v;
        } else {
          CHECK_MSG(memcmp(p, ref[0], (n + OFFSET + 1) * sizeof(real)) == 0 &&
                    memcmp(m, ref[1], (n + OFFSET + 1) * sizeof(real)) == 0 &&
                    memcmp(v, ref[2], (n + OFFSET + 1) * sizeof(real)) == 0,
                    "%s adamw n %zu scale %g: not the scalar bits", vec_isa_name(isa), n,
                    (double)scales[sc]);
          CHECK(memcmp(gs, g0, OFFSET * sizeof(real)) == 0); /* scale stayed inside its range */
          real *sref = copy(g0, n);
          vec_select(VEC_SCALAR);
          scale_inplace(sref + OFFSET, n, scales[sc]);
          vec_select(isa);
          CHECK(memcmp(sref, gs, (n + OFFSET + 1) * sizeof(real)) == 0);
          free(sref);
          free(p), free(m), free(v);
        }
        free(g), free(pf), free(mf), free(vf), free(gs);
      }
      free(ref[0]), free(ref[1]), free(ref[2]);
    }
    free(p0), free(g0), free(m0), free(v0);
  }
  vec_select(VEC_SCALAR);
}

/* RoPE (forward and backward, separate and fused q|k|v rows, in place and not) and RMSNorm's
 * backward (its weight gradient and input gradient, dinp in place over dout too) on each path:
 * the scalar path's bits (the same operations, no FMA), for head sizes whose half is a whole
 * number of vectors and not, and widths around the 64-column block. */
static void rope_and_rmsnorm_backward_give_the_scalar_bits(void)
{
  static const int heads[][4] = { { 2, 3, 4, 12 }, { 1, 5, 2, 34 }, { 2, 4, 2, 32 }, { 1, 2, 1, 128 } };
  for (size_t hi = 0; hi < sizeof heads / sizeof *heads; hi++) {
    const int B = heads[hi][0], T = heads[hi][1], NH = heads[hi][2], HS = heads[hi][3], NKV = NH / 2 ? NH / 2 : 1;
    const size_t nq = (size_t)B * T * NH * HS, nqkv = (size_t)B * T * (NH + 2 * NKV) * HS;
    real *cosT = malloc((size_t)T * HS / 2 * sizeof(real)), *sinT = malloc((size_t)T * HS / 2 * sizeof(real));
    rope_table(cosT, sinT, T, HS, 10000.0, 3);
    real *x0 = buf(nq, -2, 2), *qkv0 = buf(nqkv, -2, 2);
    real *ref[4] = { NULL, NULL, NULL, NULL };
    FOR_EACH_PATH(isa) {
      real *out = copy(x0, nq), *back = copy(x0, nq), *inpl = copy(x0, nq), *qkv = copy(qkv0, nqkv);
      rope_forward(out + OFFSET, x0 + OFFSET, cosT, sinT, B, T, NH, HS);
      rope_backward(back + OFFSET, out + OFFSET, cosT, sinT, B, T, NH, HS);
      rope_forward(inpl + OFFSET, inpl + OFFSET, cosT, sinT, B, T, NH, HS);
      CHECK_MSG(memcmp(inpl, out, (nq + OFFSET + 1) * sizeof(real)) == 0, "%s HS %d: rope in place differs",
                vec_isa_name(isa), HS);
      rope_forward_qkv(qkv + OFFSET, cosT, sinT, B, T, NH, NKV, HS);
      rope_backward_qkv(qkv + OFFSET, cosT, sinT, B, T, NH, NKV, HS);
      real *got[4] = { out, back, inpl, qkv };
      const size_t n[4] = { nq, nq, nq, nqkv };
      for (int i = 0; i < 4; i++) {
        if (isa == VEC_SCALAR)
          ref[i] = got[i];
        else {
          CHECK_MSG(memcmp(got[i], ref[i], (n[i] + OFFSET + 1) * sizeof(real)) == 0, "%s HS %d: rope output %d is "
                    "not the scalar bits", vec_isa_name(isa), HS, i);
          free(got[i]);
        }
      }
    }
    for (int i = 0; i < 4; i++) free(ref[i]);
    free(cosT), free(sinT), free(x0), free(qkv0);
  }
  static const int widths[] = { 1, 7, 16, 64, 65, 200, 256 };
  for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
    const int C = widths[wi], BT = 11;
    const size_t n = (size_t)BT * C;
    real *inp = buf(n, -2, 2), *dout = buf(n, -1, 1), *w = buf((size_t)C, 0.5, 1.5), *rstd = buf((size_t)BT, 0.5, 2);
    real *ref_dx = NULL, *ref_dw = NULL, *ref_in = NULL;
    FOR_EACH_PATH(isa) {
      real *dx = buf(n, 0, 1), *dw = buf((size_t)C, -1, 1), *in = copy(dout, n);
      memcpy(dw, w, ((size_t)C + OFFSET + 1) * sizeof(real));
      rmsnorm_backward(dx + OFFSET, dw + OFFSET, dout + OFFSET, inp + OFFSET, w + OFFSET, rstd + OFFSET, BT, C);
      real *dw2 = copy(w, (size_t)C);
      rmsnorm_backward(in + OFFSET, dw2 + OFFSET, in + OFFSET, inp + OFFSET, w + OFFSET, rstd + OFFSET, BT, C);
      CHECK_MSG(memcmp(in + OFFSET, dx + OFFSET, n * sizeof(real)) == 0 && memcmp(dw2, dw, ((size_t)C + OFFSET + 1) *
                sizeof(real)) == 0, "%s C %d: rmsnorm_backward in place differs", vec_isa_name(isa), C);
      free(dw2);
      if (isa == VEC_SCALAR) {
        ref_dx = dx, ref_dw = dw, ref_in = in;
      } else {
        CHECK_MSG(memcmp(dx + OFFSET, ref_dx + OFFSET, n * sizeof(real)) == 0, "%s C %d: dinp not the scalar bits",
                  vec_isa_name(isa), C);
        CHECK_MSG(memcmp(dw, ref_dw, ((size_t)C + OFFSET + 1) * sizeof(real)) == 0, "%s C %d: dweight not the "
                  "scalar bits", vec_isa_name(isa), C);
        free(dx), free(dw), free(in);
      }
    }
    free(ref_dx), free(ref_dw), free(ref_in), free(inp), free(dout), free(w), free(rstd);
  }
  vec_select(VEC_SCALAR);
}

/* sumsq: squares of floats are exact in double, so the paths differ only in the order of a
 * double sum of n nonnegative terms: each within (n − 1) · DOUBLE_U relative of the exact sum,
 * bound 2 n · DOUBLE_U relative between them. The same bits for 1 and 2 threads on each path
 * (the fixed parts), and between the vector paths (the same 16 lanes). */
static void sumsq_paths_agree_to_double_rounding(void)
{
  const size_t big[] = { 0, 1, 15, 16, 17, 1000, 4099, 20000, 1234567 };
  for (int si = 0; si < (int)(sizeof big / sizeof big[0]); si++) {
    const size_t n = big[si];
    real *x0 = buf(n, -3, 3);
    double ref = 0, first = -1;
    FOR_EACH_PATH(isa) {
      omp_set_num_threads(1);
      const double one = sumsq(x0 + OFFSET, n);
      omp_set_num_threads(2);
      const double two = sumsq(x0 + OFFSET, n);
      omp_set_num_threads(1);
      CHECK_MSG(memcmp(&one, &two, sizeof one) == 0, "%s sumsq n %zu: %.17g with 1 thread, "
                "%.17g with 2", vec_isa_name(isa), n, one, two);
      if (isa == VEC_SCALAR) {
        ref = one;
        continue;
      }
      CHECK_MSG(near(one, ref, 2 * (double)n * DOUBLE_U * ref, &worst_sumsq, DOUBLE_U * ref),
                "%s sumsq n %zu: %.17g vs %.17g", vec_isa_name(isa), n, one, ref);
      if (first < 0)
        first = one;
      else
        CHECK(memcmp(&first, &one, sizeof one) == 0);
    }
    if (n == 0)
      CHECK(ref == 0.0);
    free(x0);
  }
  vec_select(VEC_SCALAR);
  printf("sumsq vs scalar: worst %.1f DOUBLE_U relative\n", worst_sumsq);
}

/* Cross-entropy: the vector path's exps are within 1.5 ulp (3 REAL_U relative) of the scalar
 * path's; Σ (in double) and 1/Σ follow them (3 REAL_U relative, plus double rounding), and a prob
 * rounds twice more on each side: bound 8 REAL_U relative. The loss is log Σ − (l_t − max) in
 * double, rounded to real: log Σ is off by ≤ 3 REAL_U absolute, and each side rounds once:
 * bound 4 REAL_U + 2 REAL_U · |loss|. The shard kernels run the same operations: the same
 * bounds, stats[1] (Σ rounded to real) 4 REAL_U relative. */
static void crossentropy_paths_match_the_scalar_path(void)
{
  const int shapes[][2] = { { 1, 1 }, { 3, 15 }, { 2, 16 }, { 4, 17 }, { 5, 1000 }, { 3, 4099 } };
  for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++) {
    const int BT = shapes[si][0], V = shapes[si][1], Vp = V + 3;
    const size_t ne = (size_t)BT * Vp;
    real *logits = buf(ne, -12, 12), *l = logits + OFFSET;
    int *targets = malloc((size_t)BT * sizeof(int));
    for (int bt = 0; bt < BT; bt++) targets[bt] = bt == 1 ? -1 : (int)(uniform() * V);
    for (int i = V; i < Vp; i++) l[i] = 100; /* padding, ignored */
    real *probs_ref = malloc(ne * sizeof(real)), *losses_ref = malloc((size_t)BT * sizeof(real));
    real *stats_ref = malloc(3 * (size_t)BT * sizeof(real));
    real *fin_ref = malloc(ne * sizeof(real)), *fin_loss_ref = malloc((size_t)BT * sizeof(real));
    real *probs = malloc(ne * sizeof(real)), *losses = malloc((size_t)BT * sizeof(real));
    real *stats = malloc(3 * (size_t)BT * sizeof(real)), *fin = malloc(ne * sizeof(real));
    real *fin_loss = malloc((size_t)BT * sizeof(real));
    FOR_EACH_PATH(isa) {
      crossentropy_forward(losses, probs, l, targets, BT, V, Vp);
      crossentropy_shard_max(stats, l, BT, V, Vp);
      crossentropy_shard_sums(stats, l, targets, 0, BT, V, Vp);
      crossentropy_shard_finish(fin_loss, fin, l, stats, targets, BT, V, Vp);
      if (isa == VEC_SCALAR) {
        memcpy(probs_ref, probs, ne * sizeof(real));
        memcpy(losses_ref, losses, (size_t)BT * sizeof(real));
        memcpy(stats_ref, stats, 3 * (size_t)BT * sizeof(real));
        memcpy(fin_ref, fin, ne * sizeof(real));
        memcpy(fin_loss_ref, fin_loss, (size_t)BT * sizeof(real));
        continue;
      }
      for (int bt = 0; bt < BT; bt++) {
        const double lr = losses_ref[bt], tol = 4 * REAL_U + 2 * REAL_U * fabs(lr);
        CHECK_MSG(near(losses[bt], lr, tol, &worst_loss, REAL_U), "%s loss [%d]: %.9g vs %.9g",
                  vec_isa_name(isa), bt, (double)losses[bt], lr);
        CHECK(near(fin_loss[bt], fin_loss_ref[bt], 4 * REAL_U + 2 * REAL_U * fabs((double)fin_loss_ref[bt]),
                   &worst_loss, REAL_U));
        CHECK(stats[bt] == stats_ref[bt]); /* the max: exact */
        CHECK(near(stats[BT + bt], stats_ref[BT + bt], 4 * REAL_U * stats_ref[BT + bt], &worst_prob, 0));
        CHECK(stats[2 * BT + bt] == stats_ref[2 * BT + bt]);
        for (int i = 0; i < Vp; i++) {
          const size_t k = (size_t)bt * Vp + i;
          const double pr = probs_ref[k];
          CHECK_MSG(near(probs[k], pr, 8 * REAL_U * pr, &worst_prob, REAL_U * pr),
                    "%s prob [%d, %d]: %.9g vs %.9g", vec_isa_name(isa), bt, i,
                    (double)probs[k], pr);
          CHECK(near(fin[k], fin_ref[k], 8 * REAL_U * fin_ref[k], &worst_prob, REAL_U * fin_ref[k]));
          if (i >= V)
            CHECK(probs[k] == 0.0f && fin[k] == 0.0f);
        }
      }
      /* in place (probs == logits), as the model calls it */
      real *inplace = copy(logits, ne);
      crossentropy_forward(losses, inplace + OFFSET, inplace + OFFSET, targets, BT, V, Vp);
      CHECK(memcmp(inplace + OFFSET, probs, ne * sizeof(real)) == 0);
      free(inplace);
    }
    free(logits); free(targets); free(probs_ref); free(losses_ref); free(stats_ref);
    free(fin_ref); free(fin_loss_ref); free(probs); free(losses); free(stats); free(fin);
    free(fin_loss);
  }
  vec_select(VEC_SCALAR);
  printf("cross-entropy vs scalar, worst: prob %.2f REAL_U relative (bound 8), loss %.2f REAL_U "
         "absolute (bound 4 + 2|loss|)\n", worst_prob, worst_loss);
}

/* Cross-entropy's backward, (p − onehot) · scale, a subtract and a multiply: every path gives
 * the scalar path's bits, full and sharded (targets before, inside and past the shard), in place
 * too, with padding columns 0 and ignored rows (target −1) all 0. */
static void crossentropy_backward_gives_the_scalar_bits(void)
{
  const int shapes[][3] = { { 1, 1, 0 }, { 3, 15, 1 }, { 2, 16, 0 }, { 4, 17, 3 }, { 5, 33, 15 },
                            { 6, 1000, 8 }, { 3, 4099, 5 }, { 8, 512, 0 } };
  const real scales[] = { 1, 0.37f, (real)(1.0 / 3.0) };
  for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++) {
    const int BT = shapes[si][0], V = shapes[si][1], Vp = V + shapes[si][2];
    const size_t ne = (size_t)BT * Vp;
    real *probs = buf(ne, 0, 1), *p = probs + OFFSET;
    p[0] = 1.0f, p[ne - 1] = -0.0f; /* p − 1 exactly 0 where the target is column 0; a −0 */
    int *targets = malloc((size_t)BT * sizeof(int));
    for (int bt = 0; bt < BT; bt++)
      targets[bt] = bt == 1 ? -1 : bt == 0 ? 0 : bt == 2 ? V - 1 : (int)(uniform() * V);
    for (int sc = 0; sc < 3; sc++) {
      /* the shards: the whole vocabulary as one, then [v0, v0 + Vl) for two splits of Vp */
      const int v0s[] = { 0, 0, Vp / 2, Vp / 3 }, Vls[] = { Vp, Vp / 2, Vp - Vp / 2, Vp / 3 };
      real *ref = malloc(ne * sizeof(real)), *sref[4];
      FOR_EACH_PATH(isa) {
        real *d = copy(probs, ne);
        crossentropy_backward(d + OFFSET, p, targets, scales[sc], BT, V, Vp);
        CHECK(memcmp(d, probs, OFFSET * sizeof(real)) == 0 &&
              d[OFFSET + ne] == probs[OFFSET + ne]); /* nothing written outside */
        real *inplace = copy(probs, ne);
        crossentropy_backward(inplace + OFFSET, inplace + OFFSET, targets, scales[sc], BT, V, Vp);
        CHECK_MSG(memcmp(inplace, d, (ne + OFFSET + 1) * sizeof(real)) == 0,
                  "%s %d × %d (Vp %d): in place differs", vec_isa_name(isa), BT, V, Vp);
        for (int bt = 0; bt < BT; bt++)
          for (int i = 0; i < Vp; i++) {
            const real di = d[OFFSET + (size_t)bt * Vp + i];
            if (targets[bt] < 0 || i >= V)
              CHECK(di == 0.0f);
          }
        if (isa == VEC_SCALAR)
          memcpy(ref, d + OFFSET, ne * sizeof(real));
        else
          CHECK_MSG(memcmp(ref, d + OFFSET, ne * sizeof(real)) == 0,
                    "%s %d × %d (Vp %d) scale %g: not the scalar bits", vec_isa_name(isa), BT, V,
                    Vp, (double)scales[sc]);
        for (int sh = 0; sh < 4; sh++) {
          const int v0 = v0s[sh], Vl = Vls[sh];
          const int Vvalid = V - v0 < 0 ? 0 : V - v0 > Vl ? Vl : V - v0;
          const size_t ns = (size_t)BT * Vl;
          real *ls = malloc((ns + 1) * sizeof(real)), *ds = malloc((ns + 1) * sizeof(real));
          for (int bt = 0; bt < BT; bt++)
            memcpy(ls + (size_t)bt * Vl, p + (size_t)bt * Vp + v0, (size_t)Vl * sizeof(real));
          crossentropy_shard_backward(ds, ls, targets, v0, scales[sc], BT, Vvalid, Vl);
          if (isa == VEC_SCALAR) {
            sref[sh] = ds;
            /* the whole vocabulary as one shard is the full kernel */
            if (sh == 0)
              CHECK(memcmp(ds, ref, ne * sizeof(real)) == 0);
          } else {
            CHECK_MSG(memcmp(sref[sh], ds, ns * sizeof(real)) == 0,
                      "%s shard v0 %d Vl %d of %d × %d: not the scalar bits", vec_isa_name(isa),
                      v0, Vl, BT, V);
            free(ds);
          }
          free(ls);
        }
        free(d), free(inplace);
      }
      for (int sh = 0; sh < 4; sh++) free(sref[sh]);
      free(ref);
    }
    free(probs), free(targets);
  }
  vec_select(VEC_SCALAR);
}

/* The float64 build computes in double on the scalar path whatever is selected. */
static void the_float64_build_stays_scalar(void)
{
  const size_t n = 1000;
  real *g = buf(n, -5, 5), *u = buf(n, -1, 1), *a = malloc(n * sizeof(real));
  real *b = malloc(n * sizeof(real));
  vec_select(VEC_SCALAR);
  swiglu_forward(a, g, u, n);
  int same_everywhere = 1;
  for (int pi = 0; pi < n_paths; pi++) {
    vec_select(paths[pi]);
    swiglu_forward(b, g, u, n);
    same_everywhere &= memcmp(a, b, n * sizeof(real)) == 0;
  }
  vec_select(VEC_SCALAR);
  /* fp32: a vector path's exp is not libm's, so some element differs (with a path to run) */
  CHECK(REAL_IS_DOUBLE ? same_everywhere : n_paths == 0 || !same_everywhere);
  free(g), free(u), free(a), free(b);
}

TEST_MAIN(TEST(the_environment_chooses_the_path),
          TEST(exp_is_within_one_ulp_over_the_float_range),
          TEST(swiglu_paths_match_the_scalar_path),
          TEST(swiglu_rows_give_the_separate_kernels_bits),
          TEST(adamw_and_scale_give_the_scalar_bits),
          TEST(sumsq_paths_agree_to_double_rounding),
          TEST(crossentropy_paths_match_the_scalar_path),
          TEST(crossentropy_backward_gives_the_scalar_bits),
          TEST(rope_and_rmsnorm_backward_give_the_scalar_bits),
          TEST(the_float64_build_stays_scalar))
