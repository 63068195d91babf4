/* One FWD or BWD of a stage under data parallelism (dp.h), as the executor (exec.c) asks: the
 * stage's pieces (runtime/pieces.h: embedding, layers, head) in order; around each piece the
 * ZeRO-3 gathers (the piece's units waited for, the next piece's started before computing this
 * one, units no longer needed freed) and, in backward, the reductions: once a unit's backward is
 * done its gradients are final, and every bucket whose parameters are all final is reduced
 * (non-blocking) while the rest of backward runs. Buckets are reduced from the last to the
 * first, the order backward finishes them, the same on every rank. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "ops.h"
#include "runtime/alloc.h"
#include "runtime/dp.h"
#include "runtime/pieces.h"

/* The units a piece reads parameters of: up to two (a tied head reads the embedding). */
static int units_of(const struct dp *d, const struct piece *pc, int units[2])
{
  return pc ? piece_units(*pc, d->model->config.n_layers, d->model->config.tie_embeddings, units) : 0;
}

static int piece_needs(const struct dp *d, const struct piece *pc, int u)
{
  int units[2], n = units_of(d, pc, units);
  for (int i = 0; i < n; i++)
    if (units[i] == u)
      return 1;
  return 0;
}

/* ---- ZeRO-3 gathers (no-ops under 0-2, where every unit is always held) ----
 *
 * The buffers of a step (gathered units, gradient buckets, reduce-scatter outputs) are
 * allocated as the step runs. The trainer reserved its memory bill at open (alloc_reserve), so
 * they cannot meet the allocator's cap here; what remains is the system allocator failing below
 * it, mid-collective, where a rank cannot drop out without leaving its peers waiting: that one
 * case still ends the job as a whole (comm_fatal). */

static void unit_gather_start(struct dp *d, int u)
{
  struct dp_unit_state *s = &d->units[u];
  if (s->hold != DP_UNIT_FREE)
    return;
  const struct dp_unit *unit = &d->layout.units[u];
  const struct dp_bucket *first = &d->layout.buckets[unit->first_bucket];
  const struct dp_bucket *last = &d->layout.buckets[unit->last_bucket];
  s->params = alloc_reals_on(d->model->device, ALLOC_PARAMS, last->start + last->n_elems - first->start);
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
    d->model->k->residual_forward(d->model->kctx, shard, shard, s->recv, k->share);
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
    s->grads = alloc_reals_on(d->model->device, ALLOC_GRADS, d->layout.buckets[b].n_elems);
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
    s->recv = alloc_reals_on(d->model->device, ALLOC_COMM, k->share);
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

/* ---- a pass: one FWD or BWD of a stage ---- */

static void compute(struct dp *d, struct piece pc, const struct dp_pass *ps, double *loss)
{
  struct model *m = d->model;
  const struct dp_layout *l = &d->layout;
  const int tied = m->config.tie_embeddings;
  switch (pc.kind) {
  case PIECE_EMBED_FWD: model_embed_forward(m, ps->a, ps->tokens, ps->dropout, ps->B, ps->T); break;
  case PIECE_LAYER_FWD: model_layer_forward(m, ps->a, pc.layer, ps->dropout); break;
  case PIECE_HEAD_FWD: *loss = model_head_forward(m, ps->a, ps->targets); break;
  case PIECE_HEAD_BWD: {
    const struct dp_unit *u = &l->units[m->config.n_layers + 1];
    buckets_ready_for(d, u->first_param, u->last_param);
    if (tied)
      buckets_ready_for(d, 0, 0);
    model_bind_views(m);
    model_head_backward(m, ps->a, ps->loss_scale);
    grads_final_from(d, u->first_param);
    break;
  }
  case PIECE_LAYER_BWD: {
    const struct dp_unit *u = &l->units[1 + pc.layer];
    buckets_ready_for(d, u->first_param, u->last_param);
    model_bind_views(m);
    model_layer_backward(m, ps->a, pc.layer);
    grads_final_from(d, u->first_param);
    break;
  }
  case PIECE_EMBED_BWD:
    buckets_ready_for(d, 0, 0);
    model_bind_views(m);
    model_embed_backward(m, ps->a);
    if (!ps->embed_waits) /* a tied embedding is summed between the stages first */
      grads_final_from(d, 0);
    break;
  }
}

int dp_pieces_alloc(struct dp *d)
{
  d->pieces = malloc((size_t)(d->model->config.n_layers + 2) * sizeof *d->pieces);
  return d->pieces ? 0 : -1;
}

void dp_step_begin(struct dp *d, long long step)
{
  d->step = step;
  struct model *m = d->model;
  if (m->grad_memory)
    m->k->zero(m->kctx, m->grad_memory, d->layout.n_elems * sizeof(real));
  if (d->shard_grads)
    m->k->zero(m->kctx, d->shard_grads, d->layout.n_shard * sizeof(real));
  d->reducing = 0;
  d->next_bucket = d->layout.n_buckets - 1;
}

double dp_run_pass(struct dp *d, const struct dp_pass *ps, const struct piece *then)
{
  struct piece *pcs = d->pieces;
  const int n = pieces_of_stage(ps->stage, ps->backward, pcs);
  double loss = 0.0;
  if (!ps->backward && !ps->stage->has_embed) /* the input came from the stage before */
    model_forward_begin(d->model, ps->a, ps->dropout, ps->B, ps->T);
  if (ps->backward) {
    d->reducing = ps->reduce || d->zero >= 2;
    if (d->zero >= 2) /* every backward reduce-scatters all of its buckets */
      d->next_bucket = d->layout.n_buckets - 1;
  }
  for (int k = 0; k < n; k++) {
    const struct piece *next = k + 1 < n ? &pcs[k + 1] : then;
    int units[2], n_units = units_of(d, &pcs[k], units);
    for (int i = 0; i < n_units; i++)
      unit_hold(d, units[i]);
    /* prefetch: the next piece's gathers run while this one computes */
    int next_units[2], n_next = units_of(d, next, next_units);
    for (int i = 0; i < n_next; i++)
      unit_gather_start(d, next_units[i]);
    model_bind_views(d->model);
    compute(d, pcs[k], ps, &loss);
    for (int u = 0; u < d->layout.n_units; u++)
      if (!piece_needs(d, next, u))
        unit_release(d, u);
  }
  model_bind_views(d->model);
  d->reducing = 0;
  return loss;
}

int dp_reduce_rest(struct dp *d)
{
  while (d->next_bucket >= 0)
    bucket_start(d, d->next_bucket--);
  d->reducing = 0;
  while (d->n_inflight > 0)
    inflight_finish_oldest(d);
  return d->failed ? -1 : 0;
}
