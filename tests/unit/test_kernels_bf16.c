/* bf16 conversions and the bf16 linear products (kernels/bf16.h).
 *
 * Conversions are checked bit by bit: round to nearest with ties to even, infinities kept, every
 * NaN a NaN, and every one of the 65,536 bf16 patterns surviving a round trip through float.
 *
 * Products: bf16 operands are exact in fp32 and so is the product of two of them (8 + 8
 * significant bits fit in fp32's 24), so the only error of an fp32-accumulated product is the
 * summation's: |computed − exact| ≤ K · u · Σ_k |a_k b_k| with u = 2^-24 (the standard bound for
 * a sum of K terms in any order, K · u well below 1 here). The reference is computed in double
 * from the same bf16 values, exactly enough (K · 2^-53) to be the exact sum for this bound.
 * Both paths are held to it: oneDNN's matmul where the CPU has bf16 products, and the widened
 * products (fp32 products over the widened operands, K in slices) that a CPU without them runs.
 *
 * The producers of bf16 operands (kernels.h, "bf16 compute") must write exactly their fp32
 * twin's values rounded, and AdamW's bf16 twin must leave param, m and v with the fp32 kernel's
 * bits: compared bit for bit, on lengths that end inside a vector block and span several. The
 * widenings (a norm's gain, the embedding's rows read from their copies) are exact. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <stdint.h>
#include <stdlib.h>

#include "bf16.h"
#include "check.h"
#include "kernels.h"

static uint32_t bits_of(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float float_of(uint32_t u)
{
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static void conversion_rounds_to_nearest_even(void)
{
  CHECK(bf16_from_float(1.0f) == 0x3f80);
  CHECK(bf16_from_float(float_of(0x3f808000u)) == 0x3f80); /* a tie, to the even 0x3f80 */
  CHECK(bf16_from_float(float_of(0x3f818000u)) == 0x3f82); /* a tie, to the even 0x3f82 */
  CHECK(bf16_from_float(float_of(0x3f808001u)) == 0x3f81); /* above the tie: up */
  CHECK(bf16_from_float(float_of(0x3f807fffu)) == 0x3f80); /* below the tie: down */
  CHECK(bf16_from_float(float_of(0xbf808001u)) == 0xbf81); /* the same for negatives */
  CHECK(bf16_from_float(float_of(0x7f7fffffu)) == 0x7f80); /* FLT_MAX rounds to +inf */
  CHECK(bf16_from_float(INFINITY) == 0x7f80);
  CHECK(bf16_from_float(-INFINITY) == 0xff80);
  CHECK(bf16_from_float(0.0f) == 0x0000);
  CHECK(bf16_from_float(-0.0f) == 0x8000);
  /* NaNs stay NaNs, even one whose payload lies only in the bits that are dropped */
  const uint32_t nans[] = { 0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu };
  for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
    bf16 b = bf16_from_float(float_of(nans[i]));
    CHECK_MSG(isnan(bf16_to_float(b)), "NaN %08x became %04x", nans[i], b);
    CHECK((b & 0x8000) == ((nans[i] >> 16) & 0x8000)); /* sign kept */
  }
}

