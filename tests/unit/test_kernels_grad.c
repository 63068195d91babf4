/* Every backward kernel against central finite differences of its own forward.
 * The objective is L = Σ out ⊙ R for a fixed random R (or the weighted loss sum for
 * cross-entropy); each element of each input and parameter is nudged by ±h (FD_EPS) and
 * (L+ − L−) / (x+ − x−) is compared with the analytic gradient: |analytic − fd| ≤ FD_ABS_TOL +
 * FD_REL_TOL · |fd|. The finite difference carries two errors: truncation, (h² / 6) · L''', and
 * rounding, ≈ u · S / (2h), with u the unit roundoff of the outputs and S = Σ |out ⊙ R| over the
 * outputs the nudged element moves (the others round alike in L+ and L− and cancel): S ≈ 1..10.
 *   fp32, h = 1e-2: rounding 6e-8 · ~5 / 2e-2 ≈ 1e-5, truncation 1.7e-5 · L''' ≲ 2e-5; bound
 *     1e-4 + 1e-3 · |fd|. The largest deviation seen is 1.5e-5 (a tenth of the bound).
 *   float64, h = 1e-5 (near the optimum (3u·S / L''')^(1/3)): rounding 1.1e-16 · ~5 / 2e-5 ≈
 *     3e-11, truncation 1.7e-11 · L''' ≲ 2e-10 (attention, inputs up to ±2); bound 2e-9 + 1e-8 ·
 *     |fd|. The largest deviation seen is 2.5e-10 (an eighth of the bound).
 * A missing or wrong term has the size of a gradient (1e-3..1 with these inputs) and fails
 * either bound by orders of magnitude. Parameter gradients start from random values and must
 * grow by exactly the gradient (+=); activation gradients start from 1e3 garbage and must be
 * overwritten (=). */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "kernels.h"

#define FD_EPS TOL(1e-2f, 1e-5)
#define FD_ABS_TOL TOL(1e-4, 2e-8) /* float64: the central difference at h 1e-5 leaves ~1e-8 on the attention with dropout at T 70 under OpenBLAS's SkylakeX kernel */
#define FD_REL_TOL TOL(1e-3, 1e-8)
#define GARBAGE 1e3f

static real rnd(uint32_t *state) /* xorshift32, uniform in [-1, 1) */
{
  *state ^= *state << 13;
  *state ^= *state >> 17;
  *state ^= *state << 5;
  return (real)(*state >> 8) / 8388608.0f - 1.0f;
}

static real *rand_buf(size_t n, real scale, uint32_t *state)
{
  real *x = malloc(n * sizeof(real));
  for (size_t i = 0; i < n; i++) x[i] = scale * rnd(state);
  return x;
}

static real *filled(size_t n, real value)
{
  real *x = malloc(n * sizeof(real));
  for (size_t i = 0; i < n; i++) x[i] = value;
  return x;
}

static double dot(const real *a, const real *b, size_t n)
{
  double s = 0.0;
  for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
  return s;
}

typedef double (*objective_fn)(void *ctx);

/* Checks grad (n) against central differences of objective with respect to x (n);
 * base, when not NULL, is the value grad held before the backward call (parameter grads). */
static void check_grad(const char *what, real *x, size_t n, const real *grad,
                       const real *base, objective_fn objective, void *ctx)
{
  double worst = 0.0, worst_fd = 0.0, worst_an = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < n; i++) {
    real saved = x[i];
    x[i] = saved + FD_EPS;
    real up = x[i];
    double l_up = objective(ctx);
    x[i] = saved - FD_EPS;
    real down = x[i];
    double l_down = objective(ctx);
    x[i] = saved;
    double fd = (l_up - l_down) / ((double)up - down);
    double analytic = grad[i] - (base ? base[i] : 0.0f);
    double err = fabs(analytic - fd) / (FD_ABS_TOL + FD_REL_TOL * fabs(fd));
    if (!(err <= worst)) { worst = err; worst_i = i; worst_fd = fd; worst_an = analytic; }
  }
  objective(ctx); /* leave the outputs as they were */
  CHECK_MSG(worst <= 1.0, "%s[%zu]: analytic %.7g, finite difference %.7g", what, worst_i,
            worst_an, worst_fd);
}

