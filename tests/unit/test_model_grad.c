/* The whole model's backward against central finite differences of its forward: a tiny Llama
 * (2 layers, dim 16, 4 heads over 2 KV heads, ffn 32, vocab 20, T 6, B 2), elements sampled
 * from every parameter tensor, without dropout, with dropout (masks are a function of step and
 * sample, so the loss is a fixed function of the parameters and finite differences hold), and
 * with a tied, padded vocabulary (the head's gradient adds into the embedding; padding rows get
 * none). Parameters are drawn larger than the 0.02 init so every path carries gradient. */
#include "check.h"
#include "philox.h"
#include "runtime/model/model.h"

#include <math.h>
#include <stdlib.h>

static char err[512];

enum { B = 2, T = 6, SAMPLES_PER_TENSOR = 6 };

static struct plan_model tiny_config(double dropout, int tie, int vocab_padded)
{
  struct plan_model c;
  memset(&c, 0, sizeof c);
  c.n_layers = 2;
  c.dim = 16;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 32;
  c.vocab = 20;
  c.vocab_padded = vocab_padded;
  c.max_seq = T;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.dropout = dropout;
  c.tie_embeddings = tie;
  return c;
}

/* Weights ~ N(0, 0.3²), gains ~ 1 + N(0, 0.2²); padding rows stay 0. */
static void randomize(struct model *m)
{
  for (int i = 0; i < m->n_params; i++) {
    struct model_param *p = &m->params[i];
    size_t n = p->n_dims == 2 ? (size_t)p->shape[0] * (size_t)p->shape[1] : p->n_elems;
    for (size_t e = 0; e < n; e++) {
      real z = philox_normal(99, (uint32_t)i, 7, e);
      p->data[e] = p->n_dims == 2 ? 0.3f * z : 1.0f + 0.2f * z;
    }
  }
}

/* Central differences of the mean loss (L ≈ 3): truncation (h² / 6) · L''' (L''' reaches ~200
 * here, weights ~0.3), rounding ≈ k · u · L / (2h), k a few roundings of the loss that do not
 * cancel between L+ and L−.
 *   fp32, h = 3e-3: rounding 6e-8 · 3 / 6e-3 · k ≈ 3e-5 · k, truncation 1.5e-6 · L''' (1e-4 on
 *     the largest gradients); bound 1e-4 + 1e-2 · |fd|. Seen: up to 6.5e-5 where |fd| < 0.01,
 *     0.46 of the bound at worst.
 *   float64, h = 3e-6 (near the optimum (3 k u L / L''')^(1/3)): truncation 1.5e-12 · 200 =
 *     3e-10, rounding 1.1e-16 · 3 / 6e-6 · k ≈ 5e-11 · k; bound 2e-9 + 1e-8 · |fd|. Seen: 4.2e-10,
 *     0.11 of the bound at worst.
 * A wrong term is the size of a gradient (1e-3..1): a_corrupted_gradient_is_detected shows 5%
 * off is refused. */
#define FD_H TOL(3e-3f, 3e-6)
static double tolerance(double fd)
{
  return TOL(1e-4 + 1e-2 * fabs(fd), 2e-9 + 1e-8 * fabs(fd));
}

struct problem {
  int tokens[B * T], targets[B * T];
  uint64_t samples[B];
  struct model_dropout dropout;
};

static double loss_of(const struct model *m, struct model_acts *a, const struct problem *pr)
{
  return model_forward(m, a, pr->tokens, pr->targets, &pr->dropout, B, T) / (B * T);
}