static void every_pattern_round_trips(void)
{
  int bad = 0;
  for (uint32_t p = 0; p < 65536; p++) {
    float f = bf16_to_float((bf16)p);
    CHECK_MSG(bits_of(f) == p << 16, "widening %04x", p);
    bf16 back = bf16_from_float(f);
    if (isnan(f))
      bad += !isnan(bf16_to_float(back));
    else
      bad += back != p;
  }
  CHECK_MSG(bad == 0, "%d patterns did not survive a round trip", bad);
  /* bf16_round (vectorised, built per ISA) gives bf16_from_float's bits on every float pattern
   * class: 2^20 patterns stepped over the whole 32-bit range (NaNs, infinities, denormals,
   * halfway cases among them), plus each exact halfway pattern around every bf16 */
  enum { NP = 1 << 20 };
  float *pat = malloc(sizeof(float) * (NP + 2 * 65536));
  bf16 *got = malloc(sizeof(bf16) * (NP + 2 * 65536));
  size_t np = 0;
  for (uint32_t i = 0; i < NP; i++) pat[np++] = float_of(i * 4099u + (i >> 7));
  for (uint32_t p = 0; p < 65536; p++) {
    pat[np++] = float_of((p << 16) | 0x8000u); /* exactly halfway: ties to even */
    pat[np++] = float_of((p << 16) | 0x7fffu);
  }
  bf16_round(got, pat, np);
  size_t mismatches = 0;
  for (size_t i = 0; i < np; i++) mismatches += got[i] != bf16_from_float(pat[i]);
  CHECK_MSG(mismatches == 0, "bf16_round differs from bf16_from_float on %zu of %zu patterns", mismatches, np);
  free(pat), free(got);
  /* the array forms agree with the scalar ones */
  float src[37], wide[37];
  bf16 dst[37];
  for (int i = 0; i < 37; i++) src[i] = (float)i * 0.3137f - 5.0f;
  bf16_round(dst, src, 37);
  bf16_widen(wide, dst, 37);
  for (int i = 0; i < 37; i++) {
    CHECK(dst[i] == bf16_from_float(src[i]));
    CHECK(wide[i] == bf16_to_float(dst[i]));
  }
}

static bf16 *random_bf16(size_t n, unsigned *seed)
{
  bf16 *x = malloc(n * sizeof *x + 2);
  for (size_t i = 0; i < n; i++) x[i] = bf16_from_float((float)rand_r(seed) / RAND_MAX * 2.0f - 1.0f);
  return x;
}

/* max over elements of |got − exact| / (K · u · Σ|terms| + tiny): ≤ 1 is within the bound */
struct worst { double ratio; };
static void compare(struct worst *w, double got, double exact, double abs_sum, int K)
{
  const double bound = K * 0x1p-24 * abs_sum + 1e-30;
  double r = fabs(got - exact) / bound;
  if (r > w->ratio)
    w->ratio = r;
}

/* The forward's rows against the exact sums: got (BT, OC) = r + x · wᵀ, r NULL for none. */
static void forward_against_exact(struct worst *wst, const float *got, const float *r, const bf16 *x,
                                  const bf16 *w, int BT, int IC, int OC)
{
  for (int t = 0; t < BT; t++)
    for (int o = 0; o < OC; o++) {
      double e = r ? r[t * OC + o] : 0.0, a = r ? fabs(r[t * OC + o]) : 0.0;
      for (int i = 0; i < IC; i++) {
        double term = (double)bf16_to_float(x[t * IC + i]) * bf16_to_float(w[o * IC + i]);
        e += term, a += fabs(term);
      }
      compare(wst, got[t * OC + o], e, a, IC + (r != NULL));
    }
}