/* ---- embedding ---- */
enum { EMB_BT = 6, EMB_C = 3, EMB_VP = 5 };
struct emb_ctx { real *out, *wte, *R; const int *tokens; };
static double emb_objective(void *p)
{
  struct emb_ctx *c = p;
  encoder_forward(c->out, c->tokens, c->wte, EMB_BT, EMB_C);
  return dot(c->out, c->R, EMB_BT * EMB_C);
}

static void encoder_backward_matches_finite_differences(void)
{
  static const int tokens[EMB_BT] = { 1, 3, 1, 0, 4, 1 }; /* token 1 three times, 2 never */
  uint32_t s = 11;
  struct emb_ctx c = { malloc(EMB_BT * EMB_C * sizeof(real)),
                       rand_buf(EMB_VP * EMB_C, 1, &s), rand_buf(EMB_BT * EMB_C, 1, &s), tokens };
  real *base = rand_buf(EMB_VP * EMB_C, 1, &s), *dwte = malloc(EMB_VP * EMB_C * sizeof(real));
  memcpy(dwte, base, EMB_VP * EMB_C * sizeof(real));
  emb_objective(&c);
  encoder_backward(dwte, c.R, tokens, EMB_BT, EMB_C);
  check_grad("dwte", c.wte, EMB_VP * EMB_C, dwte, base, emb_objective, &c);
  free(c.out); free(c.wte); free(c.R); free(base); free(dwte);
}

/* ---- RMSNorm ---- */
enum { RMS_BT = 4, RMS_C = 8 };
struct rms_ctx { real *out, *rstd, *x, *g, *R; };
static double rms_objective(void *p)
{
  struct rms_ctx *c = p;
  rmsnorm_forward(c->out, c->rstd, c->x, c->g, RMS_BT, RMS_C, 1e-5f);
  return dot(c->out, c->R, RMS_BT * RMS_C);
}

static void rmsnorm_backward_matches_finite_differences(void)
{
  const size_t n = RMS_BT * RMS_C;
  uint32_t s = 12;
  struct rms_ctx c = { malloc(n * sizeof(real)), malloc(RMS_BT * sizeof(real)),
                       rand_buf(n, 1, &s), rand_buf(RMS_C, 1, &s), rand_buf(n, 1, &s) };
  real *dx = filled(n, GARBAGE), *base = rand_buf(RMS_C, 1, &s);
  real *dg = malloc(RMS_C * sizeof(real));
  memcpy(dg, base, RMS_C * sizeof(real));
  rms_objective(&c);
  rmsnorm_backward(dx, dg, c.R, c.x, c.g, c.rstd, RMS_BT, RMS_C);
  check_grad("rmsnorm dinp", c.x, n, dx, NULL, rms_objective, &c);
  check_grad("rmsnorm dweight", c.g, RMS_C, dg, base, rms_objective, &c);
  /* dinp may equal dout: each row reads dout before it writes dinp, the same operations in
   * the same order, so bitwise the same. */
  real *inplace = malloc(n * sizeof(real));
  memcpy(inplace, c.R, n * sizeof(real));
  memcpy(dg, base, RMS_C * sizeof(real));
  rmsnorm_backward(inplace, dg, inplace, c.x, c.g, c.rstd, RMS_BT, RMS_C);
  CHECK(memcmp(inplace, dx, n * sizeof(real)) == 0);
  free(c.out); free(c.rstd); free(c.x); free(c.g); free(c.R);
  free(dx); free(base); free(dg); free(inplace);
}

