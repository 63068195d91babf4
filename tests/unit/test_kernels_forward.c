/* Forward kernels against numbers worked out by hand and against straightforward
 * double-precision loops written here independently of the kernels (HF's formulas, literally).
 * Backward passes are tested against finite differences in test_kernels_grad.c.
 * Bounds count roundings: an output that passes k roundings in the kernel (unit roundoff REAL_U)
 * and k in the double reference is within k · (REAL_U + DOUBLE_U) of it, relative to the sizes
 * of the terms; the hand-worked values are computed here from their formulas in double, so the
 * float64 build is held to its own roundoff too. The inputs (multiples of 2^-23 in [−1, 1), small
 * integers) are exact in both builds. exp, log, sin and cos count as one rounding each (glibc's
 * are within 0.502 ulp). Every bound is ~1e-6 of the outputs or less in fp32, so a wrong index,
 * term or scale (O(1e-2) or more) fails it. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels.h"

static real rnd(uint32_t *state) /* xorshift32, uniform in [-1, 1) */
{
  *state ^= *state << 13;
  *state ^= *state >> 17;
  *state ^= *state << 5;
  return (real)(*state >> 8) / 8388608.0f - 1.0f;
}

static real *rand_buf(size_t n, uint32_t *state)
{
  real *x = malloc(n * sizeof(real));
  for (size_t i = 0; i < n; i++) x[i] = rnd(state);
  return x;
}

static void rmsnorm_forward_matches_hand_computed(void)
{
  /* Row 0: mean(x²) = 30/4 = 7.5, + eps 0.5 = 8, rstd = 1/sqrt(8) = 0.35355339;
   * out = x · rstd · g = (0.35355339, 0.35355339, 2.12132034, −1.41421356).
   * Row 1: zeros, rstd = 1/sqrt(0.5) = 1.41421356, out 0.
   * The sums are exact; rstd passes 2 roundings (sqrt, 1/·, in double, then to real: 1 of
   * REAL_U), out 2 more (· rstd, · g): relative 2 and 4 · (REAL_U + DOUBLE_U). */
  const real x[8] = { 1, 2, 3, 4, 0, 0, 0, 0 }, g[4] = { 1, 0.5f, 2, -1 };
  const double r0 = 1.0 / sqrt(8.0), r1 = 1.0 / sqrt(0.5);
  const double expect[4] = { 1 * r0 * 1, 2 * r0 * 0.5, 3 * r0 * 2, 4 * r0 * -1 };
  real out[8], rstd[2];
  rmsnorm_forward(out, rstd, x, g, 2, 4, 0.5f);
  CHECK_NEAR(rstd[0], r0, 2 * (REAL_U + DOUBLE_U) * r0);
  CHECK_NEAR(rstd[1], r1, 2 * (REAL_U + DOUBLE_U) * r1);
  for (int c = 0; c < 4; c++) {
    CHECK_NEAR(out[c], expect[c], 4 * (REAL_U + DOUBLE_U) * fabs(expect[c]));
    CHECK(out[4 + c] == 0.0f); /* 0 · rstd · g: exactly 0 */
  }
}

static void rmsnorm_forward_matches_double_reference(void)
{
  enum { BT = 6, C = 24 };
  uint32_t s = 1;
  real *x = rand_buf(BT * C, &s), *g = rand_buf(C, &s), out[BT * C], rstd[BT];
  const real eps = 1e-5f; /* the kernel's eps, also in the reference */
  rmsnorm_forward(out, rstd, x, g, BT, C, eps);
  /* Relative bounds. rstd: the sums of C squares are in double on both sides (≤ C · DOUBLE_U
   * each), then /C, + eps, sqrt, 1/· (≤ 4 · DOUBLE_U each side) and the kernel's cast to real
   * (REAL_U), halved by the square root: ≤ REAL_U + (C + 4) · DOUBLE_U; 2 · REAL_U taken for
   * the cast. out: 2 more products in the kernel (2 · REAL_U) and 2 in the reference. */
  const double r_tol = 2 * REAL_U + (C + 4) * DOUBLE_U, out_tol = r_tol + 2 * (REAL_U + DOUBLE_U);
  for (int bt = 0; bt < BT; bt++) {
    double ms = 0.0;
    for (int c = 0; c < C; c++) ms += (double)x[bt * C + c] * x[bt * C + c] / C;
    double r = 1.0 / sqrt(ms + eps);
    CHECK_NEAR(rstd[bt], r, r_tol * r);
    for (int c = 0; c < C; c++) {
      double want = x[bt * C + c] * r * g[c];
      CHECK_NEAR(out[bt * C + c], want, out_tol * fabs(want));
    }
  }
  free(x);
  free(g);
}

