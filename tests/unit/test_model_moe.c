/* A model whose layers are sparse (model.moe) against central finite differences of the whole
 * training objective: the mean cross-entropy + aux_loss · the mean over sequences of each
 * sparse layer's load-balancing loss + z_loss · the mean over tokens of its logsumexp², as
 * docs/moe.md states it. A tiny Llama (2 layers, dim 16, 4 heads over 2 KV heads, vocab 20,
 * T 6, B 2) with 4 experts of width 12, top-2, dropless and at capacity factor 1 (3 rows per
 * expert and sequence: some assignments drop), with and without dropout. Routing is piecewise
 * constant in the parameters: a sample whose perturbation changes any routing decision is
 * skipped (and counted; most samples must be checked). Also: the routing statistics the
 * forward records, and the tensors' Hugging Face Mixtral names. */
#include "check.h"
#include "philox.h"
#include "runtime/model/model.h"

#include <math.h>
#include <stdlib.h>

static char err[512];

enum { B = 2, T = 6, E = 4, K = 2, FE = 12, SAMPLES_PER_TENSOR = 5 };

static struct plan_model moe_config(double dropout, double capacity_factor)
{
  struct plan_model c;
  memset(&c, 0, sizeof c);
  c.n_layers = 2;
  c.dim = 16;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 32;
  c.vocab = 20;
  c.max_seq = T;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.dropout = dropout;
  c.moe.experts = E;
  c.moe.top_k = K;
  c.moe.ffn_dim = FE;
  c.moe.aux_loss = 0.05;
  c.moe.z_loss = 0.01;
  c.moe.capacity_factor = capacity_factor;
  return c;
}

static void randomize(struct model *m)
{
  for (int i = 0; i < m->n_params; i++) {
    struct model_param *p = &m->params[i];
    size_t n = p->n_dims == 2 ? (size_t)p->shape[0] * (size_t)p->shape[1] : p->n_elems;
    for (size_t e = 0; e < n; e++) {
      real z = philox_normal(99, (uint32_t)i, 7, e);
      p->data[e] = p->n_dims == 2 ? (p->kind == MODEL_ROUTER ? 1.0f : 0.3f) * z : 1.0f + 0.2f * z;
    }
  }
}

struct problem {
  int tokens[B * T], targets[B * T];
  uint64_t samples[B];
  struct model_dropout dropout;
};

/* The objective, and the routing of every sparse layer (topi and slot) in `routing`. */
static double objective(struct model *m, struct model_acts *a, const struct problem *pr, int *routing)
{
  model_moe_stats_reset(m);
  double ce = model_forward(m, a, pr->tokens, pr->targets, &pr->dropout, B, T) / (B * T);
  double j = ce;
  for (int l = 0; l < m->config.n_layers; l++) {
    if (!m->moe[l])
      continue;
    j += m->config.moe.aux_loss * m->moe_stat[l].aux / B + m->config.moe.z_loss * m->moe_stat[l].z / (B * T);
    memcpy(routing, a->layers[l].moe_topi, sizeof(int) * B * T * K);
    memcpy(routing + B * T * K, a->layers[l].moe_slot, sizeof(int) * B * T * K);
    routing += 2 * B * T * K;
  }
  return j;
}

/* Tolerances as test_model_grad.c argues them (L ≈ 3, weights ~0.3). */
#define FD_H TOL(3e-3f, 3e-6)
static double tolerance(double fd)
{
  return TOL(1e-4 + 1e-2 * fabs(fd), 2e-9 + 1e-8 * fabs(fd));
}

static int check_gradients(double dropout, double cf, const char *what, long long *dropped_out)
{
  struct plan_model c = moe_config(dropout, cf);
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
  const size_t rsize = (size_t)2 * B * T * K * c.n_layers;
  int *r0 = malloc(rsize * sizeof(int)), *r1 = malloc(rsize * sizeof(int));

  model_zero_grads(&m);
  double j0 = objective(&m, &a, &pr, r0);
  long long dropped = 0;
  for (int l = 0; l < c.n_layers; l++) dropped += m.moe_stat[l].dropped;
  *dropped_out = dropped;
  model_backward(&m, &a, (real)1 / (B * T));
  CHECK(isfinite(j0) && j0 > 0.5);

  const real h = FD_H;
  int n_bad = 0, n_checked = 0, n_skipped = 0;
  double worst = 0.0;
  for (int i = 0; i < m.n_params; i++) {
    struct model_param *p = &m.params[i];
    size_t n_logical = p->n_dims == 2 ? (size_t)p->shape[0] * (size_t)p->shape[1] : p->n_elems;
    for (int s = 0; s < SAMPLES_PER_TENSOR; s++) {
      size_t e;
      if (p->kind == MODEL_EMBED && s < 3)
        e = (size_t)pr.tokens[(s * 5) % (B * T)] * c.dim + (size_t)(s * 3) % c.dim;
      else
        e = (size_t)(philox_uniform(8, (uint32_t)i, (uint32_t)s, 0, 0) * (real)n_logical);
      real saved = p->data[e];
      p->data[e] = saved + h;
      double up = objective(&m, &a, &pr, r1);
      int same = memcmp(r0, r1, rsize * sizeof(int)) == 0;
      p->data[e] = saved - h;
      double down = objective(&m, &a, &pr, r1);
      same = same && memcmp(r0, r1, rsize * sizeof(int)) == 0;
      p->data[e] = saved;
      if (!same) { /* a routing decision flipped inside the step: not differentiable here */
        n_skipped++;
        continue;
      }
      double fd = (up - down) / (2.0 * h), g = p->grad[e];
      double tol = tolerance(fd);
      double excess = fabs(fd - g) / tol;
      worst = excess > worst ? excess : worst;
      n_checked++;
      if (!(fabs(fd - g) <= tol)) {
        n_bad++;
        fprintf(stderr, "%s: %s[%zu]: backward %.6g, finite differences %.6g\n", what, p->name, e, g, fd);
      }
    }
  }
  printf("%s: %d elements of %d tensors checked (%d skipped: routing flipped), %lld assignments "
         "dropped, worst |error|/tolerance %.3f\n", what, n_checked, m.n_params, n_skipped, dropped, worst);
  CHECK(n_skipped * 10 <= n_checked);
  free(r0);
  free(r1);
  model_acts_free(&a);
  model_free(&m);
  return n_bad;
}