/* ---- linear ---- */
enum { LIN_BT = 6, LIN_IC = 5, LIN_OC = 7 };
struct lin_ctx { real *out, *x, *w, *R; };
static double lin_objective(void *p)
{
  struct lin_ctx *c = p;
  linear_forward(c->out, c->x, c->w, LIN_BT, LIN_IC, LIN_OC);
  return dot(c->out, c->R, LIN_BT * LIN_OC);
}

static void linear_backward_matches_finite_differences(void)
{
  const size_t nx = LIN_BT * LIN_IC, nw = LIN_OC * LIN_IC;
  uint32_t s = 13;
  struct lin_ctx c = { malloc(LIN_BT * LIN_OC * sizeof(real)), rand_buf(nx, 1, &s),
                       rand_buf(nw, 1, &s), rand_buf(LIN_BT * LIN_OC, 1, &s) };
  real *dx = filled(nx, GARBAGE), *base = rand_buf(nw, 1, &s), *dw = malloc(nw * sizeof(real));
  memcpy(dw, base, nw * sizeof(real));
  lin_objective(&c);
  linear_backward(dx, dw, c.R, c.x, c.w, LIN_BT, LIN_IC, LIN_OC);
  check_grad("linear dinp", c.x, nx, dx, NULL, lin_objective, &c);
  check_grad("linear dweight", c.w, nw, dw, base, lin_objective, &c);
  /* dinp NULL: only dweight, bitwise the same values (the same gemm call on the same data). */
  real *dw2 = malloc(nw * sizeof(real));
  memcpy(dw2, base, nw * sizeof(real));
  linear_backward(NULL, dw2, c.R, c.x, c.w, LIN_BT, LIN_IC, LIN_OC);
  CHECK(memcmp(dw, dw2, nw * sizeof(real)) == 0);
  free(c.out); free(c.x); free(c.w); free(c.R); free(dx); free(base); free(dw); free(dw2);
}

/* ---- RoPE ---- */
enum { ROPE_B = 2, ROPE_T = 5, ROPE_NHX = 3, ROPE_HS = 8 };
#define ROPE_N (ROPE_B * ROPE_T * ROPE_NHX * ROPE_HS)
struct rope_ctx { real *out, *x, *cos_t, *sin_t, *R; };
static double rope_objective(void *p)
{
  struct rope_ctx *c = p;
  rope_forward(c->out, c->x, c->cos_t, c->sin_t, ROPE_B, ROPE_T, ROPE_NHX, ROPE_HS);
  return dot(c->out, c->R, ROPE_N);
}

static void rope_backward_matches_finite_differences(void)
{
  uint32_t s = 14;
  real cos_t[ROPE_T * ROPE_HS / 2], sin_t[ROPE_T * ROPE_HS / 2];
  rope_table(cos_t, sin_t, ROPE_T, ROPE_HS, 10.0, 3); /* small theta: every pair turns */
  struct rope_ctx c = { malloc(ROPE_N * sizeof(real)), rand_buf(ROPE_N, 1, &s), cos_t, sin_t,
                        rand_buf(ROPE_N, 1, &s) };
  real *dx = filled(ROPE_N, GARBAGE);
  rope_backward(dx, c.R, cos_t, sin_t, ROPE_B, ROPE_T, ROPE_NHX, ROPE_HS);
  check_grad("rope dinp", c.x, ROPE_N, dx, NULL, rope_objective, &c);
  real *inplace = malloc(ROPE_N * sizeof(real));
  memcpy(inplace, c.R, ROPE_N * sizeof(real));
  rope_backward(inplace, inplace, cos_t, sin_t, ROPE_B, ROPE_T, ROPE_NHX, ROPE_HS);
  CHECK(memcmp(inplace, dx, ROPE_N * sizeof(real)) == 0); /* in place: the same operations */
  free(c.out); free(c.x); free(c.R); free(dx); free(inplace);
}