static void rope_table_matches_hand_computed_angles(void)
{
  /* HS = 4, theta = 100: inv_freq = (100^0, 100^(−1/2)) = (1, 0.1); position 1 has angles
   * (1, 0.1) rad. */
  real cos_t[4], sin_t[4];
  rope_table(cos_t, sin_t, 2, 4, 100.0, 0);
  CHECK(cos_t[0] == 1.0f && cos_t[1] == 1.0f && sin_t[0] == 0.0f && sin_t[1] == 0.0f); /* exact */
  /* cos 1 = 0.5403023059, cos 0.1 = 0.9950041653, sin 1 = 0.8414709848, sin 0.1 = 0.0998334166:
   * the table is libm's double value rounded once to real (≤ REAL_U · |v|, v < 1), its angle
   * 100^(-1/2) one double rounding off 0.1: within REAL_U + 4 · DOUBLE_U absolute. */
  const double tol = REAL_U + 4 * DOUBLE_U;
  CHECK_NEAR(cos_t[2], cos(1.0), tol);
  CHECK_NEAR(cos_t[3], cos(0.1), tol);
  CHECK_NEAR(sin_t[2], sin(1.0), tol);
  CHECK_NEAR(sin_t[3], sin(0.1), tol);
}

static void rope_table_with_pos0_equals_rows_of_full_table(void)
{
  enum { T = 9, HS = 8, POS0 = 4 };
  real cf[T * HS / 2], sf[T * HS / 2], cp[(T - POS0) * HS / 2], sp[(T - POS0) * HS / 2];
  rope_table(cf, sf, T, HS, 10000.0, 0);
  rope_table(cp, sp, T - POS0, HS, 10000.0, POS0);
  /* Bitwise: each entry is cos/sin of (pos0 + t) · inv_freq, the same double operations. */
  CHECK(memcmp(cf + POS0 * HS / 2, cp, sizeof cp) == 0);
  CHECK(memcmp(sf + POS0 * HS / 2, sp, sizeof sp) == 0);
}

static void rope_forward_matches_hand_computed(void)
{
  /* x = (1, 2, 3, 4) rotates in pairs (x0, x2) = (1, 3) by 1 rad and (x1, x3) = (2, 4) by 0.1:
   * out0 = 1 cos 1 − 3 sin 1 = −1.98411065, out2 = 3 cos 1 + 1 sin 1 = 2.46237790,
   * out1 = 2 cos 0.1 − 4 sin 0.1 = 1.59067466, out3 = 4 cos 0.1 + 2 sin 0.1 = 4.17968349.
   * Position 0 is unchanged (cos 0 = 1, sin 0 = 0 exactly). Computed in place.
   * Absolute bound: each output rounds cos and sin (to real), two products and a sum; weighted
   * by the terms' sizes (≤ 4.2) that is ≤ 13 roundings of a unit term (out3), 16 taken. */
  real cos_t[4], sin_t[4], x[8] = { 1, 2, 3, 4, 1, 2, 3, 4 };
  const double c1 = cos(1.0), s1 = sin(1.0), c01 = cos(0.1), s01 = sin(0.1);
  const double expect[8] = { 1, 2, 3, 4, 1 * c1 - 3 * s1, 2 * c01 - 4 * s01, 3 * c1 + 1 * s1,
                             4 * c01 + 2 * s01 };
  const double tol = 16 * (REAL_U + DOUBLE_U);
  rope_table(cos_t, sin_t, 2, 4, 100.0, 0);
  rope_forward(x, x, cos_t, sin_t, 1, 2, 1, 4);
  for (int i = 0; i < 8; i++) CHECK_NEAR(x[i], expect[i], tol);
  /* The same row at pos0 = 1, T = 1 gives the position-1 values. */
  real y[4] = { 1, 2, 3, 4 };
  rope_table(cos_t, sin_t, 1, 4, 100.0, 1);
  rope_forward(y, y, cos_t, sin_t, 1, 1, 1, 4);
  for (int i = 0; i < 4; i++) CHECK_NEAR(y[i], expect[4 + i], tol);
}