/* The four products on the path chosen now (oneDNN's, or widened), against the exact sums. */
static void products_on_this_path(void)
{
  char err[256];
  const int shapes[][3] = { { 1, 1, 1 }, { 7, 13, 5 }, { 64, 256, 688 }, { 130, 64, 96 }, { 1024, 256, 256 },
                          { 300, 600, 70 } };
  unsigned seed = 7;
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
    const int BT = shapes[s][0], IC = shapes[s][1], OC = shapes[s][2];
    bf16 *x = random_bf16((size_t)BT * IC, &seed), *w = random_bf16((size_t)OC * IC, &seed);
    bf16 *dy = random_bf16((size_t)BT * OC, &seed);
    float *out = malloc(sizeof(float) * BT * OC), *dx = malloc(sizeof(float) * BT * IC);
    float *dw = malloc(sizeof(float) * OC * IC), *dw0 = malloc(sizeof(float) * OC * IC);
    for (int i = 0; i < OC * IC; i++) dw0[i] = dw[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
    CHECK_MSG(!linear_bf16_forward(out, x, w, BT, IC, OC, err, sizeof err), "%s", err);
    CHECK_MSG(!linear_bf16_backward_input(dx, dy, w, BT, IC, OC, err, sizeof err), "%s", err);
    CHECK_MSG(!linear_bf16_backward_weight(dw, dy, x, BT, IC, OC, err, sizeof err), "%s", err);
    /* forward into a residual: out_acc = r + x · wᵀ, held to the bound of K + 1 terms */
    float *r0 = malloc(sizeof(float) * BT * OC), *oa = malloc(sizeof(float) * BT * OC);
    for (int i = 0; i < BT * OC; i++) r0[i] = oa[i] = (float)rand_r(&seed) / RAND_MAX - 0.5f;
    CHECK_MSG(!linear_bf16_forward_acc(oa, x, w, BT, IC, OC, err, sizeof err), "%s", err);
    struct worst fa = { 0 };
    forward_against_exact(&fa, oa, r0, x, w, BT, IC, OC);
    CHECK_MSG(fa.ratio <= 1.0, "forward into a residual: %.3f of the bound", fa.ratio);
    free(r0), free(oa);
    /* twice: a kept primitive gives the same result */
    float *out2 = malloc(sizeof(float) * BT * OC);
    CHECK(!linear_bf16_forward(out2, x, w, BT, IC, OC, err, sizeof err));
    CHECK(!memcmp(out, out2, sizeof(float) * BT * OC));
    struct worst f = { 0 }, bi = { 0 }, bw = { 0 };
    forward_against_exact(&f, out, NULL, x, w, BT, IC, OC);
    for (int t = 0; t < BT; t++)
      for (int i = 0; i < IC; i++) {
        double e = 0, a = 0;
        for (int o = 0; o < OC; o++) {
          double term = (double)bf16_to_float(dy[t * OC + o]) * bf16_to_float(w[o * IC + i]);
          e += term, a += fabs(term);
        }
        compare(&bi, dx[t * IC + i], e, a, OC);
      }
    for (int o = 0; o < OC; o++)
      for (int i = 0; i < IC; i++) {
        double e = dw0[o * IC + i], a = fabs(dw0[o * IC + i]);
        for (int t = 0; t < BT; t++) {
          double term = (double)bf16_to_float(dy[t * OC + o]) * bf16_to_float(x[t * IC + i]);
          e += term, a += fabs(term);
        }
        compare(&bw, dw[o * IC + i], e, a, BT + 1);
      }
    printf("  %4d × %4d → %4d: worst error / bound: forward %.3f, input gradient %.3f, weight gradient %.3f\n",
           BT, IC, OC, f.ratio, bi.ratio, bw.ratio);
    CHECK(f.ratio <= 1.0);
    CHECK(bi.ratio <= 1.0);
    CHECK(bw.ratio <= 1.0);
    free(x), free(w), free(dy), free(out), free(out2), free(dx), free(dw), free(dw0);
  }
}

/* oneDNN's bf16 matmul where this CPU has it at speed, and the widened products (the path of a CPU
 * without bf16 instructions, TYCHO_BF16=widen elsewhere) everywhere: both within the bound. The
 * float64 build has no bf16 products: refused, saying so. */
static void products_match_the_exact_sums(void)
{
  const char *impl;
  char err[256];
#if REAL_IS_DOUBLE
  float out[1];
  bf16 one = bf16_from_float(1.0f);
  CHECK(linear_bf16_forward(out, &one, &one, 1, 1, 1, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "float64");
  (void)impl;
  return;
#endif
  if (bf16_matmul_available(&impl, err, sizeof err)) {
    printf("no bf16 products at speed (%s): the widened path only\n", err);
  } else {
    printf("oneDNN bf16 matmul: %s\n", impl);
    products_on_this_path();
  }
  setenv("TYCHO_BF16", "widen", 1);
  CHECK(bf16_widened_asked());
  printf("widened (%s):\n", bf16_linear_path(err, sizeof err));
  CHECK_STR_CONTAINS(err, "widened");
  products_on_this_path();
  unsetenv("TYCHO_BF16");
}

#if !REAL_IS_DOUBLE
static float *random_floats(size_t n, unsigned *seed, float scale)
{
  float *x = malloc(n * sizeof *x + 4);
  for (size_t i = 0; i < n; i++) x[i] = ((float)rand_r(seed) / RAND_MAX * 2.0f - 1.0f) * scale;
  return x;
}

static size_t rounded_mismatches(const bf16 *got, const float *twin, size_t n)
{
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) bad += got[i] != bf16_from_float(twin[i]);
  return bad;
}

