/* Generation (runtime/model/generate.h): the key/value-cache forward gives, at every position, the
 * logits of the training forward over the whole sequence (the prompt as one block, then one token
 * at a time, with grouped-query heads and a tied and an untied head, and through sparse layers
 * with every assignment kept); the sampler is greedy at
 * temperature 0 with ties to the lowest id, and otherwise draws from softmax(logits / T) cut by
 * top-k and then top-p (the smallest most probable prefix reaching p) in the stated proportions,
 * a function of (seed, position) alone. */
#include "check.h"
#include "runtime/model/alloc.h"
#include "runtime/model/generate.h"
#include "runtime/model/model.h"
#include "runtime_fixture.h"

#include <math.h>
#include <stdlib.h>

static char err[512];

/* Each logit of the cached forward against the full forward's at the same position. Both run the
 * same kernels on the same weights; they differ in the order of sums only: the attention's
 * (two passes over the cache against the kernel's online softmax over key blocks) and the
 * products' blocking on 1 row against T rows. A logit is the end of 2 layers of sums of at most
 * max(C, F) = 64 terms each, so some 4·64 roundings of REAL_U apart on each side, relative to the
 * largest logit (the terms are of its size or smaller, and RMSNorm rescales each layer's input):
 * 1024·REAL_U·max|logit| bounds the difference (6e-5 relative in fp32). */
static void cache_equals_full_forward(int tied)
{
  struct plan p;
  fixture_plan(&p, (struct fixture_shape){ 2, 32, 4, 2, 64, 64, 16, 2, 2 });
  p.model.tie_embeddings = tied;
  struct model m;
  CHECK(model_create(&m, &p.model, err, sizeof err) == 0);
  CHECK(model_init(&m, 5, err, sizeof err) == 0);
  /* larger weights than the init's 0.02, so that the attention is far from uniform */
  for (size_t i = 0; i < m.n_elems; i++) m.param_memory[i] *= 20;
  const int T = 12, P = 5, Vp = m.config.vocab_padded;
  int tokens[12] = { 3, 17, 42, 5, 9, 60, 1, 33, 33, 7, 0, 63 };
  struct gen_cache c;
  struct model_acts a;
  CHECK(gen_cache_open(&c, &m, T, P, err, sizeof err) == 0);
  CHECK(model_acts_create(&a, &m, 1, T, err, sizeof err) == 0);
  real *full = malloc((size_t)Vp * sizeof *full);
  double worst = 0;
  for (int t = P; t <= T; t++) {
    if (t == P)
      gen_forward(&c, tokens, P);
    else
      gen_forward(&c, &tokens[t - 1], 1);
    CHECK(c.n == t);
    gen_forward_full(&m, &a, tokens, t, full);
    double mx = 0, d = 0;
    for (int v = 0; v < m.config.vocab; v++) {
      mx = fmax(mx, fabs((double)full[v]));
      d = fmax(d, fabs((double)full[v] - (double)c.logits[v]));
    }
    CHECK(mx > 0.1); /* logits of some size: the comparison means something */
    CHECK_MSG(d <= 1024 * REAL_U * mx, "position %d: %.3g apart, largest logit %.3g", t, d, mx);
    worst = fmax(worst, d / mx);
  }
  printf("  %s head: the cache's logits within %.2g of the full forward's (relative)\n",
         tied ? "tied" : "untied", worst);
  free(full);
  model_acts_free(&a);
  gen_cache_close(&c);
  model_free(&m);
}

static void cache_equals_full_forward_untied(void) { cache_equals_full_forward(0); }
static void cache_equals_full_forward_tied(void) { cache_equals_full_forward(1); }

/* The same on a mixture of experts: layers 0 and 2 of 3 sparse (4 experts of width 48, top 2),
 * layer 1 dense, so the experts' outputs reach the next layers' cached keys and values. The
 * capacity factor 0.5 keeps at most ceil(0.5 · t · 2 / 4) of a sequence's t·2 assignments per
 * expert, so the training forward over the sequence drops some, and a token's output there
 * depends on the tokens after it; generation keeps every assignment (gen_forward, and the full
 * forward on gen_full_model's copy), and the two agree to the same bound as the dense model's
 * (3 layers of sums of at most 64 terms: 1536·REAL_U). The plan's capacity applied to the full
 * forward gives other logits: the copy's rule is not idle. */
