/* The optimizer step and gradient utilities: AdamW against torch.optim.AdamW's update worked
 * out by hand over three steps (decoupled weight decay applied first, bias correction), the
 * global-norm helpers, and the gradient convention every backward follows — parameter
 * gradients accumulate (+=) over calls, activation gradients are assigned (=). */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "kernels.h"

static void adamw_matches_hand_computed_three_steps(void)
{
  /* lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.1. Element 0 starts at 1 with
   * gradients 0.5, −0.25, 1:
   * t=1: p = 1 · (1 − 0.01) = 0.99; m = 0.05, v = 0.00025; m̂ = 0.05/0.1 = 0.5,
   *      v̂ = 0.00025/0.001 = 0.25; p = 0.99 − 0.1 · 0.5/(0.5 + 1e-8) = 0.890000002.
   * t=2: p = 0.890000002 · 0.99 = 0.881100002; m = 0.045 − 0.025 = 0.02,
   *      v = 0.00024975 + 0.0000625 = 0.00031225; m̂ = 0.02/0.19 = 0.105263158,
   *      v̂ = 0.00031225/0.001999 = 0.156203102, sqrt 0.395225382;
   *      p = 0.881100002 − 0.1 · 0.105263158/0.395225382 = 0.854466299.
   * t=3: m = 0.118, v = 0.00131193775, p = 0.780110477 (same recurrence, double loop).
   * Element 1 starts at −2 with zero gradients: only the decay acts, p = −2 · 0.99^t.
   * Element 2 starts at 0 with gradient g = 1e-3 every step: then m̂ = g and v̂ = g² at every
   * t, so after the decay each step moves by 0.1 · g/(g + 1e-8) (g as stored: 1e-3f).
   * Absolute bounds, in roundings of the kernel (the scalars rounded to real, then ~5 operations
   * per state per step) and of the double values here:
   *   p: |p| ≤ 2 and each step rounds p · decay (2) and a ≤ 0.1 update (~6), ≤ 10 units over
   *      three steps: 16 · (REAL_U + DOUBLE_U); element 1 (decay only, 2 roundings of 2 per
   *      step, the same rounded decay thrice): relative 8 · (REAL_U + DOUBLE_U);
   *   m: three roundings of a 0.1-sized term and one of m per step, the old error decaying
   *      by 0.9: ≤ 0.7 units, bound 1 · (REAL_U + DOUBLE_U);
   *   v: ≤ 3 roundings of v per step, the old error kept (× 0.999): relative 12 · (REAL_U +
   *      DOUBLE_U).
   * A term of the update left out or misplaced (decay after the step, no bias correction) moves
   * p by ≥ 1e-3. */
  real p[3] = { 1.0f, -2.0f, 0.0f }, m[3] = { 0 }, v[3] = { 0 };
  const real grads[3][3] = { { 0.5f, 0, 1e-3f }, { -0.25f, 0, 1e-3f }, { 1.0f, 0, 1e-3f } };
  const double expect_p0[3] = { 0.890000002, 0.8544662986878463, 0.7801104766702113 };
  const double expect_m0[3] = { 0.05, 0.02, 0.118 };
  const double expect_v0[3] = { 0.00025, 0.00031225, 0.00131193775 };
  const double U = REAL_U + DOUBLE_U, g2 = grads[0][2];
  double p2 = 0.0;
  for (int t = 1; t <= 3; t++) {
    adamw_update(p, grads[t - 1], m, v, 3, 0.1, 0.9, 0.999, 1e-8, 0.1, t, 1);
    CHECK_NEAR(p[0], expect_p0[t - 1], 16 * U);
    CHECK_NEAR(m[0], expect_m0[t - 1], 1 * U);
    CHECK_NEAR(v[0], expect_v0[t - 1], 12 * U * expect_v0[t - 1]);
    CHECK_NEAR(p[1], -2.0 * pow(0.99, t), 8 * U * 2.0);
    CHECK(m[1] == 0.0f && v[1] == 0.0f); /* 0 + w · (0 − 0): exactly 0 */
    p2 = p2 * 0.99 - 0.1 * g2 / (g2 + 1e-8);
    CHECK_NEAR(p[2], p2, 16 * U);
  }
}

static void sumsq_accumulates_in_double(void)
{
  const real x[4] = { 1, -2, 3, 0.5f };
  CHECK(sumsq(x, 4) == 14.25); /* small dyadic numbers: exact */
  /* A million 0.1f: a float accumulator drifts by ~1e-4 relative, a double one does not. Each
   * square is exact in double (24 × 24 bits) and a double sum of n terms is within n · DOUBLE_U
   * = 1.1e-10 relative of the exact one, in both builds: 1e-9 relative. */
  const size_t n = 1000000;
  real *y = malloc(n * sizeof(real));
  for (size_t i = 0; i < n; i++) y[i] = 0.1f;
  double expect = (double)n * (0.1f * (double)0.1f);
  CHECK_NEAR(sumsq(y, n), expect, 1e-9 * expect);
  free(y);
}