/* Returns the number of sampled elements whose gradient disagrees with finite differences. */
static int check_gradients(double dropout, int tie, int vocab_padded, const char *what)
{
  struct plan_model c = tiny_config(dropout, tie, vocab_padded);
  struct model m;
  struct model_acts a;
  CHECK_MSG(model_create(&m, &c, err, sizeof err) == 0, "%s", err);
  CHECK_MSG(model_acts_create(&a, &m, B, T, err, sizeof err) == 0, "%s", err);
  randomize(&m);
  struct problem pr;
  for (int i = 0; i < B * T; i++) {
    pr.tokens[i] = (int)(philox_uniform(5, 1, 0, 0, (uint64_t)i) * c.vocab);
    pr.targets[i] = (int)(philox_uniform(5, 2, 0, 0, (uint64_t)i) * c.vocab);
  }
  pr.samples[0] = 41;
  pr.samples[1] = 7;
  pr.dropout = (struct model_dropout){ (real)dropout, 1234, 3, pr.samples };

  model_zero_grads(&m);
  double loss0 = loss_of(&m, &a, &pr);
  model_backward(&m, &a, (real)1 / (B * T)); /* 1/12 in real, as loss_of divides */
  CHECK(isfinite(loss0) && loss0 > 0.5);

  const real h = FD_H;
  int n_bad = 0, n_checked = 0;
  double worst = 0.0;
  for (int i = 0; i < m.n_params; i++) {
    struct model_param *p = &m.params[i];
    size_t n_logical = p->n_dims == 2 ? (size_t)p->shape[0] * (size_t)p->shape[1] : p->n_elems;
    for (int s = 0; s < SAMPLES_PER_TENSOR; s++) {
      size_t e;
      if (p->kind == MODEL_EMBED && s < 4) /* rows of tokens in the batch carry gradient */
        e = (size_t)pr.tokens[(s * 5) % (B * T)] * c.dim + (size_t)(s * 3) % c.dim;
      else
        e = (size_t)(philox_uniform(8, (uint32_t)i, (uint32_t)s, 0, 0) * (real)n_logical);
      real saved = p->data[e];
      p->data[e] = saved + h;
      double up = loss_of(&m, &a, &pr);
      p->data[e] = saved - h;
      double down = loss_of(&m, &a, &pr);
      p->data[e] = saved;
      double fd = (up - down) / (2.0 * h), g = p->grad[e];
      double tol = tolerance(fd);
      double excess = fabs(fd - g) / tol;
      worst = excess > worst ? excess : worst;
      n_checked++;
      if (!(fabs(fd - g) <= tol)) {
        n_bad++;
        fprintf(stderr, "%s: %s[%zu]: backward %.6g, finite differences %.6g\n", what, p->name,
                e, g, fd);
      }
    }
    /* Padding rows never receive a gradient. */
    for (size_t e = n_logical; e < p->n_elems; e++)
      if (p->grad[e] != 0.0f) {
        n_bad++;
        fprintf(stderr, "%s: %s padding element %zu has gradient %g\n", what, p->name, e, p->grad[e]);
        break;
      }
  }
  printf("%s: %d elements of %d tensors checked, worst |error|/tolerance %.3f\n", what, n_checked,
         m.n_params, worst);
  model_acts_free(&a);
  model_free(&m);
  return n_bad;
}

static void backward_matches_finite_differences_without_dropout(void)
{
  CHECK(check_gradients(0.0, 0, 20, "no dropout") == 0);
}

static void backward_matches_finite_differences_with_dropout(void)
{
  CHECK(check_gradients(0.2, 0, 20, "dropout 0.2") == 0);
}

static void backward_matches_finite_differences_tied_and_padded(void)
{
  CHECK(check_gradients(0.0, 1, 24, "tied, vocab padded to 24") == 0);
}

/* The check can fail: a wrong gradient in one tensor is caught. */
static void a_corrupted_gradient_is_detected(void)
{
  struct plan_model c = tiny_config(0.0, 0, 20);
  struct model m;
  struct model_acts a;
  CHECK(model_create(&m, &c, err, sizeof err) == 0);
  CHECK(model_acts_create(&a, &m, B, T, err, sizeof err) == 0);
  randomize(&m);
  int tokens[B * T], targets[B * T];
  for (int i = 0; i < B * T; i++) tokens[i] = targets[(i + 1) % (B * T)] = i % c.vocab;
  model_zero_grads(&m);
  double l0 = model_forward(&m, &a, tokens, targets, NULL, B, T);
  model_backward(&m, &a, 1.0f);
  /* Dropout with p > 0 but a model without dropout buffers: no masks, the same loss. */
  uint64_t samples[B] = { 1, 2 };
  struct model_dropout d = { 0.5f, 1, 1, samples };
  CHECK(model_forward(&m, &a, tokens, targets, &d, B, T) == l0);
  const real h = FD_H;
  real *w = &m.layers[1].wup[17], saved = *w;
  *w = saved + h;
  double up = model_forward(&m, &a, tokens, targets, NULL, B, T);
  *w = saved - h;
  double down = model_forward(&m, &a, tokens, targets, NULL, B, T);
  *w = saved;
  double fd = (up - down) / (2 * h), g = m.layer_grads[1].wup[17];
  CHECK(fabs(fd - g) <= tolerance(fd));            /* right as computed */
  CHECK(!(fabs(fd - 1.05 * g) <= tolerance(fd)));  /* 5% off is refused */
  model_acts_free(&a);
  model_free(&m);
}

TEST_MAIN(TEST(backward_matches_finite_differences_without_dropout),
          TEST(backward_matches_finite_differences_with_dropout),
          TEST(backward_matches_finite_differences_tied_and_padded),
          TEST(a_corrupted_gradient_is_detected))