static void rope_forward_matches_hf_rotate_half_reference(void)
{
  /* HF: out = x · cat(cos, cos) + rotate_half(x) · cat(sin, sin), rotate_half(x) = (−x2, x1). */
  enum { B = 2, T = 5, NHX = 3, HS = 8, POS0 = 2 };
  const int half = HS / 2;
  const double theta = 10000.0;
  uint32_t s = 2;
  real *x = rand_buf(B * T * NHX * HS, &s), out[B * T * NHX * HS];
  real cos_t[T * HS / 2], sin_t[T * HS / 2];
  rope_table(cos_t, sin_t, T, HS, theta, POS0);
  rope_forward(out, x, cos_t, sin_t, B, T, NHX, HS);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NHX; h++) {
        const real *xv = x + ((b * T + t) * NHX + h) * HS;
        const real *ov = out + ((b * T + t) * NHX + h) * HS;
        for (int j = 0; j < HS; j++) {
          double angle = (POS0 + t) * pow(theta, -2.0 * (j % half) / HS);
          double rot = j < half ? -xv[j + half] : xv[j - half];
          /* |x| < 1: cos and sin rounded to real, two products, one sum, ≤ 5 unit-size
           * roundings in the kernel and as many in double here; 8 taken, absolute. */
          CHECK_NEAR(ov[j], xv[j] * cos(angle) + rot * sin(angle), 8 * (REAL_U + DOUBLE_U));
        }
      }
  free(x);
}

static void attention_forward_matches_hand_computed(void)
{
  /* T = 2, HS = 4 (scale 1/2). Row 0 sees only key 0: out0 = v0. Row 1 scores:
   * q1·k0/2 = (1·2 + 1·2)/2 = 2, q1·k1/2 = 0; softmax = (e²/(e²+1), 1/(e²+1))
   * = (0.88079708, 0.11920292); out1 = 0.88079708 v0 + 0.11920292 v1.
   * lse = (1, log(e² + 1) = 2.12692801).
   * Scores are exact (small integers · 1/2); row 0 meets one key (exp 0 = 1, Σ 1), so lse0 is
   * exactly 1 and out0 exactly v0. lse1 passes exp(−2), Σ and log in double and a cast:
   * relative ≤ 4 · (REAL_U + DOUBLE_U). out1 = (Σ_j exp(s_j − 2) v_j) · (1/Σ): exp, the gemm's
   * product and sum, 1/Σ and a product: ≤ 5.2 roundings of Σ_j p_j |v_j| (≤ 3.2), bound 6. */
  const real q[8] = { 1, 0, 0, 0, 1, 1, 0, 0 }, k[8] = { 2, 2, 0, 0, 0, 0, 0, 0 };
  const real v[8] = { 3, 1, 0, -1, 5, 0, 2, 1 };
  const double p0 = 1.0 / (1.0 + exp(-2.0)), p1 = exp(-2.0) / (1.0 + exp(-2.0));
  const double lse1 = log(exp(2.0) + 1.0);
  real out[8], lse[2], *scratch = malloc(attention_scratch_n_elems(1, 2, 1, 1, 4) * sizeof(real));
  attention_forward(out, lse, scratch, q, k, v, NULL, 1, 2, 1, 1, 4);
  free(scratch);
  CHECK(lse[0] == 1.0f);
  CHECK_NEAR(lse[1], lse1, 4 * (REAL_U + DOUBLE_U) * lse1);
  for (int i = 0; i < 4; i++) {
    CHECK(out[i] == v[i]);
    double want = p0 * v[i] + p1 * v[4 + i], size = p0 * fabs(v[i]) + p1 * fabs(v[4 + i]);
    CHECK_NEAR(out[4 + i], want, 6 * (REAL_U + DOUBLE_U) * size);
  }
}

/* Straightforward causal GQA attention in double, for one (b, h, t) row. */
static void attention_reference_row(double *out_row, double *lse, double *probs_row, const real *q,
                                    const real *k, const real *v, const real *mask, int b,
                                    int h, int t, int T, int NH, int NKV, int HS)
{
  int kvh = h / (NH / NKV);
  const real *qv = q + ((size_t)(b * T + t) * NH + h) * HS;
  double max = -INFINITY, sum = 0.0;
  for (int j = 0; j < T; j++) {
    if (j > t) { probs_row[j] = 0.0; continue; }
    const real *kv = k + ((size_t)(b * T + j) * NKV + kvh) * HS;
    double dot = 0.0;
    for (int i = 0; i < HS; i++) dot += (double)qv[i] * kv[i];
    probs_row[j] = dot / sqrt((double)HS);
    if (probs_row[j] > max) max = probs_row[j];
  }
  for (int j = 0; j <= t; j++) sum += probs_row[j] = exp(probs_row[j] - max);
  *lse = max + log(sum);
  for (int j = 0; j <= t; j++) probs_row[j] /= sum;
  for (int i = 0; i < HS; i++) out_row[i] = 0.0;
  for (int j = 0; j <= t; j++) {
    const real *vv = v + ((size_t)(b * T + j) * NKV + kvh) * HS;
    double w = probs_row[j] * (mask ? mask[(((size_t)b * NH + h) * T + t) * T + j] : 1.0);
    for (int i = 0; i < HS; i++) out_row[i] += w * vv[i];
  }
}