static void cache_equals_full_forward_moe(void)
{
  struct plan p;
  fixture_plan(&p, (struct fixture_shape){ 3, 32, 4, 2, 64, 64, 16, 2, 2 });
  p.model.moe = (struct plan_moe){ .experts = 4, .top_k = 2, .ffn_dim = 48, .capacity_factor = 0.5, .n_layers = 2 };
  const uint8_t sparse[3] = { 1, 0, 1 };
  struct model m, full;
  CHECK(model_create_table_sparse(&m, &p.model, sparse, err, sizeof err) == 0);
  m.param_memory = alloc_reals_on(m.device, ALLOC_PARAMS, m.n_elems);
  m.grad_memory = alloc_reals_on(m.device, ALLOC_GRADS, m.n_elems);
  CHECK(m.param_memory && m.grad_memory);
  model_bind_memory(&m, m.param_memory, m.grad_memory);
  CHECK(model_init(&m, 5, err, sizeof err) == 0);
  for (size_t i = 0; i < m.n_elems; i++) m.param_memory[i] *= 20;
  const int T = 12, P = 5, Vp = m.config.vocab_padded;
  int tokens[12] = { 3, 17, 42, 5, 9, 60, 1, 33, 33, 7, 0, 63 };
  struct gen_cache c;
  struct model_acts a, capped;
  CHECK(gen_cache_open(&c, &m, T, P, err, sizeof err) == 0);
  gen_full_model(&full, &m);
  CHECK(full.config.moe.capacity_factor == 0 && m.config.moe.capacity_factor == 0.5);
  CHECK(model_acts_create(&a, &full, 1, T, err, sizeof err) == 0);
  CHECK(model_acts_create(&capped, &m, 1, T, err, sizeof err) == 0);
  real *want = malloc((size_t)Vp * sizeof *want), *drop = malloc((size_t)Vp * sizeof *drop);
  double worst = 0, dropped = 0;
  for (int t = P; t <= T; t++) {
    gen_forward(&c, t == P ? tokens : &tokens[t - 1], t == P ? P : 1);
    CHECK(c.n == t);
    gen_forward_full(&full, &a, tokens, t, want);
    gen_forward_full(&m, &capped, tokens, t, drop);
    double mx = 0, d = 0, dd = 0;
    for (int v = 0; v < m.config.vocab; v++) {
      mx = fmax(mx, fabs((double)want[v]));
      d = fmax(d, fabs((double)want[v] - (double)c.logits[v]));
      dd = fmax(dd, fabs((double)want[v] - (double)drop[v]));
    }
    CHECK(mx > 0.1);
    CHECK_MSG(d <= 1536 * REAL_U * mx, "position %d: %.3g apart, largest logit %.3g", t, d, mx);
    worst = fmax(worst, d / mx);
    dropped = fmax(dropped, dd / mx);
  }
  CHECK_MSG(dropped > 1e-2, "the plan's capacity changed the logits by %.3g only", dropped);
  printf("  mixture of experts: the cache's logits within %.2g of the dropless full forward's (relative); "
         "the plan's capacity moves them by %.2g\n", worst, dropped);
  free(want);
  free(drop);
  model_acts_free(&a);
  model_acts_free(&capped);
  gen_cache_close(&c);
  model_free(&m);
}

static void greedy_takes_the_lowest_id_on_ties(void)
{
  const real logits[5] = { 1, 3, 3, 0, 3 };
  struct gen_sampling s = { 0, 0, 1, 0 };
  double work[16];
  CHECK(gen_sample(logits, 5, &s, 0, work) == 1);
  s.temperature = 1;
  s.top_k = 1; /* top-k of 1 keeps the first of the most probable: greedy's */
  for (int pos = 0; pos < 100; pos++) CHECK(gen_sample(logits, 5, &s, pos, work) == 1);
}

