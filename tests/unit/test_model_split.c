/* The split backward (model.h, struct model_split) is the whole backward, bit for bit: two
 * micro-batches of a tiny Llama (2 layers, dim 16, 4 heads over 2 KV heads, ffn 32, vocab 20,
 * T 6, B 2, dropout 0.1) in two sets of saved activations sharing one workspace (as the
 * pipeline's slots do), run once as whole backwards (forward, backward; forward, backward) and
 * once as zero-bubble runs them (forward 0, B 0, forward 1, B 1, then W 0, W 1): every
 * parameter's gradient and each micro-batch's input gradient (the embedding output's) equal to
 * the bit. After the B's alone the linears' weight gradients are still 0 (W computes them) and
 * the held output gradients fill exactly the bytes layout_split_held_elems counts. With no
 * recompute, with recompute = "full" (W recomputes the discarded inputs as B did), and with a
 * tied embedding (its rows and the head's product into one gradient, in the whole's order). */
#include "check.h"
#include "philox.h"
#include "runtime/model/model.h"

#include <stdlib.h>
#include <string.h>

static char err[512];

enum { B = 2, T = 6, N = B * T, L = 2, C = 16, FFN = 32, V = 20, HEADS = 4, KV = 2 };
/* the output gradients B holds per token: q (C), k and v (2 · KV · C / HEADS), o (C), gate and up
 * (2 · FFN), down (C) per layer, and the head's (V): layout_split_held_elems's count */
enum { HELD_PER_TOKEN = L * (C + 2 * KV * (C / HEADS) + C + 2 * FFN + C) + V, PRODUCTS = 7 * L + 1 };

static struct plan_model tiny_config(int tie)
{
  struct plan_model c;
  memset(&c, 0, sizeof c);
  c.n_layers = L;
  c.dim = C;
  c.n_heads = HEADS;
  c.n_kv_heads = KV;
  c.ffn_dim = FFN;
  c.vocab = V;
  c.max_seq = T;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.dropout = 0.1;
  c.tie_embeddings = tie;
  return c;
}

struct run {
  struct model m;
  struct model_acts a[2];    /* a[1] shares a[0]'s workspace and recompute area */
  uint8_t recompute[L];
  int tokens[2][N], targets[2][N];
  uint64_t samples[2][B];
  real *dres[2];             /* each micro-batch's input gradient after its (B or whole) backward */
};

static int run_open(struct run *r, uint8_t recompute, int tie)
{
  memset(r, 0, sizeof *r);
  struct plan_model c = tiny_config(tie);
  if (model_create(&r->m, &c, err, sizeof err))
    return -1;
  for (int l = 0; l < L; l++) r->recompute[l] = recompute;
  r->m.recompute = recompute ? r->recompute : NULL;
  if (model_acts_create(&r->a[0], &r->m, B, T, err, sizeof err) ||
      model_acts_create_slot(&r->a[1], &r->m, &r->a[0], NULL, err, sizeof err))
    return -1;
  for (int i = 0; i < r->m.n_params; i++) {
    struct model_param *p = &r->m.params[i];
    for (size_t e = 0; e < p->n_elems; e++) {
      real z = philox_normal(99, (uint32_t)i, 7, e);
      p->data[e] = p->n_dims == 2 ? 0.3f * z : 1.0f + 0.2f * z;
    }
  }
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < N; i++) {
      r->tokens[k][i] = (int)(philox_uniform(5, 1, (uint32_t)k, 0, (uint64_t)i) * V);
      r->targets[k][i] = (int)(philox_uniform(5, 2, (uint32_t)k, 0, (uint64_t)i) * V);
    }
    r->samples[k][0] = 41 + 2 * (uint64_t)k;
    r->samples[k][1] = 42 + 2 * (uint64_t)k;
    r->dres[k] = calloc(N * C, sizeof(real));
  }
  model_zero_grads(&r->m);
  return 0;
}

static void run_close(struct run *r)
{
  for (int k = 0; k < 2; k++) free(r->dres[k]);
  model_acts_free(&r->a[1]);
  model_acts_free(&r->a[0]);
  r->m.recompute = NULL;
  model_free(&r->m);
}

static double forward(struct run *r, int k)
{
  const struct model_dropout d = { (real)0.1, 1234, 3, r->samples[k] };
  return model_forward(&r->m, &r->a[k], r->tokens[k], r->targets[k], &d, B, T);
}

static void keep_input_gradient(struct run *r, int k)
{
  memcpy(r->dres[k], r->a[k].dresidual, N * C * sizeof(real));
}

/* 1 where every parameter's gradient of x and y is the same bytes. */
static int same_grads(const struct model *x, const struct model *y)
{
  for (int i = 0; i < x->n_params; i++)
    if (memcmp(x->params[i].grad, y->params[i].grad, x->params[i].n_elems * sizeof(real))) {
      fprintf(stderr, "%s: the split backward's gradient differs from the whole backward's\n", x->params[i].name);
      return 0;
    }
  return 1;
}

/* 1 where the weight gradients of every linear (2-D parameters but an untied embedding) are all
 * 0 (a tied embedding's too: its rows wait for W with the head's product). */