static void check_attention_against_reference(int use_mask)
{
  enum { B = 2, T = 5, NH = 4, NKV = 2, HS = 4 };
  uint32_t s = 3;
  real *q = rand_buf(B * T * NH * HS, &s), *k = rand_buf(B * T * NKV * HS, &s);
  real *v = rand_buf(B * T * NKV * HS, &s);
  real out[B * T * NH * HS], lse[B * NH * T], mask[B * NH * T * T];
  real *scratch = malloc(attention_scratch_n_elems(B, T, NH, NKV, HS) * sizeof(real));
  /* the kernel draws sample b's dropout as dropout_mask draws its (NH, T, T) block */
  const uint32_t samples[B] = { 0, 1 };
  const struct attention_dropout drop = { 0.3f, 5, 0, 0, 0, samples };
  for (int b = 0; b < B; b++)
    dropout_mask(mask + b * NH * T * T, NH * T * T, 0.3f, 5, 0, samples[b], 0, 0);
  attention_forward(out, lse, scratch, q, k, v, use_mask ? &drop : NULL, B, T, NH, NKV, HS);
  double max_err = 0.0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        double out_ref[HS], probs_ref[T], lse_ref;
        attention_reference_row(out_ref, &lse_ref, probs_ref, q, k, v, use_mask ? mask : NULL, b,
                                h, t, T, NH, NKV, HS);
        max_err = fmax(max_err, fabs(lse[((size_t)b * NH + h) * T + t] - lse_ref));
        for (int i = 0; i < HS; i++)
          max_err = fmax(max_err, fabs(out[((size_t)(b * T + t) * NH + h) * HS + i]
                                       - out_ref[i]));
      }
  /* Absolute, over lse (|lse| ≤ 2.7: scores ≤ 2 in size, T 5) and outputs (|out| ≤ 1.43, the
   * mask's 1/0.7): each passes ~10 roundings (a 4-term score, exp, Σ, 1/Σ, a product, a ≤ 5-term sum against v) on each side;
   * they add up like a random walk to 1..2 units, seen; 16 · (REAL_U + DOUBLE_U) (1e-6 in fp32)
   * leaves a margin of 8. */
  const double tol = 16 * (REAL_U + DOUBLE_U);
  CHECK_MSG(max_err < tol, "use_mask %d: max error %g (%.3g units), bound %.3g", use_mask,
            max_err, max_err / REAL_U, tol);
  free(q);
  free(k);
  free(v);
  free(scratch);
}

static void attention_forward_gqa_matches_double_reference(void)
{
  check_attention_against_reference(0);
}

static void attention_forward_with_dropout_matches_double_reference(void)
{
  check_attention_against_reference(1);
}

static void crossentropy_forward_matches_hand_computed(void)
{
  /* V = 3, Vp = 4; row 0 logits (1, 2, 3 | pad 100), target 2:
   * loss = log(e + e² + e³) − 3 = log(1 + e⁻¹ + e⁻²) = 0.40760596,
   * probs = (0.09003057, 0.24472847, 0.66524096, 0) — the padding logit 100 is ignored.
   * Row 1: target −1, loss 0. Row 2: logits (1000, 0, −1000), target 1: loss 1000 (stable).
   * Computed in place (probs == logits).
   * Row 0: exp(−1), exp(−2) are computed in real, Σ and log in double, the loss cast to real:
   * ≤ 1 rounding of a unit, bound 4 · (REAL_U + DOUBLE_U) absolute (loss 0.41); a prob passes
   * exp, Σ, 1/Σ and a product: relative ≤ 3.4 roundings, bound 4. Row 2: 1000 + log(1 + e^-1000 + e^-2000)
   * is 1000 in any precision, and exp(−1000) underflows to 0: loss exactly 1000, prob exactly 1
   * (exp 0 / 1). */
  real logits[12] = { 1, 2, 3, 100, 1, 2, 3, 100, 1000, 0, -1000, 7 }, losses[3];
  const int targets[3] = { 2, -1, 1 };
  const double sum = 1.0 + exp(-1.0) + exp(-2.0), want_p[3] = { exp(-2.0) / sum, exp(-1.0) / sum,
                                                                 1.0 / sum };
  crossentropy_forward(losses, logits, logits, targets, 3, 3, 4);
  CHECK_NEAR(losses[0], log(sum), 4 * (REAL_U + DOUBLE_U));
  CHECK(losses[1] == 0.0f);
  CHECK(losses[2] == 1000.0f);
  for (int i = 0; i < 3; i++) CHECK_NEAR(logits[i], want_p[i], 4 * (REAL_U + DOUBLE_U) * want_p[i]);
  CHECK(logits[3] == 0.0f && logits[7] == 0.0f && logits[11] == 0.0f);
  CHECK(logits[8] == 1.0f);
}