/* Draws at positions 0 .. n−1 into counts. */
static void tally(const real *logits, int V, const struct gen_sampling *s, int n, int *counts)
{
  double work[64];
  for (int v = 0; v < V; v++) counts[v] = 0;
  for (int pos = 0; pos < n; pos++) counts[gen_sample(logits, V, s, pos, work)]++;
}

/* Each frequency within 5 standard deviations of its probability (n draws: sqrt(q(1 − q)/n)),
 * which a correct sampler misses with probability below 1e-5 per check; the draws are a fixed
 * function of the seed, so the test never flakes. A token outside the kept set never comes. */
static void frequencies(const int *counts, const double *want, int V, int n)
{
  for (int v = 0; v < V; v++) {
    const double f = (double)counts[v] / n, sd = sqrt(want[v] * (1 - want[v]) / n);
    if (want[v] == 0)
      CHECK_MSG(counts[v] == 0, "token %d drawn %d times", v, counts[v]);
    else
      CHECK_MSG(fabs(f - want[v]) <= 5 * sd, "token %d: %.4f drawn, %.4f expected", v, f, want[v]);
  }
}

static void sampling_follows_temperature_top_k_and_top_p(void)
{
  const double q[4] = { 0.4, 0.3, 0.2, 0.1 };
  real logits[4];
  for (int v = 0; v < 4; v++) logits[v] = (real)log(q[v]);
  const int n = 40000;
  int counts[4];
  struct gen_sampling s = { 1, 0, 1, 99 };
  tally(logits, 4, &s, n, counts);
  frequencies(counts, q, 4, n);
  s.temperature = 2; /* q^(1/2), renormalised */
  double z = 0, w[4];
  for (int v = 0; v < 4; v++) z += sqrt(q[v]);
  for (int v = 0; v < 4; v++) w[v] = sqrt(q[v]) / z;
  tally(logits, 4, &s, n, counts);
  frequencies(counts, w, 4, n);
  s.temperature = 1;
  s.top_k = 3;
  const double k3[4] = { 0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0 };
  tally(logits, 4, &s, n, counts);
  frequencies(counts, k3, 4, n);
  s.top_k = 0;
  s.top_p = 0.5; /* 0.4 < 0.5 ≤ 0.7: the two most probable */
  const double p5[4] = { 0.4 / 0.7, 0.3 / 0.7, 0, 0 };
  tally(logits, 4, &s, n, counts);
  frequencies(counts, p5, 4, n);
  s.top_k = 3;
  s.top_p = 0.8; /* of the top 3 renormalised (0.44, 0.33, 0.22): 0.78 < 0.8, so all three */
  tally(logits, 4, &s, n, counts);
  frequencies(counts, k3, 4, n);
  s.top_p = 0.75; /* 0.44 + 0.33 = 0.78 ≥ 0.75: the two */
  tally(logits, 4, &s, n, counts);
  frequencies(counts, p5, 4, n);
}

static void draws_are_a_function_of_seed_and_position(void)
{
  real logits[16];
  for (int v = 0; v < 16; v++) logits[v] = (real)(0.1 * v);
  double work[64];
  struct gen_sampling a = { 1, 0, 1, 7 }, b = a, c = a;
  c.seed = 8;
  int differ = 0;
  for (int pos = 0; pos < 64; pos++) {
    const int x = gen_sample(logits, 16, &a, pos, work);
    CHECK(x == gen_sample(logits, 16, &b, pos, work));
    differ += x != gen_sample(logits, 16, &c, pos, work);
  }
  CHECK(differ > 16); /* another seed, other draws (equal ones by chance at about 1 in 10) */
}

TEST_MAIN(TEST(cache_equals_full_forward_untied),
          TEST(cache_equals_full_forward_tied),
          TEST(cache_equals_full_forward_moe),
          TEST(greedy_takes_the_lowest_id_on_ties),
          TEST(sampling_follows_temperature_top_k_and_top_p),
          TEST(draws_are_a_function_of_seed_and_position))
