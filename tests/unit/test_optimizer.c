/* The optimizer around the AdamW kernel: the learning-rate schedule against values computed by
 * hand, clipping as torch.nn.utils.clip_grad_norm_ (coefficient max_norm / (norm + 1e-6), only
 * when below 1, the pre-clip norm reported), and weight decay on 2-D tensors only. */
#include "check.h"
#include "runtime/model/optimizer.h"
#include "runtime_fixture.h"

#include <math.h>

#define PI 3.14159265358979323846

static char err[512];

static const struct fixture_shape tiny = { 2, 16, 4, 2, 32, 20, 6, 2, 2 };

static void lr_schedule_matches_hand_computed_values(void)
{
  struct plan p;
  fixture_plan(&p, tiny);
  p.optimizer.lr = 1e-3;
  p.lr_schedule.min_lr = 1e-4;
  p.lr_schedule.warmup = 10;
  p.lr_schedule.decay_steps = 110;
  p.lr_schedule.decay = PLAN_DECAY_COSINE;
  /* optimizer_lr is double arithmetic in both builds: ≤ 5 roundings of values ≤ 1e-3 (with cos,
   * whose argument π · progress is itself a rounding or two off), 5 · 1.1e-16 · 1e-3 = 6e-19:
   * bound 1e-18 absolute (the 15-digit constant below is itself 4e-19 off). A wrong step count
   * or phase moves lr by ≥ 1e-7. */
  CHECK_NEAR(optimizer_lr(&p, 0), 1e-4, 1e-18);            /* 1e-3 · 1/10 */
  CHECK_NEAR(optimizer_lr(&p, 4), 5e-4, 1e-18);            /* 1e-3 · 5/10 */
  CHECK_NEAR(optimizer_lr(&p, 9), 1e-3, 1e-18);            /* end of warm-up: the peak */
  CHECK_NEAR(optimizer_lr(&p, 10), 1e-3, 1e-18);           /* cos(0) = 1 */
  CHECK_NEAR(optimizer_lr(&p, 60), 5.5e-4, 1e-18);         /* halfway: (1e-3 + 1e-4) / 2 */
  CHECK_NEAR(optimizer_lr(&p, 35), 1e-4 + 0.5 * (1 + cos(PI / 4)) * 9e-4, 1e-18); /* 8.6820e-4 */
  CHECK_NEAR(optimizer_lr(&p, 35), 8.68198051533946e-4, 1e-18);
  CHECK_NEAR(optimizer_lr(&p, 109), 1e-4 + 0.5 * (1 + cos(PI * 99 / 100)) * 9e-4, 1e-18);
  CHECK_NEAR(optimizer_lr(&p, 110), 1e-4, 1e-18);          /* from decay_steps on: min_lr */
  CHECK_NEAR(optimizer_lr(&p, 100000), 1e-4, 1e-18);

  p.lr_schedule.decay = PLAN_DECAY_LINEAR;
  CHECK_NEAR(optimizer_lr(&p, 3), 4e-4, 1e-18);
  CHECK_NEAR(optimizer_lr(&p, 10), 1e-3, 1e-18);
  CHECK_NEAR(optimizer_lr(&p, 35), 1e-4 + 9e-4 * 0.75, 1e-18);
  CHECK_NEAR(optimizer_lr(&p, 85), 1e-4 + 9e-4 * 0.25, 1e-18);
  CHECK_NEAR(optimizer_lr(&p, 110), 1e-4, 1e-18);

  p.lr_schedule.decay = PLAN_DECAY_CONSTANT;
  CHECK_NEAR(optimizer_lr(&p, 1), 2e-4, 1e-18);
  CHECK_NEAR(optimizer_lr(&p, 10), 1e-3, 1e-18);
  CHECK_NEAR(optimizer_lr(&p, 500), 1e-3, 1e-18);          /* no decay, even past decay_steps */

  p.lr_schedule.warmup = 0;                                 /* no warm-up: the peak at step 0 */
  p.lr_schedule.decay = PLAN_DECAY_COSINE;
  CHECK_NEAR(optimizer_lr(&p, 0), 1e-3, 1e-18);
  CHECK_NEAR(optimizer_lr(&p, 55), 5.5e-4, 1e-18);
}