static void producers_write_their_twins_rounded(void)
{
  unsigned seed = 11;
  /* RMSNorm: rows of C */
  const int BT = 37, C = 96;
  float *x = random_floats((size_t)BT * C, &seed, 3.0f), *g = random_floats((size_t)C, &seed, 1.5f);
  float *y = malloc(sizeof(float) * BT * C), *r1 = malloc(sizeof(float) * BT), *r2 = malloc(sizeof(float) * BT);
  bf16 *yb = malloc(sizeof(bf16) * BT * C);
  rmsnorm_forward(y, r1, x, g, BT, C, 1e-5f);
  rmsnorm_forward_bf16(yb, r2, x, g, BT, C, 1e-5f);
  CHECK(rounded_mismatches(yb, y, (size_t)BT * C) == 0);
  CHECK(memcmp(r1, r2, sizeof(float) * BT) == 0);
  free(x), free(g), free(y), free(r1), free(r2), free(yb);

  /* SwiGLU and AdamW over lengths inside one vector block and across several */
  const size_t lens[] = { 1, 13, 8192, 8193, 3 * 8192 + 17 };
  for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
    const size_t n = lens[li];
    float *ga = random_floats(n, &seed, 6.0f), *up = random_floats(n, &seed, 2.0f);
    float *h = malloc(sizeof(float) * n);
    bf16 *hb = malloc(sizeof(bf16) * n);
    swiglu_forward(h, ga, up, n);
    swiglu_forward_bf16(hb, ga, up, n);
    CHECK_MSG(rounded_mismatches(hb, h, n) == 0, "swiglu, n = %zu", n);

    float *p1 = random_floats(n, &seed, 0.1f), *gr = random_floats(n, &seed, 0.01f);
    float *m1 = random_floats(n, &seed, 0.001f), *v1 = random_floats(n, &seed, 0.0f);
    float *p2 = malloc(sizeof(float) * n), *m2 = malloc(sizeof(float) * n), *v2 = malloc(sizeof(float) * n);
    memcpy(p2, p1, sizeof(float) * n), memcpy(m2, m1, sizeof(float) * n), memcpy(v2, v1, sizeof(float) * n);
    bf16 *pb = malloc(sizeof(bf16) * n);
    for (int t = 1; t <= 3; t++) {
      adamw_update(p1, gr, m1, v1, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, t, 0.5f);
      adamw_update_bf16(p2, pb, gr, m2, v2, n, 1e-3, 0.9, 0.95, 1e-8, 0.1, t, 0.5f);
    }
    CHECK_MSG(!memcmp(p1, p2, sizeof(float) * n) && !memcmp(m1, m2, sizeof(float) * n) &&
              !memcmp(v1, v2, sizeof(float) * n), "adamw, n = %zu", n);
    CHECK_MSG(rounded_mismatches(pb, p2, n) == 0, "adamw's bf16 copy, n = %zu", n);
    free(ga), free(up), free(h), free(hb), free(p1), free(gr), free(m1), free(v1), free(p2), free(m2),
      free(v2), free(pb);
  }

  /* the rounding entry */
  float *z = random_floats(1000, &seed, 100.0f);
  bf16 *zb = malloc(sizeof(bf16) * 1000);
  round_bf16(zb, z, 1000);
  CHECK(rounded_mismatches(zb, z, 1000) == 0);

  /* the widenings: a norm's gain, and the embedding's rows (a shard's: others zero) as the fp32
   * lookup gives them from the table widened */
  float *zw = malloc(sizeof(float) * 1000);
  widen_bf16(zw, zb, 1000);
  for (int i = 0; i < 1000; i++) CHECK(bits_of(zw[i]) == bits_of(bf16_to_float(zb[i])));
  const int V = 10, EC = 100, ET = 7, tokens[7] = { 0, 9, 3, 3, 5, 2, 8 };
  float ea[7 * 100], eb[7 * 100];
  encoder_forward_shard(ea, tokens, zw, 2, 6, ET, EC); /* rows 2..7 of the 10 in zb's 1000 */
  encoder_forward_bf16(eb, tokens, zb, 2, 6, ET, EC);
  CHECK(!memcmp(ea, eb, sizeof ea));
  encoder_forward(ea, tokens, zw, ET, EC);
  encoder_forward_bf16(eb, tokens, zb, 0, V, ET, EC);
  CHECK(!memcmp(ea, eb, sizeof ea));
  /* accumulate_bf16: the fp32 sum of two bf16 values rounded to bf16 (a gradient shard's share
   * added); ties to even (bf16's ulp at 1 is 2^-7) */
  bf16 *za = malloc(sizeof(bf16) * 1000), *want = malloc(sizeof(bf16) * 1000);
  float *zsum = malloc(sizeof(float) * 1000);
  for (int i = 0; i < 1000; i++) {
    za[i] = zb[999 - i];
    zsum[i] = bf16_to_float(za[i]) + bf16_to_float(zb[i]);
  }
  round_bf16(want, zsum, 1000);
  accumulate_bf16(za, zb, 1000);
  CHECK(!memcmp(za, want, sizeof(bf16) * 1000));
  bf16 one = bf16_from_float(1.0f), half_ulp = bf16_from_float(0.00390625f), three = bf16_from_float(0.01171875f);
  bf16 acc = one;
  accumulate_bf16(&acc, &half_ulp, 1);
  CHECK(bits_of(bf16_to_float(acc)) == bits_of(1.0f)); /* 1 + 2^-8, halfway: to even 1 */
  acc = one;
  accumulate_bf16(&acc, &three, 1);
  CHECK(bits_of(bf16_to_float(acc)) == bits_of(1.015625f)); /* 1 + 3·2^-8, halfway: to even 1 + 2^-6 */
  free(za), free(want), free(zsum);
  free(z), free(zb), free(zw);
}