static void dropless_backward_matches_finite_differences(void)
{
  long long dropped = -1;
  CHECK(check_gradients(0.0, 0.0, "dropless", &dropped) == 0);
  CHECK(dropped == 0);
}

static void backward_at_capacity_matches_finite_differences(void)
{
  long long dropped = 0;
  CHECK(check_gradients(0.0, 1.0, "capacity factor 1", &dropped) == 0);
  CHECK(dropped > 0); /* the case really drops */
}

static void backward_with_dropout_matches_finite_differences(void)
{
  long long dropped = 0;
  CHECK(check_gradients(0.2, 1.0, "capacity factor 1, dropout 0.2", &dropped) == 0);
}

/* The forward's statistics: every assignment routed once; the kept rows are the dispatched rows;
 * aux per sequence is E · Σ f·P, so its mean lies in [K·(1/E)·E/E.., E·K] — checked against the
 * statistics computed here from the saved probabilities and choices. Names are Mixtral's. */
static void statistics_and_names(void)
{
  struct plan_model c = moe_config(0.0, 1.0);
  struct model m;
  struct model_acts a;
  CHECK(model_create(&m, &c, err, sizeof err) == 0);
  CHECK(model_acts_create(&a, &m, B, T, err, sizeof err) == 0);
  randomize(&m);
  int tokens[B * T], targets[B * T];
  for (int i = 0; i < B * T; i++) tokens[i] = targets[(i + 1) % (B * T)] = (i * 7) % c.vocab;
  model_moe_stats_reset(&m);
  model_forward(&m, &a, tokens, targets, NULL, B, T);
  for (int l = 0; l < c.n_layers; l++) {
    const struct model_moe_stat *s = &m.moe_stat[l];
    const struct model_layer_acts *la = &a.layers[l];
    long long routed = 0, kept = 0;
    for (int e = 0; e < E; e++) {
      routed += s->routed[e];
      kept += la->moe_counts[e];
      CHECK(la->moe_counts[e] <= B * 3); /* capacity 3 per sequence */
    }
    CHECK(routed == (long long)B * T * K && s->assigned == routed);
    CHECK(s->dropped == routed - kept);
    double aux = 0;
    for (int g = 0; g < B; g++) {
      double f[E] = { 0 }, P[E] = { 0 };
      for (int t = g * T; t < (g + 1) * T; t++) {
        for (int k = 0; k < K; k++) f[la->moe_topi[t * K + k]] += 1.0 / T;
        for (int e = 0; e < E; e++) P[e] += la->moe_probs[t * E + e] / T;
      }
      for (int e = 0; e < E; e++) aux += E * f[e] * P[e];
    }
    CHECK_NEAR(s->aux, aux, TOL(1e-5, 1e-12));
    CHECK(s->sequences == B && s->tokens == B * T);
  }
  CHECK(model_find(&m, "model.layers.1.block_sparse_moe.gate.weight") != NULL);
  const struct model_param *w2 = model_find(&m, "model.layers.0.block_sparse_moe.experts.3.w2.weight");
  CHECK(w2 && w2->shape[0] == c.dim && w2->shape[1] == FE && w2->expert == 3);
  CHECK(model_find(&m, "model.layers.0.mlp.up_proj.weight") == NULL);
  /* parameters: per layer attention 4·16·... + router E·C + experts E·3·C·Fe */
  long long dense = model_n_params(&m) - (long long)c.n_layers * (E * c.dim + E * 3LL * c.dim * FE);
  CHECK(dense == 20LL * 16 * 2 + 16 + 2 * (16 * 16 * 2 + 16 * 8 * 2 + 2 * 16));
  model_acts_free(&a);
  model_free(&m);
}

TEST_MAIN(TEST(dropless_backward_matches_finite_differences),
          TEST(backward_at_capacity_matches_finite_differences),
          TEST(backward_with_dropout_matches_finite_differences),
          TEST(statistics_and_names))
