/* Forward and backward under data parallelism (dp.h): the model's pieces (embedding, layers,
 * head) run as a list of steps; around each step the ZeRO-3 gathers (the step's units waited
 * for, the next step's started before computing this one, units no longer needed freed) and,
 * in backward, the reductions: once a unit's backward is done its gradients are final, and
 * every bucket whose parameters are all final is reduced (non-blocking) while the rest of
 * backward runs. Buckets are reduced from the last to the first, the order backward finishes
 * them, the same on every rank. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "kernels.h"
#include "runtime/alloc.h"
#include "runtime/dp.h"

enum step_kind { EMBED_FWD, LAYER_FWD, HEAD_FWD, HEAD_BWD, LAYER_BWD, EMBED_BWD };

struct dp_step {
  enum step_kind kind;
  int layer;
};

/* The units a step reads parameters of: up to two (a tied head reads the embedding). */
static int step_units(const struct dp *d, struct dp_step s, int units[2])
{
  const int L = d->model->config.n_layers, tied = d->model->config.tie_embeddings;
  switch (s.kind) {
  case EMBED_FWD: units[0] = 0; return 1;
  case LAYER_FWD: case LAYER_BWD: units[0] = 1 + s.layer; return 1;
  case HEAD_FWD: case HEAD_BWD: units[0] = L + 1; units[1] = 0; return tied ? 2 : 1;
  case EMBED_BWD: return 0; /* the embedding's backward reads no parameter */
  }
  return 0;
}

static int step_needs(const struct dp *d, const struct dp_step *s, int u)
{
  int units[2], n = s ? step_units(d, *s, units) : 0;
  for (int i = 0; i < n; i++)
    if (units[i] == u)
      return 1;
  return 0;
}

/* ---- ZeRO-3 gathers (no-ops under 0-2, where every unit is always held) ---- */

static void unit_gather_start(struct dp *d, int u)
{
  struct dp_unit_state *s = &d->units[u];
  if (s->hold != DP_UNIT_FREE)
    return;
  const struct dp_unit *unit = &d->layout.units[u];
  const struct dp_bucket *first = &d->layout.buckets[unit->first_bucket];
  const struct dp_bucket *last = &d->layout.buckets[unit->last_bucket];
  s->params = alloc_reals(ALLOC_PARAMS, last->start + last->n_elems - first->start);
  if (!s->params)
    comm_fatal("out of memory gathering the parameters of unit %d", u);
  for (int b = unit->first_bucket; b <= unit->last_bucket; b++) {
    const struct dp_bucket *k = &d->layout.buckets[b];
    real *at = s->params + (k->start - first->start);
    dp_all_gather(d, d->shard_params + k->shard_offset, at, k->share, &s->reqs[b - unit->first_bucket]);
    dp_bind_bucket(d, b, at, 0);
  }
  s->hold = DP_UNIT_GATHERING;
}

static void unit_hold(struct dp *d, int u)
{
  struct dp_unit_state *s = &d->units[u];
  unit_gather_start(d, u);
  if (s->hold == DP_UNIT_GATHERING) {
    const struct dp_unit *unit = &d->layout.units[u];
    if (comm_wait_all(s->reqs, unit->last_bucket - unit->first_bucket + 1))
      dp_fail(d, "parameter all-gather");
    s->hold = DP_UNIT_HELD;
  }
}

static void unit_release(struct dp *d, int u)
{
  struct dp_unit_state *s = &d->units[u];
  if (d->zero < 3 || s->hold == DP_UNIT_FREE)
    return;
  unit_hold(d, u); /* a gather in flight must end before its buffer goes */
  const struct dp_unit *unit = &d->layout.units[u];
  for (int b = unit->first_bucket; b <= unit->last_bucket; b++)
    dp_bind_bucket(d, b, NULL, 0);
  alloc_free(s->params);
  s->params = NULL;
  s->hold = DP_UNIT_FREE;
}

/* ---- gradient buckets ---- */

/* Ends bucket b's reduction; under zero 2 and 3 adds its share into the shard and frees the
 * bucket's gradients. */
static void bucket_finish(struct dp *d, int b)
{
  struct dp_bucket_state *s = &d->buckets[b];
  if (comm_wait(&s->req))
    dp_fail(d, d->zero >= 2 ? "gradient reduce-scatter" : "gradient all-reduce");
  if (d->zero < 2)
    return;
  const struct dp_bucket *k = &d->layout.buckets[b];
  if (s->recv) {
    real *shard = d->shard_grads + k->shard_offset;
    residual_forward(shard, shard, s->recv, k->share);
  }
  dp_bind_bucket(d, b, NULL, 1);
  alloc_free(s->grads);
  alloc_free(s->recv);
  s->grads = s->recv = NULL;
}