/* Fills every gradient with 0 except: q_proj of layer 0 element 0 = 3, the final norm element 1
 * = 4 (global norm 5). */
static void set_grads_3_4(struct model *m)
{
  model_zero_grads(m);
  m->layer_grads[0].wq[0] = 3.0f;
  m->dfinal_norm[1] = 4.0f;
}

/* Clipping is AdamW's grad_scale (optimizer_update_range): the coefficient of the global norm. */
static void clipping_coefficient_is_max_norm_over_the_global_norm(void)
{
  struct model m;
  struct plan p;
  fixture_plan(&p, tiny);
  CHECK_MSG(model_create(&m, &p.model, err, sizeof err) == 0, "%s", err);
  set_grads_3_4(&m);
  CHECK(optimizer_grad_norm(&m) == 5.0); /* sqrt(9 + 16): exact */
  CHECK(optimizer_clip_coef(5.0, 1.0) == 1.0 / (5.0 + 1e-6));
  CHECK(optimizer_clip_coef(5.0, 10.0) == 1.0); /* under the limit: untouched */
  CHECK(optimizer_clip_coef(5.0, 0.0) == 1.0);  /* max_norm 0: clipping off */
  /* exactly at the limit: coef < 1 by 1e-6 */
  CHECK(optimizer_clip_coef(5.0, 5.0) == 5.0 / (5.0 + 1e-6) && optimizer_clip_coef(5.0, 5.0) < 1.0);
  model_free(&m);
}

static void weight_decay_applies_to_2d_tensors_only(void)
{
  struct plan p;
  fixture_plan(&p, tiny);
  p.optimizer.weight_decay = 0.5;
  struct model m;
  struct optimizer o;
  CHECK_MSG(model_create(&m, &p.model, err, sizeof err) == 0, "%s", err);
  CHECK_MSG(optimizer_create(&o, &p, &m, err, sizeof err) == 0, "%s", err);
  CHECK(model_init(&m, 5, NULL, 0) == 0);
  for (int i = 0; i < m.n_params; i++) /* gains away from 1, so decay would show */
    if (m.params[i].n_dims == 1)
      for (size_t e = 0; e < m.params[i].n_elems; e++) m.params[i].data[e] = 2.0f;
  real before[4096];
  struct model_param *q = &m.params[1]; /* model.layers.0.self_attn.q_proj.weight */
  CHECK(strcmp(q->name, "model.layers.0.self_attn.q_proj.weight") == 0);
  memcpy(before, q->data, q->n_elems * sizeof(real));
  real embed0 = m.wte[0], head0 = m.head[5];

  model_zero_grads(&m); /* zero gradient: AdamW moves nothing but the decay */
  /* Bitwise: with m = v = g = 0 the update is p · decay − step · 0 / (0 + eps) = p · decay, and
   * decay is the same double expression rounded to real as in adamw_update. */
  optimizer_update(&o, &m, 0, 0.1);
  const real decay = (real)(1.0 - 0.1 * 0.5);
  int bad_2d = 0, bad_1d = 0, n_2d = 0, n_1d = 0;
  for (size_t e = 0; e < q->n_elems; e++) bad_2d += q->data[e] != before[e] * decay;
  CHECK(m.wte[0] == embed0 * decay);
  CHECK(m.head[5] == head0 * decay);
  for (int i = 0; i < m.n_params; i++) {
    const struct model_param *pp = &m.params[i];
    CHECK(pp->weight_decay == (pp->n_dims == 2));
    if (pp->n_dims == 1) {
      n_1d++;
      for (size_t e = 0; e < pp->n_elems; e++) bad_1d += pp->data[e] != 2.0f;
    } else {
      n_2d++;
    }
  }
  CHECK(bad_2d == 0);
  CHECK(bad_1d == 0);
  CHECK(n_1d == 2 * 2 + 1); /* two gains per layer and the final norm */
  CHECK(n_2d == 1 + 7 * 2 + 1);
  optimizer_free(&o);
  model_free(&m);
}

TEST_MAIN(TEST(lr_schedule_matches_hand_computed_values),
          TEST(clipping_coefficient_is_max_norm_over_the_global_norm),
          TEST(weight_decay_applies_to_2d_tensors_only))
