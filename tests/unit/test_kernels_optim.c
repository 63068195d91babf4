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
   * Element 2 starts at 0 with gradient 1e-3 every step: then m̂ = 1e-3 and v̂ = 1e-6 at every
   * t, so after the decay each step moves by 0.1 · 1e-3/(1e-3 + 1e-8). */
  real p[3] = { 1.0f, -2.0f, 0.0f }, m[3] = { 0 }, v[3] = { 0 };
  const real grads[3][3] = { { 0.5f, 0, 1e-3f }, { -0.25f, 0, 1e-3f }, { 1.0f, 0, 1e-3f } };
  const double expect_p0[3] = { 0.890000002, 0.8544662986878463, 0.7801104766702113 };
  const double expect_m0[3] = { 0.05, 0.02, 0.118 };
  const double expect_v0[3] = { 0.00025, 0.00031225, 0.00131193775 };
  double p2 = 0.0;
  for (int t = 1; t <= 3; t++) {
    adamw_update(p, grads[t - 1], m, v, 3, 0.1, 0.9, 0.999, 1e-8, 0.1, t);
    CHECK_NEAR(p[0], expect_p0[t - 1], 1e-6);
    CHECK_NEAR(m[0], expect_m0[t - 1], 1e-7);
    CHECK_NEAR(v[0], expect_v0[t - 1], 1e-9);
    CHECK_NEAR(p[1], -2.0 * pow(0.99, t), 1e-6);
    CHECK(m[1] == 0.0f && v[1] == 0.0f);
    p2 = p2 * 0.99 - 0.1 * 1e-3 / (1e-3 + 1e-8);
    CHECK_NEAR(p[2], p2, 1e-6);
  }
}

static void sumsq_accumulates_in_double(void)
{
  const real x[4] = { 1, -2, 3, 0.5f };
  CHECK(sumsq(x, 4) == 14.25);
  /* A million 0.1f: a real accumulator drifts by ~1e-4 relative, a double one does not. */
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
  scale_inplace(x, 5, 0.5f);
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
 * activation gradient is the same after either call. */
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
  for (int i = 0; i < OC * C; i++) CHECK_NEAR(dw2[i], 2.0f * dw1[i], 1e-6);
  CHECK(memcmp(dx1, dx2, sizeof dx1) == 0);

  real dg1[C] = { 0 }, dg2[C] = { 0 };
  rmsnorm_forward(y, rstd, x, g, BT, C, 1e-5f);
  rmsnorm_backward(dx1, dg1, dnorm, x, g, rstd, BT, C);
  rmsnorm_backward(dx2, dg2, dnorm, x, g, rstd, BT, C);
  rmsnorm_backward(dx2, dg2, dnorm, x, g, rstd, BT, C);
  for (int i = 0; i < C; i++) CHECK_NEAR(dg2[i], 2.0f * dg1[i], 1e-6);
  CHECK(memcmp(dx1, dx2, sizeof dx1) == 0);

  real dwte1[VP * C] = { 0 }, dwte2[VP * C] = { 0 };
  encoder_backward(dwte1, dnorm, tokens, BT, C);
  encoder_backward(dwte2, dnorm, tokens, BT, C);
  encoder_backward(dwte2, dnorm, tokens, BT, C);
  for (int i = 0; i < VP * C; i++) CHECK_NEAR(dwte2[i], 2.0f * dwte1[i], 1e-6);
}

TEST_MAIN(TEST(adamw_matches_hand_computed_three_steps),
          TEST(sumsq_accumulates_in_double),
          TEST(scale_inplace_multiplies_every_element),
          TEST(parameter_grads_accumulate_activation_grads_assign))