static void scale_inplace_multiplies_every_element(void)
{
  real x[5] = { 1, -2, 4, 0, 8 };
  scale_inplace(x, 5, 0.5f); /* by a power of two: exact */
  CHECK(x[0] == 0.5f && x[1] == -1 && x[2] == 2 && x[3] == 0 && x[4] == 4);
}

static real rnd(uint32_t *state) /* xorshift32, uniform in [-1, 1) */
{
  *state ^= *state << 13;
  *state ^= *state >> 17;
  *state ^= *state << 5;
  return (real)(*state >> 8) / 8388608.0f - 1.0f;
}

/* Two backward calls into zeroed parameter grads give twice one call's gradient, while the
 * activation gradient is the same after either call (bitwise: the same operations on the same
 * data). A call that overwrote (=) instead of adding would leave one call's gradient, off by
 * its whole size. */
static void parameter_grads_accumulate_activation_grads_assign(void)
{
  enum { BT = 5, C = 6, OC = 4, VP = 7 };
  uint32_t s = 21;
  real x[BT * C], w[OC * C], g[C], dout[BT * OC], dnorm[BT * C], rstd[BT], y[BT * C];
  for (int i = 0; i < BT * C; i++) x[i] = rnd(&s), dnorm[i] = rnd(&s);
  for (int i = 0; i < OC * C; i++) w[i] = rnd(&s);
  for (int i = 0; i < C; i++) g[i] = rnd(&s);
  for (int i = 0; i < BT * OC; i++) dout[i] = rnd(&s);
  const int tokens[BT] = { 3, 3, 0, 6, 3 };

  real dw1[OC * C] = { 0 }, dw2[OC * C] = { 0 }, dx1[BT * C], dx2[BT * C];
  linear_backward(dx1, dw1, dout, x, w, BT, C, OC);
  linear_backward(dx2, dw2, dout, x, w, BT, C, OC);
  linear_backward(dx2, dw2, dout, x, w, BT, C, OC);
  /* dw = Σ_bt doutᵀ x through gemm: each call's product is within γ_BT · S of the exact sum,
   * S = Σ_bt |dout · x| (any summation order or kernel), and the second call adds one more
   * rounding: |dw2 − 2 dw1| ≤ (4 BT + 2) · REAL_U · S. (OpenBLAS sums before it adds C, so
   * here it is 0; the interface does not promise that.) */
  for (int o = 0; o < OC; o++)
    for (int c = 0; c < C; c++) {
      double size = 0.0;
      for (int bt = 0; bt < BT; bt++) size += fabs((double)dout[bt * OC + o] * x[bt * C + c]);
      CHECK_NEAR(dw2[o * C + c], 2.0f * dw1[o * C + c], (4 * BT + 2) * REAL_U * size);
    }
  CHECK(memcmp(dx1, dx2, sizeof dx1) == 0);

  real dg1[C] = { 0 }, dg2[C] = { 0 };
  rmsnorm_forward(y, rstd, x, g, BT, C, 1e-5f);
  rmsnorm_backward(dx1, dg1, dnorm, x, g, rstd, BT, C);
  rmsnorm_backward(dx2, dg2, dnorm, x, g, rstd, BT, C);
  rmsnorm_backward(dx2, dg2, dnorm, x, g, rstd, BT, C);
  /* dweight += (real)Σ in double: the same rounded sum both times, and a + a = 2a exactly. */
  for (int i = 0; i < C; i++) CHECK(dg2[i] == 2.0f * dg1[i]);
  CHECK(memcmp(dx1, dx2, sizeof dx1) == 0);

  real dwte1[VP * C] = { 0 }, dwte2[VP * C] = { 0 };
  encoder_backward(dwte1, dnorm, tokens, BT, C);
  encoder_backward(dwte2, dnorm, tokens, BT, C);
  encoder_backward(dwte2, dnorm, tokens, BT, C);
  /* A row is the sum of its tokens' rows in token order, once (≤ 3 terms) or twice (≤ 6):
   * |dwte2 − 2 dwte1| ≤ (5 + 2 · 2) · REAL_U · S, S = 2 Σ |dnorm| over the row's tokens. */
  for (int v = 0; v < VP; v++)
    for (int c = 0; c < C; c++) {
      double size = 0.0;
      for (int bt = 0; bt < BT; bt++) size += tokens[bt] == v ? 2 * fabs((double)dnorm[bt * C + c]) : 0;
      CHECK_NEAR(dwte2[v * C + c], 2.0f * dwte1[v * C + c], 9 * REAL_U * size);
    }
}

TEST_MAIN(TEST(adamw_matches_hand_computed_three_steps),
          TEST(sumsq_accumulates_in_double),
          TEST(scale_inplace_multiplies_every_element),
          TEST(parameter_grads_accumulate_activation_grads_assign))
