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

/* ---- the step's buffers, in agreed rounds ----
 *
 * Under zero 2 and 3 a step allocates as it runs: gathered units (3), gradient buckets and
 * reduce-scatter outputs (2, 3). The trainer reserved its memory bill at open (alloc_reserve),
 * so they fit the allocator's cap; the system allocator can still fail below it. A rank that
 * cannot allocate a buffer a collective needs cannot take part in it, and its peers would wait
 * for it forever. So each allocation site is a round: every buffer of the round is allocated,
 * then every rank of the trainer's world agrees on the outcome (comm_agree: control traffic,
 * not counted) before any collective touches them. The rounds are at fixed points of each piece
 * (before its gathers; before a backward's buckets fill; before their reductions start), the
 * same on every rank. When one rank failed, every rank stops the pass at the same round with
 * "rank R: out of memory for ...", and dp_pass_abort ends what is in flight; nothing was
 * entered alone. Allocation order and frees are as they were, so the peaks are the bill's. */

static void *round_alloc(struct dp *d, enum alloc_category c, size_t n_elems, const char *what)
{
  real *p = alloc_reals_on(d->model->device, c, n_elems);
  if (!p && !d->round_failed) {
    d->round_failed = 1;
    snprintf(d->round_what, sizeof d->round_what, "out of memory for %s (%zu elements)", what, n_elems);
  }
  return p;
}

/* The end of a round: 0 when every rank allocated everything, else −1 on every rank (the pass
 * stops; d->err names the first rank that failed and what it was allocating). */
static int round_agree(struct dp *d)
{
  const int failed = d->round_failed;
  d->round_failed = 0;
  if (!dp_agree_allocated(d, d->agree, !failed, d->round_what))
    return 0;
  d->aborted = 1;
  return -1;
}

/* ---- ZeRO-3 gathers (no-ops under 0-2, where every unit is always held) ---- */

/* Room for unit u's gathered parameters, when it is not held and has none. */
static void unit_alloc(struct dp *d, int u)
{
  struct dp_unit_state *s = &d->units[u];
  if (s->hold != DP_UNIT_FREE || s->params)
    return;
  const struct dp_unit *unit = &d->layout.units[u];
  const struct dp_bucket *first = &d->layout.buckets[unit->first_bucket];
  const struct dp_bucket *last = &d->layout.buckets[unit->last_bucket];
  char what[64];
  snprintf(what, sizeof what, "gathering the parameters of unit %d", u);
  s->params = round_alloc(d, ALLOC_PARAMS, last->start + last->n_elems - first->start, what);
}

/* Starts unit u's gathers into the room unit_alloc made (after the round agreed). */
static void unit_gather_start(struct dp *d, int u)
{
  struct dp_unit_state *s = &d->units[u];
  if (s->hold != DP_UNIT_FREE)
    return;
  const struct dp_unit *unit = &d->layout.units[u];
  const struct dp_bucket *first = &d->layout.buckets[unit->first_bucket];
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
    s->grads = round_alloc(d, ALLOC_GRADS, d->layout.buckets[b].n_elems, "a gradient bucket");
    if (s->grads)
      dp_bind_bucket(d, b, s->grads, 1);
  }
}

/* Starts bucket b's reduction; under zero 2, 3 into the output room_for_reductions made. */
static void bucket_start(struct dp *d, int b)
{
  const struct dp_bucket *k = &d->layout.buckets[b];
  struct dp_bucket_state *s = &d->buckets[b];
  if (d->zero < 2)
    dp_all_reduce(d, d->model->grad_memory + k->start, k->n_elems, &s->req);
  else
    dp_reduce_scatter(d, s->grads, s->recv, k->share, &s->req);
  d->inflight[d->n_inflight++] = b;
}

/* Zero 2, 3: the reduce-scatter outputs of buckets next_bucket down to (not including) stop, in
 * one round. 0, or −1 when the round failed. */
static int room_for_reductions(struct dp *d, int stop)
{
  if (d->zero < 2)
    return 0;
  for (int b = d->next_bucket; b > stop; b--)
    d->buckets[b].recv = round_alloc(d, ALLOC_COMM, d->layout.buckets[b].share, "a reduce-scatter output");
  return round_agree(d);
}

/* The gradients of parameters from `first_final` on are final: reduce every bucket that now is.
 * Under zero 2, 3 a round (the same on every rank, even with nothing to start). */