static void linear_forward_is_x_times_weight_transposed(void)
{
  enum { BT = 3, IC = 5, OC = 4 };
  uint32_t s = 4;
  real *x = rand_buf(BT * IC, &s), *w = rand_buf(OC * IC, &s), out[BT * OC];
  linear_forward(out, x, w, BT, IC, OC);
  /* An IC-term dot product computed in any order, with or without FMA (so for every gemm
   * kernel), is within γ_IC · Σ|x_i w_i| ≈ IC · u · Σ|x_i w_i| (Higham, Accuracy and Stability,
   * 3.1): IC · (REAL_U + DOUBLE_U) · Σ|x_i w_i| for the kernel and the double loop here. */
  for (int bt = 0; bt < BT; bt++)
    for (int o = 0; o < OC; o++) {
      double y = 0.0, size = 0.0;
      for (int i = 0; i < IC; i++) {
        y += (double)x[bt * IC + i] * w[o * IC + i];
        size += fabs((double)x[bt * IC + i] * w[o * IC + i]);
      }
      CHECK_NEAR(out[bt * OC + o], y, IC * (REAL_U + DOUBLE_U) * size);
    }
  free(x);
  free(w);
}

/* linear_forward_acc adds the product into out: out = r + x·wᵀ, a sum of IC + 1 terms (r among
 * them), held to the same bound with IC + 1. */
static void linear_forward_acc_adds_into_out(void)
{
  enum { BT = 7, IC = 37, OC = 9 };
  uint32_t s = 8;
  real *x = rand_buf(BT * IC, &s), *w = rand_buf(OC * IC, &s), *r = rand_buf(BT * OC, &s), out[BT * OC];
  memcpy(out, r, sizeof out);
  linear_forward_acc(out, x, w, BT, IC, OC);
  for (int bt = 0; bt < BT; bt++)
    for (int o = 0; o < OC; o++) {
      double y = r[bt * OC + o], size = fabs((double)r[bt * OC + o]);
      for (int i = 0; i < IC; i++) {
        y += (double)x[bt * IC + i] * w[o * IC + i];
        size += fabs((double)x[bt * IC + i] * w[o * IC + i]);
      }
      CHECK_NEAR(out[bt * OC + o], y, (IC + 1) * (REAL_U + DOUBLE_U) * size);
    }
  free(x), free(w), free(r);
}

static void pointwise_forwards_match_hand_computed(void)
{
  /* silu(1) · 2 = 2 / (1 + e⁻¹) = 1.46211716; silu(−2) · 0.5 = −1 / (1 + e²) = −0.11920292.
   * exp (e² carries its error into 1 + e² almost whole), 1 + ·, g / ·, · up: relative ≤ 3.9
   * roundings, bound 5 · (REAL_U + DOUBLE_U). The rest below is exact (sums and products of
   * small integers, copies). */
  const real gate[2] = { 1, -2 }, up[2] = { 2, 0.5f };
  const double want[2] = { 2.0 / (1.0 + exp(-1.0)), -1.0 / (1.0 + exp(2.0)) };
  real out[2];
  swiglu_forward(out, gate, up, 2);
  CHECK_NEAR(out[0], want[0], 5 * (REAL_U + DOUBLE_U) * fabs(want[0]));
  CHECK_NEAR(out[1], want[1], 5 * (REAL_U + DOUBLE_U) * fabs(want[1]));
  const real a[3] = { 1, 2, 3 }, b[3] = { 10, 20, 30 }, mask[3] = { 0, 2, 2 };
  real sum[3], dropped[3];
  vec_add(sum, a, b, 3);
  CHECK(sum[0] == 11 && sum[1] == 22 && sum[2] == 33);
  dropout_forward(dropped, a, mask, 3);
  CHECK(dropped[0] == 0 && dropped[1] == 4 && dropped[2] == 6);
  const real wte[3 * 2] = { 0, 1, 2, 3, 4, 5 };
  const int tokens[4] = { 2, 0, 2, 1 };
  real emb[8];
  encoder_forward(emb, tokens, wte, 4, 2);
  const real expect[8] = { 4, 5, 0, 1, 4, 5, 2, 3 };
  CHECK(memcmp(emb, expect, sizeof emb) == 0);
}