/* ---- attention ---- */
struct attn_ctx {
  int B, T, NH, NKV, HS;
  real *out, *lse, *scratch, *q, *k, *v, *R;
  const struct attention_dropout *drop;
};
static double attn_objective(void *p)
{
  struct attn_ctx *c = p;
  attention_forward(c->out, c->lse, c->scratch, c->q, c->k, c->v, c->drop, c->B, c->T, c->NH,
                    c->NKV, c->HS);
  return dot(c->out, c->R, (size_t)c->B * c->T * c->NH * c->HS);
}

/* T 5: one block; T 70: two query blocks, the second's rows against two key blocks. The
 * backward recomputes the scores and the dropout from q, k and Philox: the forward's out and
 * lse are all it keeps. */
static void check_attention_grad(int NH, int NKV, int use_mask, int T)
{
  const int B = 2, HS = 4;
  const size_t nq = (size_t)B * T * NH * HS, nkv = (size_t)B * T * NKV * HS;
  const uint32_t samples[2] = { 2, 9 };
  const struct attention_dropout drop = { 0.3f, 77, 1, 3, 0, samples };
  uint32_t s = 15 + NKV + 10 * use_mask;
  struct attn_ctx c = { B, T, NH, NKV, HS, malloc(nq * sizeof(real)),
                        malloc((size_t)B * NH * T * sizeof(real)),
                        malloc(attention_scratch_n_elems(B, T, NH, NKV, HS) * sizeof(real)),
                        rand_buf(nq, 2, &s), rand_buf(nkv, 2, &s), rand_buf(nkv, 1, &s),
                        rand_buf(nq, 1, &s), use_mask ? &drop : NULL };
  real *dq = filled(nq, GARBAGE), *dk = filled(nkv, GARBAGE), *dv = filled(nkv, GARBAGE);
  attn_objective(&c);
  attention_backward(dq, dk, dv, c.scratch, c.R, c.q, c.k, c.v, c.out, c.lse, c.drop, B, T, NH,
                     NKV, HS);
  char name[64];
  snprintf(name, sizeof name, "NH %d NKV %d mask %d: dq", NH, NKV, use_mask);
  check_grad(name, c.q, nq, dq, NULL, attn_objective, &c);
  snprintf(name, sizeof name, "NH %d NKV %d mask %d: dk", NH, NKV, use_mask);
  check_grad(name, c.k, nkv, dk, NULL, attn_objective, &c);
  snprintf(name, sizeof name, "NH %d NKV %d mask %d: dv", NH, NKV, use_mask);
  check_grad(name, c.v, nkv, dv, NULL, attn_objective, &c);
  free(c.out); free(c.lse); free(c.scratch); free(c.q); free(c.k); free(c.v);
  free(c.R); free(dq); free(dk); free(dv);
}

static void attention_backward_gqa_matches_finite_differences(void)
{
  check_attention_grad(4, 2, 0, 5);
  check_attention_grad(4, 2, 0, 70);
}

static void attention_backward_gqa_with_dropout_matches_finite_differences(void)
{
  check_attention_grad(4, 2, 1, 5);
  check_attention_grad(4, 2, 1, 70);
}

static void attention_backward_mha_and_mqa_match_finite_differences(void)
{
  check_attention_grad(4, 4, 0, 5);
  check_attention_grad(4, 1, 1, 5);
}

/* ---- SwiGLU and dropout ---- */
enum { PW_N = 40 };
struct pw_ctx { real *out, *a, *b, *R; int dropout; };
static double pw_objective(void *p)
{
  struct pw_ctx *c = p;
  if (c->dropout) dropout_forward(c->out, c->a, c->b, PW_N);
  else swiglu_forward(c->out, c->a, c->b, PW_N);
  return dot(c->out, c->R, PW_N);
}

static void swiglu_backward_matches_finite_differences(void)
{
  uint32_t s = 16;
  struct pw_ctx c = { malloc(PW_N * sizeof(real)), rand_buf(PW_N, 4, &s), rand_buf(PW_N, 1, &s),
                      rand_buf(PW_N, 1, &s), 0 };
  real *dgate = filled(PW_N, GARBAGE), *dup = filled(PW_N, GARBAGE);
  swiglu_backward(dgate, dup, c.R, c.a, c.b, PW_N);
  check_grad("swiglu dgate", c.a, PW_N, dgate, NULL, pw_objective, &c);
  check_grad("swiglu dup", c.b, PW_N, dup, NULL, pw_objective, &c);
  free(c.out); free(c.a); free(c.b); free(c.R); free(dgate); free(dup);
}