static int grads_final_from(struct dp *d, int first_final)
{
  if (!d->reducing) /* the same on every rank: no round */
    return 0;
  /* Zero 2, 3: one unit's reductions in flight, overlapping the next unit's backward; the
   * earlier unit's have had that backward's time and are finished now, freeing its gradients. */
  int stop = d->next_bucket;
  if (d->next_bucket >= 0 && d->layout.buckets[d->next_bucket].first_held >= first_final) {
    while (d->zero >= 2 && d->n_inflight > 0)
      inflight_finish_oldest(d);
    while (stop >= 0 && d->layout.buckets[stop].first_held >= first_final)
      stop--;
  }
  if (room_for_reductions(d, stop))
    return -1;
  while (d->next_bucket > stop)
    bucket_start(d, d->next_bucket--);
  return 0;
}

/* ---- a pass: one FWD or BWD of a stage ---- */

/* Piece pc's work. −1 when one of its rounds failed (the pass stops). */
static int compute(struct dp *d, struct piece pc, const struct dp_pass *ps, double *loss)
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
    if (d->zero >= 2 && round_agree(d))
      return -1;
    model_bind_views(m);
    model_head_backward(m, ps->a, ps->loss_scale);
    return grads_final_from(d, u->first_param);
  }
  case PIECE_LAYER_BWD: {
    const struct dp_unit *u = &l->units[1 + pc.layer];
    buckets_ready_for(d, u->first_param, u->last_param);
    if (d->zero >= 2 && round_agree(d))
      return -1;
    model_bind_views(m);
    model_layer_backward(m, ps->a, pc.layer);
    return grads_final_from(d, u->first_param);
  }
  case PIECE_EMBED_BWD:
    buckets_ready_for(d, 0, 0);
    if (d->zero >= 2 && round_agree(d))
      return -1;
    model_bind_views(m);
    model_embed_backward(m, ps->a);
    if (!ps->embed_waits) /* a tied embedding is summed between the stages first */
      return grads_final_from(d, 0);
    break;
  }
  return 0;
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
  for (int k = 0; k < n && !d->aborted; k++) {
    const struct piece *next = k + 1 < n ? &pcs[k + 1] : then;
    int units[2], n_units = units_of(d, &pcs[k], units);
    int next_units[2], n_next = units_of(d, next, next_units);
    if (d->zero == 3) { /* the round of this piece's gathers and the next one's */
      for (int i = 0; i < n_units; i++)
        unit_alloc(d, units[i]);
      for (int i = 0; i < n_next; i++)
        unit_alloc(d, next_units[i]);
      if (round_agree(d))
        break;
    }
    for (int i = 0; i < n_units; i++)
      unit_hold(d, units[i]);
    /* prefetch: the next piece's gathers run while this one computes */
    for (int i = 0; i < n_next; i++)
      unit_gather_start(d, next_units[i]);
    model_bind_views(d->model);
    if (compute(d, pcs[k], ps, &loss))
      break;
    for (int u = 0; u < d->layout.n_units; u++)
      if (!piece_needs(d, next, u))
        unit_release(d, u);
  }
  model_bind_views(d->model);
  d->reducing = 0;
  return loss;
}

void dp_pass_abort(struct dp *d)
{
  /* reductions in flight first (their buckets' gradients and outputs), then the rest */
  while (d->n_inflight > 0) {
    const int b = d->inflight[0];
    memmove(d->inflight, d->inflight + 1, (size_t)(--d->n_inflight) * sizeof *d->inflight);
    comm_wait(&d->buckets[b].req);
  }
  for (int b = 0; b < d->layout.n_buckets; b++) {
    struct dp_bucket_state *s = &d->buckets[b];
    if (d->zero >= 2 && s->grads)
      dp_bind_bucket(d, b, NULL, 1);
    alloc_free(s->grads);
    alloc_free(s->recv);
    s->grads = s->recv = NULL;
  }
  for (int u = 0; u < d->layout.n_units && d->zero == 3; u++) {
    struct dp_unit_state *s = &d->units[u];
    const struct dp_unit *unit = &d->layout.units[u];
    if (s->hold == DP_UNIT_GATHERING)
      comm_wait_all(s->reqs, unit->last_bucket - unit->first_bucket + 1);
    if (s->hold != DP_UNIT_FREE)
      for (int b = unit->first_bucket; b <= unit->last_bucket; b++)
        dp_bind_bucket(d, b, NULL, 0);
    alloc_free(s->params); /* a room the failed round made, or a gathered unit */
    s->params = NULL;
    s->hold = DP_UNIT_FREE;
  }
  model_bind_views(d->model);
  d->reducing = 0;
  d->next_bucket = -1;
  d->round_failed = 0;
  d->aborted = 0;
}

int dp_reduce_rest(struct dp *d)
{
  if (room_for_reductions(d, -1))
    return -1;
  while (d->next_bucket >= 0)
    bucket_start(d, d->next_bucket--);
  d->reducing = 0;
  while (d->n_inflight > 0)
    inflight_finish_oldest(d);
  return d->failed ? -1 : 0;
}