static void inflight_finish_oldest(struct dp *d)
{
  int b = d->inflight[0];
  memmove(d->inflight, d->inflight + 1, (size_t)(--d->n_inflight) * sizeof *d->inflight);
  bucket_finish(d, b);
}

/* Under zero 2 and 3: gives every bucket holding a parameter in [first, last] zeroed gradients
 * (a bucket still reducing from the last micro-batch is finished first). */
static void buckets_ready_for(struct dp *d, int first, int last)
{
  if (d->zero < 2)
    return;
  for (int b = d->layout.param_bucket[first]; b <= d->layout.param_bucket[last]; b++) {
    struct dp_bucket_state *s = &d->buckets[b];
    for (int i = 0; i < d->n_inflight; i++)
      if (d->inflight[i] == b) { /* in issue order: every rank waits for the same ones */
        for (int k = 0; k <= i; k++)
          inflight_finish_oldest(d);
        break;
      }
    if (s->grads)
      continue; /* already filling in this backward */
    s->grads = alloc_reals(ALLOC_GRADS, d->layout.buckets[b].n_elems);
    if (!s->grads)
      comm_fatal("out of memory for a gradient bucket of %zu elements", d->layout.buckets[b].n_elems);
    dp_bind_bucket(d, b, s->grads, 1);
  }
}

static void bucket_start(struct dp *d, int b)
{
  const struct dp_bucket *k = &d->layout.buckets[b];
  struct dp_bucket_state *s = &d->buckets[b];
  if (d->zero < 2) {
    dp_all_reduce(d, d->model->grad_memory + k->start, k->n_elems, &s->req);
  } else {
    s->recv = alloc_reals(ALLOC_COMM, k->share);
    if (!s->recv)
      comm_fatal("out of memory for a reduce-scatter output of %zu elements", k->share);
    dp_reduce_scatter(d, s->grads, s->recv, k->share, &s->req);
  }
  d->inflight[d->n_inflight++] = b;
}

/* The gradients of parameters from `first_final` on are final: reduce every bucket that now is. */
static void grads_final_from(struct dp *d, int first_final)
{
  if (!d->reducing || d->next_bucket < 0 || d->layout.buckets[d->next_bucket].first_held < first_final)
    return;
  /* Zero 2, 3: one unit's reductions in flight, overlapping the next unit's backward; the
   * earlier unit's have had that backward's time and are finished now, freeing its gradients. */
  while (d->zero >= 2 && d->n_inflight > 0)
    inflight_finish_oldest(d);
  while (d->next_bucket >= 0 && d->layout.buckets[d->next_bucket].first_held >= first_final)
    bucket_start(d, d->next_bucket--);
}

/* ---- the steps ---- */

struct pass {
  struct model_acts *a;
  const int *tokens, *targets;
  const struct model_dropout *dropout;
  int B, T;
  real loss_scale;
  double loss;
  int mb, n_forward; /* a training micro-batch (trace spans "forward" and "backward"); -1, 0: none */
};

static void compute(struct dp *d, struct dp_step s, struct pass *p)
{
  struct model *m = d->model;
  const struct dp_layout *l = &d->layout;
  const int tied = m->config.tie_embeddings;
  switch (s.kind) {
  case EMBED_FWD: model_embed_forward(m, p->a, p->tokens, p->dropout, p->B, p->T); break;
  case LAYER_FWD: model_layer_forward(m, p->a, s.layer, p->dropout); break;
  case HEAD_FWD: p->loss = model_head_forward(m, p->a, p->targets); break;
  case HEAD_BWD: {
    const struct dp_unit *u = &l->units[m->config.n_layers + 1];
    buckets_ready_for(d, u->first_param, u->last_param);
    if (tied)
      buckets_ready_for(d, 0, 0);
    model_bind_views(m);
    model_head_backward(m, p->a, p->targets, p->loss_scale);
    grads_final_from(d, u->first_param);
    break;
  }
  case LAYER_BWD: {
    const struct dp_unit *u = &l->units[1 + s.layer];
    buckets_ready_for(d, u->first_param, u->last_param);
    model_bind_views(m);
    model_layer_backward(m, p->a, s.layer);
    grads_final_from(d, u->first_param);
    break;
  }
  case EMBED_BWD:
    buckets_ready_for(d, 0, 0);
    model_bind_views(m);
    model_embed_backward(m, p->a);
    grads_final_from(d, 0);
    break;
  }
}