static void dropout_backward_matches_finite_differences(void)
{
  uint32_t s = 17;
  struct pw_ctx c = { malloc(PW_N * sizeof(real)), rand_buf(PW_N, 1, &s),
                      malloc(PW_N * sizeof(real)), rand_buf(PW_N, 1, &s), 1 };
  dropout_mask(c.b, PW_N, 0.5f, 3, 0, 0, 0, 0);
  real *dx = filled(PW_N, GARBAGE);
  dropout_backward(dx, c.R, c.b, PW_N);
  check_grad("dropout dinp", c.a, PW_N, dx, NULL, pw_objective, &c);
  free(c.out); free(c.a); free(c.b); free(c.R); free(dx);
}

/* ---- cross-entropy ---- */
enum { CE_BT = 6, CE_V = 7, CE_VP = 9 };
struct ce_ctx { real *losses, *probs, *logits; const int *targets; real scale; };
static double ce_objective(void *p)
{
  struct ce_ctx *c = p;
  crossentropy_forward(c->losses, c->probs, c->logits, c->targets, CE_BT, CE_V, CE_VP);
  double total = 0.0;
  for (int i = 0; i < CE_BT; i++) total += (double)c->scale * c->losses[i];
  return total;
}

static void crossentropy_backward_matches_finite_differences(void)
{
  /* Targets include −1 (no loss) and V − 1; columns V..Vp−1 are padding: their finite
   * differences are 0 and so must the gradient be. */
  static const int targets[CE_BT] = { 3, -1, 0, 6, 6, 2 };
  const size_t n = CE_BT * CE_VP;
  uint32_t s = 18;
  struct ce_ctx c = { malloc(CE_BT * sizeof(real)), malloc(n * sizeof(real)),
                      rand_buf(n, 3, &s), targets, 1.0f / 5 };
  real *dlogits = filled(n, GARBAGE);
  ce_objective(&c);
  CHECK(c.losses[1] == 0.0f);
  crossentropy_backward(dlogits, c.probs, targets, c.scale, CE_BT, CE_V, CE_VP);
  check_grad("dlogits", c.logits, n, dlogits, NULL, ce_objective, &c);
  int zero_where_expected = 1;
  for (int i = 0; i < CE_VP; i++) zero_where_expected &= dlogits[1 * CE_VP + i] == 0.0f;
  for (int bt = 0; bt < CE_BT; bt++)
    for (int i = CE_V; i < CE_VP; i++) zero_where_expected &= dlogits[bt * CE_VP + i] == 0.0f;
  CHECK(zero_where_expected); /* exactly 0: written as 0, never computed */
  /* dlogits may equal probs: element-wise, the same operations, so bitwise the same. */
  crossentropy_backward(c.probs, c.probs, targets, c.scale, CE_BT, CE_V, CE_VP);
  CHECK(memcmp(c.probs, dlogits, n * sizeof(real)) == 0);
  free(c.losses); free(c.probs); free(c.logits); free(dlogits);
}

TEST_MAIN(TEST(encoder_backward_matches_finite_differences),
          TEST(rmsnorm_backward_matches_finite_differences),
          TEST(linear_backward_matches_finite_differences),
          TEST(rope_backward_matches_finite_differences),
          TEST(attention_backward_gqa_matches_finite_differences),
          TEST(attention_backward_gqa_with_dropout_matches_finite_differences),
          TEST(attention_backward_mha_and_mqa_match_finite_differences),
          TEST(swiglu_backward_matches_finite_differences),
          TEST(dropout_backward_matches_finite_differences),
          TEST(crossentropy_backward_matches_finite_differences))
