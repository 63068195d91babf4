/* `tycho tune` (tune.h). */
#include "check/tune.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check/cost.h"
#include "runtime/bill.h"
#include "util/err.h"

static double now(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void insert(struct tune_result *r, int keep, const struct tune_choice *c)
{
  int at = r->n_best; /* by step time; of two alike, the one with less memory first */
  while (at > 0 && (r->best[at - 1].step > c->step ||
                    (r->best[at - 1].step == c->step && r->best[at - 1].max_bytes > c->max_bytes)))
    at--;
  if (at >= keep)
    return;
  int n = r->n_best < keep ? r->n_best + 1 : keep;
  memmove(r->best + at + 1, r->best + at, (size_t)(n - at - 1) * sizeof *r->best);
  r->best[at] = *c;
  r->n_best = n;
}

/* Builds and prices one candidate; returns 2 when it fit, 1 when it compiled only, 0 otherwise. */
static int try_one(const struct plan *base, int world, const struct cluster *c, double headroom, int keep,
                   struct tune_choice *ch, struct tune_result *r)
{
  struct plan p;
  char err[512];
  if (plan_copy(&p, base))
    return 0;
  p.mesh.tp = ch->tp;
  p.mesh.pp = ch->pp;
  p.mesh.dp = ch->dp;
  p.mesh.ep = ch->ep;
  p.mesh.world = world;
  p.mesh.dp_auto = 0;
  p.mesh.world_assumed = 0;
  p.virtual_stages = ch->v;
  p.stages_kind = PLAN_STAGES_BALANCED;
  p.stages_is_function = 0;
  p.schedule = ch->v > 1 ? PLAN_SCHED_INTERLEAVED : PLAN_SCHED_1F1B;
  p.batch.micro = ch->micro;
  p.zero = ch->zero;
  p.zero_every.grads_set = ch->zero >= 2; /* the base plan's choices are the search's now */
  p.zero_every.params_set = ch->zero == 3;
  p.zero_every.grads = ch->grads_step ? PLAN_ZERO_EVERY_STEP : PLAN_ZERO_EVERY_MICRO_BATCH;
  p.zero_every.params = ch->params_step ? PLAN_ZERO_EVERY_STEP : PLAN_ZERO_EVERY_MICRO_BATCH;
  p.sequence_parallel = ch->sp;
  for (int l = 0; l < p.model.n_layers; l++) {
    p.layers[l].recompute = ch->recompute;
    if (ch->kv_replicate) {
      p.layers[l].split[PLAN_MOD_K] = PLAN_SPLIT_REPLICATE;
      p.layers[l].split[PLAN_MOD_V] = PLAN_SPLIT_REPLICATE;
    }
  }
  int ok = plan_validate(&p, err, sizeof err) == 0;
  if (ok) {
    r->n_valid++;
    double worst = 0;
    struct bill b;
    for (int k = 0; k < p.mesh.pp && ok; k++) {
      if (bill_predict(&p, k, &b, err, sizeof err))
        ok = 0;
      else
        worst = b.total > worst ? b.total : worst;
    }
    struct cost cost;
    if (ok && worst <= c->device_memory * (1.0 - headroom) && cost_predict(&p, c, &cost, err, sizeof err) == 0) {
      r->n_fit++;
      ch->step = cost.step;
      ch->mfu = cost.mfu;
      ch->tokens_per_s = cost.tokens_per_s;
      ch->max_bytes = worst;
      ch->headroom = 1.0 - worst / c->device_memory;
      insert(r, keep, ch);
      ok = 2;
    }
  }
  plan_free(&p);
  return ok;
}

/* One layout with zero ch->zero over its zero_every choices, fastest first: "step" for both
 * (fewest collectives, the most held during a step), then each one "micro_batch", then both (the
 * least memory, the most collectives). Under the step-time model each choice of "step" is as
 * fast or faster and holds as much or more, so the first to fit is the fastest that fits: the
 * slower ones are not priced. With one micro-batch per step the gradients' choices move the
 * same bytes, and "micro_batch" (less memory) is the only one tried. */
static void tune_zero_every(const struct plan *base, int world, const struct cluster *c, double headroom,
                            int keep, struct tune_choice *ch, struct tune_result *r)
{
  if (ch->zero < 2) {
    r->n_tried++;
    try_one(base, world, c, headroom, keep, ch, r);
    return;
  }
  const int microbatches = base->batch.global / (ch->micro * ch->dp);
  const int gmax = microbatches > 1, qmax = ch->zero == 3; /* the choices there are */
  for (int level = gmax + qmax; level >= 0; level--) { /* how many of them are "step" */
    int fit = 0;
    for (int g = gmax; g >= 0; g--)
      for (int q = qmax; q >= 0; q--) {
        if (g + q != level)
          continue;
        struct tune_choice one = *ch;
        one.grads_step = g;
        one.params_step = q;
        r->n_tried++;
        fit |= try_one(base, world, c, headroom, keep, &one, r) == 2;
      }
    if (fit)
      return;
  }
}

int tune_search(const struct plan *base, int world, const struct cluster *c, double headroom, int keep,
                struct tune_result *out, char *err, size_t err_size)
{
  memset(out, 0, sizeof *out);
  if (keep < 1)
    keep = 1;
  out->best = calloc((size_t)keep, sizeof *out->best);
  if (!out->best)
    return errf(err, err_size, "out of memory");
  const double start = now();
  const struct plan_model *m = &base->model;
  static const uint8_t recomputes[] = { 0, PLAN_RC_ATTN_CORE, PLAN_RC_FULL };
  static const int micros[] = { 1, 2, 4, 8 };
  for (int tp = 1; tp <= c->gpus_per_node && tp <= m->n_heads; tp++) {
    if (m->n_heads % tp || world % tp)
      continue;
    for (int pp = 1; pp <= m->n_layers; pp++) {
      if (m->n_layers % pp || world % (tp * pp))
        continue;
      const int dp = world / (tp * pp);
      for (int v = 1; v <= 2; v++) {
        if (v > 1 && (pp == 1 || (m->n_layers / pp) % v))
          continue;
        for (size_t mi = 0; mi < sizeof micros / sizeof *micros; mi++) {
          const int micro = micros[mi];
          if (base->batch.global % (micro * dp))
            continue;
          for (int ep = 1; ep <= dp; ep++) {
            if (dp % ep || (ep > 1 && (m->moe.experts <= 0 || m->moe.experts % ep)))
              continue;
            for (int zero = 1; zero <= 3; zero++)
              for (size_t ri = 0; ri < sizeof recomputes; ri++) {
                struct tune_choice ch = { .tp = tp, .pp = pp, .v = v, .dp = dp, .micro = micro, .zero = zero,
                                          .sp = tp > 1, .kv_replicate = tp > 1 && m->n_kv_heads % tp != 0,
                                          .ep = ep, .moe = m->moe.experts > 0, .recompute = recomputes[ri] };
                tune_zero_every(base, world, c, headroom, keep, &ch, out);
              }
          }
        }
      }
    }
  }
  out->seconds = now() - start;
  return 0;
}

void tune_result_free(struct tune_result *r)
{
  free(r->best);
  memset(r, 0, sizeof *r);
}

int tune_write_plan(FILE *f, const char *base_module, const struct tune_choice *t, const char *command)
{
  char rc[96];
  fprintf(f, "-- Written by `%s`:\n", command);
  fprintf(f, "-- the fastest layout that fits, by the predicted step time (%.3f s per step, MFU %.1f%%,\n"
             "-- %.1f GiB on the fullest rank, %.0f%% of device memory spare). Check it with tycho check.\n",
          t->step, 100.0 * t->mfu, t->max_bytes / (1024.0 * 1024.0 * 1024.0), 100.0 * t->headroom);
  fprintf(f, "local tycho = require \"tycho\"\n\n");
  fprintf(f, "return tycho.extend(require \"%s\", {\n", base_module);
  if (t->ep > 1 || t->moe) /* ep written for a MoE model even at 1: the base plan may set another */
    fprintf(f, "  mesh = { tp = %d, pp = %d, dp = \"auto\", ep = %d },\n", t->tp, t->pp, t->ep > 1 ? t->ep : 1);
  else
    fprintf(f, "  mesh = { tp = %d, pp = %d, dp = \"auto\" },\n", t->tp, t->pp);
  fprintf(f, "  stages = \"balanced\",\n");
  fprintf(f, "  virtual_stages = %d,\n", t->v);
  fprintf(f, "  schedule = { kind = \"%s\" },\n", t->v > 1 ? "interleaved" : "1f1b");
  fprintf(f, "  batch = { micro = %d },\n", t->micro);
  fprintf(f, "  zero = %d,\n", t->zero);
  if (t->zero == 2)
    fprintf(f, "  zero_every = { grads = \"%s\" },\n", t->grads_step ? "step" : "micro_batch");
  if (t->zero == 3)
    fprintf(f, "  zero_every = { grads = \"%s\", params = \"%s\" },\n", t->grads_step ? "step" : "micro_batch",
            t->params_step ? "step" : "micro_batch");
  fprintf(f, "  sequence_parallel = %s,\n", t->sp ? "true" : "false");
  if (t->recompute == 0 || t->recompute == PLAN_RC_FULL)
    fprintf(f, "  recompute = \"%s\",\n", plan_recompute_text(t->recompute, rc, sizeof rc));
  else
    fprintf(f, "  recompute = { \"%s\" },\n", plan_recompute_text(t->recompute, rc, sizeof rc));
  if (t->kv_replicate)
    fprintf(f, "  tp_split = { k = \"replicate\", v = \"replicate\" },\n");
  fprintf(f, "})\n");
  return ferror(f) ? -1 : 0;
}