/* The norms sum several rows side by side; each row must still get the one-row loops' bits (the
 * sums in column order), whatever BT, here a group of 8 rows and a tail of 5, at 1 and 2 threads;
 * backward also in place (dinp = dout), as the model calls it. */
static void rmsnorm_rows_give_the_one_row_loops_bits(void)
{
  enum { BT = 13, C = 37 };
  uint32_t s = 7;
  real *x = rand_buf(BT * C, &s), *g = rand_buf(C, &s), *d = rand_buf(BT * C, &s);
  real out[BT * C], rstd[BT], want_out[BT * C], want_rstd[BT];
  real dx[BT * C], dg[C], want_dx[BT * C], want_dg[C], inplace[BT * C], dg2[C];
  const real eps = 1e-5f;
  for (int bt = 0; bt < BT; bt++) {
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += (double)x[bt * C + c] * x[bt * C + c];
    want_rstd[bt] = (real)(1.0 / sqrt(ss / C + eps));
    for (int c = 0; c < C; c++) want_out[bt * C + c] = x[bt * C + c] * want_rstd[bt] * g[c];
  }
  for (int c = 0; c < C; c++) {
    double acc = 0.0;
    for (int bt = 0; bt < BT; bt++) acc += (double)d[bt * C + c] * x[bt * C + c] * want_rstd[bt];
    want_dg[c] = (real)acc;
  }
  for (int bt = 0; bt < BT; bt++) {
    double r = want_rstd[bt], dot = 0.0;
    for (int c = 0; c < C; c++) dot += (double)d[bt * C + c] * g[c] * x[bt * C + c];
    real k = (real)(r * r * r * dot / C);
    for (int c = 0; c < C; c++) want_dx[bt * C + c] = (real)r * g[c] * d[bt * C + c] - k * x[bt * C + c];
  }
  const int threads0 = omp_get_max_threads();
  for (int threads = 1; threads <= 2; threads++) {
    omp_set_num_threads(threads);
    rmsnorm_forward(out, rstd, x, g, BT, C, eps);
    CHECK(memcmp(rstd, want_rstd, sizeof rstd) == 0);
    CHECK(memcmp(out, want_out, sizeof out) == 0);
    memset(dg, 0, sizeof dg);
    rmsnorm_backward(dx, dg, d, x, g, rstd, BT, C);
    CHECK(memcmp(dx, want_dx, sizeof dx) == 0);
    CHECK(memcmp(dg, want_dg, sizeof dg) == 0);
    memcpy(inplace, d, sizeof inplace);
    memset(dg2, 0, sizeof dg2);
    rmsnorm_backward(inplace, dg2, inplace, x, g, rstd, BT, C);
    CHECK(memcmp(inplace, want_dx, sizeof inplace) == 0);
    CHECK(memcmp(dg2, want_dg, sizeof dg2) == 0);
  }
  omp_set_num_threads(threads0);
  free(x);
  free(g);
  free(d);
}

TEST_MAIN(TEST(rmsnorm_forward_matches_hand_computed),
          TEST(rmsnorm_forward_matches_double_reference),
          TEST(rmsnorm_rows_give_the_one_row_loops_bits),
          TEST(rope_table_matches_hand_computed_angles),
          TEST(rope_table_with_pos0_equals_rows_of_full_table),
          TEST(rope_forward_matches_hand_computed),
          TEST(rope_forward_matches_hf_rotate_half_reference),
          TEST(attention_forward_matches_hand_computed),
          TEST(attention_forward_gqa_matches_double_reference),
          TEST(attention_forward_with_dropout_matches_double_reference),
          TEST(crossentropy_forward_matches_hand_computed),
          TEST(linear_forward_is_x_times_weight_transposed),
          TEST(linear_forward_acc_adds_into_out),
          TEST(pointwise_forwards_match_hand_computed))
