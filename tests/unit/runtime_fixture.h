/* Shared set-up for the runtime tests: a plan built in C (what plan_compile would produce for a
 * small Llama on the addition corpus), and small helpers to compare parameter sets. */
#ifndef TYCHO_TEST_RUNTIME_FIXTURE_H
#define TYCHO_TEST_RUNTIME_FIXTURE_H
#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "plan/plan.h"
#include "runtime/model/model.h"

struct fixture_shape {
  int n_layers, dim, n_heads, n_kv_heads, ffn_dim, vocab, seq, global, micro;
};

/* A single-rank plan: AdamW (lr 3e-3, betas 0.9/0.99, wd 0.1, clip 1), 5 warm-up steps and a
 * cosine to step 60, seeds model 11 / data 22 / dropout 33, the addition corpus, no eval. */
static inline void fixture_plan(struct plan *p, struct fixture_shape s)
{
  plan_init(p);
  snprintf(p->name, sizeof p->name, "fixture");
  snprintf(p->file, sizeof p->file, "fixture.lua");
  struct plan_model *m = &p->model;
  snprintf(m->family, sizeof m->family, "llama");
  m->n_layers = s.n_layers;
  m->dim = s.dim;
  m->n_heads = s.n_heads;
  m->n_kv_heads = s.n_kv_heads;
  m->ffn_dim = s.ffn_dim;
  m->vocab = s.vocab;
  m->vocab_padded = s.vocab;
  m->head_dim = s.dim / s.n_heads;
  m->max_seq = s.seq;
  m->norm_eps = 1e-5;
  m->rope_theta = 10000.0;
  p->mesh.world = p->mesh.tp = p->mesh.pp = p->mesh.dp = 1;
  p->batch.global = s.global;
  p->batch.micro = s.micro;
  p->batch.seq = s.seq;
  p->batch.microbatches = s.global / s.micro;
  p->precision.compute = p->precision.grads = p->precision.master = PLAN_FP32;
  snprintf(p->optimizer.kind, sizeof p->optimizer.kind, "adamw");
  p->optimizer.lr = 3e-3;
  p->optimizer.beta1 = 0.9;
  p->optimizer.beta2 = 0.99;
  p->optimizer.eps = 1e-8;
  p->optimizer.weight_decay = 0.1;
  p->optimizer.grad_clip = 1.0;
  p->lr_schedule.warmup = 5;
  p->lr_schedule.decay = PLAN_DECAY_COSINE;
  p->lr_schedule.decay_steps = 60;
  p->lr_schedule.min_lr = 3e-4;
  p->seeds.global = 1234;
  p->seeds.value[PLAN_SEED_MODEL] = 11;
  p->seeds.value[PLAN_SEED_DATA] = 22;
  p->seeds.value[PLAN_SEED_DROPOUT] = 33;
  snprintf(p->data.synthetic, sizeof p->data.synthetic, "addition");
  p->train.steps = 60;
  p->train.eval_every = 0;
  p->train.eval_batches = 0;
  p->log.every = 10;
  /* one pipeline stage of every layer, as the plan compiler lays it out for mesh.pp = 1 */
  p->virtual_stages = 1;
  p->schedule = PLAN_SCHED_1F1B; /* the compiler's default */
  p->n_stages = 1;
  p->stages = calloc(1, sizeof *p->stages);
  if (p->stages)
    *p->stages = (struct plan_stage){ .index = 0, .pp_rank = 0, .chunk = 0, .first_layer = 0,
                                      .n_layers = s.n_layers, .has_embed = 1, .has_head = 1 };
}

/* ‖a − b‖ / ‖b‖ over n floats. */
static inline double fixture_rel_l2(const real *a, const real *b, size_t n)
{
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)a[i] - b[i];
    num += d * d;
    den += (double)b[i] * b[i];
  }
  return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

/* Every parameter of a and b bitwise equal (same table assumed). */
static inline int fixture_params_equal(const struct model *a, const struct model *b)
{
  if (a->n_params != b->n_params)
    return 0;
  for (int i = 0; i < a->n_params; i++)
    if (a->params[i].n_elems != b->params[i].n_elems ||
        memcmp(a->params[i].data, b->params[i].data, a->params[i].n_elems * sizeof(real)) != 0)
      return 0;
  return 1;
}

#endif