/* linear_backward_bf16 with dinp NULL: only the weight gradient, accumulated. */
static void backward_without_input_gradient_accumulates_only(void)
{
  char err[256];
  unsigned seed = 5;
  const int BT = 9, IC = 16, OC = 8;
  bf16 *x = random_bf16((size_t)BT * IC, &seed), *w = random_bf16((size_t)OC * IC, &seed);
  bf16 *dy = random_bf16((size_t)BT * OC, &seed);
  float dw[OC * IC], dw2[OC * IC], dx[BT * IC];
  for (int i = 0; i < OC * IC; i++) dw[i] = dw2[i] = 0.25f;
  CHECK(!linear_backward_bf16(NULL, dw, dy, x, w, BT, IC, OC, err, sizeof err));
  CHECK(!linear_backward_bf16(dx, dw2, dy, x, w, BT, IC, OC, err, sizeof err));
  CHECK(!memcmp(dw, dw2, sizeof dw)); /* the same accumulation either way */
  float dw3[OC * IC];
  for (int i = 0; i < OC * IC; i++) dw3[i] = 0.25f;
  CHECK(!linear_bf16_backward_weight(dw3, dy, x, BT, IC, OC, err, sizeof err));
  CHECK(!memcmp(dw, dw3, sizeof dw));
  free(x), free(w), free(dy);
}
#else
/* The float64 build has no bf16 compute entries (bf16 plans are refused there). */
static void producers_write_their_twins_rounded(void)
{
  CHECK(kernel_ops_cpu.round_bf16 == NULL && kernel_ops_cpu.adamw_update_bf16 == NULL);
}
static void backward_without_input_gradient_accumulates_only(void)
{
  CHECK(kernel_ops_cpu.linear_backward_bf16 == NULL);
}
#endif

TEST_MAIN(TEST(conversion_rounds_to_nearest_even), TEST(every_pattern_round_trips),
          TEST(products_match_the_exact_sums), TEST(producers_write_their_twins_rounded),
          TEST(backward_without_input_gradient_accumulates_only))