static void run_steps(struct dp *d, const struct dp_step *steps, int n, struct pass *p)
{
  double t_mark = comm_now();
  for (int k = 0; k < n; k++) {
    const struct dp_step *next = k + 1 < n ? &steps[k + 1] : NULL;
    int units[2], n_units = step_units(d, steps[k], units);
    for (int i = 0; i < n_units; i++)
      unit_hold(d, units[i]);
    if (next) { /* prefetch: the next step's gathers run while this one computes */
      int next_units[2], n_next = step_units(d, *next, next_units);
      for (int i = 0; i < n_next; i++)
        unit_gather_start(d, next_units[i]);
    }
    model_bind_views(d->model);
    compute(d, steps[k], p);
    for (int u = 0; u < d->layout.n_units; u++)
      if (!step_needs(d, next, u))
        unit_release(d, u);
    if (p->n_forward > 0 && (k + 1 == p->n_forward || k + 1 == n)) { /* the one stage, 0 */
      const double t = comm_now();
      const int backward = k + 1 == n;
      comm_trace_work(backward ? "backward" : "forward", 0, p->mb, d->mb_flops[backward], t_mark, t);
      t_mark = t;
    }
  }
  model_bind_views(d->model);
}

static int forward_steps(const struct dp *d, struct dp_step *steps)
{
  const int L = d->model->config.n_layers;
  int n = 0;
  steps[n++] = (struct dp_step){ EMBED_FWD, -1 };
  for (int l = 0; l < L; l++)
    steps[n++] = (struct dp_step){ LAYER_FWD, l };
  steps[n++] = (struct dp_step){ HEAD_FWD, -1 };
  return n;
}

int dp_steps_alloc(struct dp *d)
{
  d->steps = malloc((size_t)(2 * d->model->config.n_layers + 4) * sizeof *d->steps);
  return d->steps ? 0 : -1;
}

void dp_step_begin(struct dp *d, long long step)
{
  d->step = step;
  if (d->model->grad_memory)
    memset(d->model->grad_memory, 0, d->layout.n_elems * sizeof(real));
  if (d->shard_grads)
    memset(d->shard_grads, 0, d->layout.n_shard * sizeof(real));
}

double dp_forward_backward(struct dp *d, struct model_acts *a, const int *tokens,
                           const int *targets, const struct model_dropout *dropout, int B, int T,
                           real loss_scale, int reduce, int mb)
{
  const int L = d->model->config.n_layers;
  struct dp_step *steps = d->steps;
  if (d->group)
    comm_set_step(d->step, mb);
  int n = forward_steps(d, steps);
  const int n_forward = n;
  steps[n++] = (struct dp_step){ HEAD_BWD, -1 };
  for (int l = L - 1; l >= 0; l--)
    steps[n++] = (struct dp_step){ LAYER_BWD, l };
  steps[n++] = (struct dp_step){ EMBED_BWD, -1 };
  d->reducing = reduce || d->zero >= 2;
  d->next_bucket = d->layout.n_buckets - 1;
  struct pass p = { a, tokens, targets, dropout, B, T, loss_scale, 0.0, mb, n_forward };
  run_steps(d, steps, n, &p);
  d->reducing = 0;
  return p.loss;
}

double dp_forward(struct dp *d, struct model_acts *a, const int *tokens, const int *targets,
                  int B, int T)
{
  struct dp_step *steps = d->steps;
  int n = forward_steps(d, steps);
  struct pass p = { a, tokens, targets, NULL, B, T, 0.0f, 0.0, -1, 0 };
  run_steps(d, steps, n, &p);
  return p.loss;
}

void dp_reduce_begin(struct dp *d)
{
  d->reducing = 1;
  d->next_bucket = d->layout.n_buckets - 1;
}

void dp_grads_final_from(struct dp *d, int first_param)
{
  grads_final_from(d, first_param);
}

int dp_reduce_rest(struct dp *d)
{
  while (d->next_bucket >= 0)
    bucket_start(d, d->next_bucket--);
  d->reducing = 0;
  return dp_finish_grads(d);
}

int dp_finish_grads(struct dp *d)
{
  while (d->n_inflight > 0)
    inflight_finish_oldest(d);
  return d->failed ? -1 : 0;
}