static int linears_untouched(const struct model *m, int tie)
{
  for (int i = 0; i < m->n_params; i++) {
    const struct model_param *p = &m->params[i];
    if (p->n_dims != 2 || (p->kind == MODEL_EMBED && !tie))
      continue;
    for (size_t e = 0; e < p->n_elems; e++)
      if (p->grad[e] != 0) {
        fprintf(stderr, "%s: a weight gradient before W\n", p->name);
        return 0;
      }
  }
  return 1;
}

static void split_equals_whole(uint8_t recompute, int tie, const char *what)
{
  struct run whole, split;
  CHECK_MSG(run_open(&whole, recompute, tie) == 0 && run_open(&split, recompute, tie) == 0, "%s", err);
  const real scale = (real)1 / N;
  double lw[2], ls[2];
  for (int k = 0; k < 2; k++) {
    lw[k] = forward(&whole, k);
    model_backward(&whole.m, &whole.a[k], scale);
    keep_input_gradient(&whole, k);
  }

  struct model_split held[2];
  /* a tied embedding (its head on this model) also holds its input gradient, C per token */
  const size_t cap = (size_t)N * (HELD_PER_TOKEN + (tie ? C : 0)) * sizeof(real);
  const int products = PRODUCTS + tie;
  for (int k = 0; k < 2; k++) {
    CHECK(model_split_open(&held[k], &split.m, cap, products) == 0);
    ls[k] = forward(&split, k);
    held[k].phase = MODEL_SPLIT_B;
    split.a[k].split = &held[k];
    model_backward(&split.m, &split.a[k], scale);
    split.a[k].split = NULL;
    keep_input_gradient(&split, k);
    /* every byte counted is used; the products are at most 7 a layer and the head's (fewer where
     * q, k, v or gate and up run as one product) */
    CHECK_MSG(held[k].used == cap && held[k].n_products > 0 && held[k].n_products <= products, "%s: B held "
              "%zu bytes in %d products, counted %zu in at most %d", what, held[k].used, held[k].n_products, cap,
              products);
  }
  CHECK_MSG(linears_untouched(&split.m, tie), "%s: B computed a weight gradient", what);
  for (int k = 0; k < 2; k++) {
    held[k].phase = MODEL_SPLIT_W;
    split.a[k].split = &held[k];
    model_backward(&split.m, &split.a[k], scale);
    split.a[k].split = NULL;
    model_split_close(&held[k]);
  }

  for (int k = 0; k < 2; k++) {
    CHECK_MSG(lw[k] == ls[k], "%s: micro-batch %d's loss %.17g, whole %.17g", what, k, ls[k], lw[k]);
    CHECK_MSG(!memcmp(whole.dres[k], split.dres[k], N * C * sizeof(real)),
              "%s: micro-batch %d's input gradient differs", what, k);
  }
  CHECK_MSG(same_grads(&whole.m, &split.m), "%s: gradients differ", what);
  printf("%s: B then W equals the whole backward bit for bit (%d tensors, 2 micro-batches)\n", what,
         whole.m.n_params);
  run_close(&whole);
  run_close(&split);
}

static void split_backward_is_the_whole_backward(void)
{
  split_equals_whole(0, 0, "no recompute");
}

static void split_backward_recomputes_as_b_did(void)
{
  split_equals_whole(PLAN_RC_FULL, 0, "recompute full");
}

/* A tied embedding: the head's product and the embedding's rows add into one gradient, in the
 * whole backward's order (head first) only if both wait for W. */
static void split_backward_keeps_a_tied_embeddings_order(void)
{
  split_equals_whole(0, 1, "tied embedding");
}

/* The comparison sees a difference: W run twice adds its products twice (then every linear's
 * weight gradient is double the whole backward's). */
static void a_wrong_split_is_detected(void)
{
  struct run whole, split;
  CHECK_MSG(run_open(&whole, 0, 0) == 0 && run_open(&split, 0, 0) == 0, "%s", err);
  forward(&whole, 0);
  model_backward(&whole.m, &whole.a[0], (real)1 / N);
  struct model_split held;
  CHECK(model_split_open(&held, &split.m, (size_t)N * HELD_PER_TOKEN * sizeof(real), PRODUCTS) == 0);
  forward(&split, 0);
  split.a[0].split = &held;
  held.phase = MODEL_SPLIT_B;
  model_backward(&split.m, &split.a[0], (real)1 / N);
  held.phase = MODEL_SPLIT_W;
  model_backward(&split.m, &split.a[0], (real)1 / N);
  model_backward(&split.m, &split.a[0], (real)1 / N);
  split.a[0].split = NULL;
  model_split_close(&held);
  CHECK(!same_grads(&whole.m, &split.m));
  run_close(&whole);
  run_close(&split);
}

TEST_MAIN(TEST(split_backward_is_the_whole_backward),
          TEST(split_backward_recomputes_as_b_did),
          TEST(split_backward_keeps_a_tied_embeddings_order),
          TEST(a_wrong_split_is_detected))
