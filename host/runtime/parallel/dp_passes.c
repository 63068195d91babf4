/* One FWD or BWD of a stage under data parallelism (dp.h), as the executor (exec.c) asks: the
 * stage's pieces (layout/pieces.h: embedding, layers, head) in order; around each piece the
 * ZeRO-3 gathers (the piece's units waited for, the next piece's started before computing this
 * one, units no longer needed freed, or under zero_every.params = "step" kept until the stage's
 * last backward) and, in backward, the reductions: once a unit's backward is done its gradients
 * are final for this pass, and its buckets are reduced (non-blocking) while the rest of backward
 * runs. Under zero 0 and 1 every bucket whose parameters are all final is (the layout's buckets
 * from the last to the first, the order backward finishes them); under zero 2 and 3 the unit's
 * own buckets, last first, in every backward (zero_every.grads = "micro_batch") or in the stage's
 * last ("step"). The same order on every rank of the group. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "runtime/parallel/dcomm.h"
#include "ops.h"
#include "runtime/model/alloc.h"
#include "runtime/parallel/dp.h"
#include "layout/pieces.h"

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
 * then every rank of the trainer's world agrees on the outcome (comm_agree_err: control traffic,
 * not counted) before any collective touches them. The rounds are at fixed points of each piece
 * (before its gathers; before a backward's buckets fill; before their reductions start), the
 * same on every rank. When one rank failed, every rank stops the pass at the same round with
 * "rank R: out of memory for ...", and dp_pass_abort ends what is in flight; nothing was
 * entered alone. Allocation order and frees are as they were, so the peaks are the bill's. */

/* n_elems elements of elem_size bytes (reals unless said) */
static void *round_alloc_of(struct dp *d, enum alloc_category c, size_t n_elems, size_t elem_size,
                            const char *what)
{
  void *p = n_elems <= SIZE_MAX / elem_size ? alloc_bytes_on(d->model->device, c, n_elems * elem_size) : NULL;
  if (!p && !d->round_failed) {
    d->round_failed = 1;
    snprintf(d->round_what, sizeof d->round_what, "out of memory for %s (%zu elements)", what, n_elems);
  }
  return p;
}

static void *round_alloc(struct dp *d, enum alloc_category c, size_t n_elems, const char *what)
{
  return round_alloc_of(d, c, n_elems, sizeof(real), what);
}

/* The end of a round: 0 when every rank allocated everything, else −1 on every rank (the pass
 * stops, d->aborted; the fault names the first rank that failed and what it was allocating). */
static int round_end(struct dp *d)
{
  char msg[COMM_AGREE_MSG_MAX];
  snprintf(msg, sizeof msg, "%s", d->round_what);
  const int failed = d->round_failed;
  d->round_failed = 0;
  if (!comm_agree_err(d->agree, failed ? -1 : 0, msg, sizeof msg, COMM_AGREE_NAME_RANK))
    return 0;
  fault_set(FAULT_OF(d), FAULT_LEVEL_DP, "%.500s", msg);
  d->aborted = 1;
  return -1;
}

/* ---- ZeRO-3 gathers (no-ops under 0-2, where every unit is always held) ----
 *
 * A bf16 model's passes read bf16 copies of the weights only, and its fp32 master stays sharded
 * with the optimizer: a unit's gather moves the bf16 copies of the ranks' shards (rounded by
 * AdamW as it updated them, so the same bits a zero-0 copy holds) into copies allocated for the
 * unit and freed with it; no fp32 weight is gathered. The bill counts them with the unit
 * (layout/pieces.h). */

/* Room for unit u's gathered parameters (a bf16 model's copies), when it is not held and has
 * none. */
static void unit_alloc(struct dp *d, int u)
{
  struct dp_unit_state *s = &d->units[u];
  if (s->hold != DP_UNIT_FREE || s->params || s->copies)
    return;
  const struct dp_unit *unit = &d->layout.units[u];
  const struct dp_bucket *first = &d->layout.buckets[unit->first_bucket];
  const struct dp_bucket *last = &d->layout.buckets[unit->last_bucket];
  const size_t n = last->start + last->n_elems - first->start;
  char what[64];
  if (d->model->bf16) { /* the copies lie at the flat layout's offsets (dp_buckets.h) */
    snprintf(what, sizeof what, "the bf16 copies of unit %d", u);
    s->copies_start = first->start;
    s->copies = round_alloc_of(d, ALLOC_PARAMS, n, sizeof(bf16), what);
    return;
  }
  snprintf(what, sizeof what, "gathering the parameters of unit %d", u);
  s->params = round_alloc(d, ALLOC_PARAMS, n, what);
}

/* Unit u's gathered parameters and copies go (their gathers ended). */
static void unit_free(struct dp *d, int u)
{
  struct dp_unit_state *s = &d->units[u];
  const struct dp_unit *unit = &d->layout.units[u];
  for (int b = unit->first_bucket; s->hold != DP_UNIT_FREE && b >= 0 && b <= unit->last_bucket; b++)
    dp_bind_bucket(d, b, NULL, 0);
  model_bf16_bind(d->model, unit->first_param, unit->last_param, NULL, 0);
  alloc_free(s->params); /* a room a failed round made, or a gathered unit */
  alloc_free(s->copies);
  s->params = NULL;
  s->copies = NULL;
  s->hold = DP_UNIT_FREE;
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
    if (s->copies) { /* a bf16 model: its copies, bound once they arrived (unit_hold) */
      dp_all_gather_bf16(d, b, d->shard_bf16 + k->shard_offset, s->copies + (k->start - first->start), k->share,
                         &s->reqs[b - unit->first_bucket]);
      continue;
    }
    real *at = s->params + (k->start - first->start);
    dp_all_gather(d, b, d->shard_params + k->shard_offset, at, k->share, &s->reqs[b - unit->first_bucket]);
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
      dp_fail(d, s->copies ? "bf16 weight all-gather" : "parameter all-gather");
    s->hold = DP_UNIT_HELD;
    if (s->copies) /* a bf16 model: the passes read the gathered copies */
      model_bf16_bind(d->model, unit->first_param, unit->last_param, s->copies, s->copies_start);
  }
}

static void unit_release(struct dp *d, int u)
{
  struct dp_unit_state *s = &d->units[u];
  if (d->zero < 3 || s->hold == DP_UNIT_FREE)
    return;
  unit_hold(d, u); /* a gather in flight must end before its buffer goes */
  unit_free(d, u);
}

/* ---- gradient buckets ---- */

/* Ends bucket b's reduction; under zero 2 and 3 adds its share into the shard and frees the
 * bucket's gradients. */
static void bucket_finish(struct dp *d, int b)
{
  struct dp_bucket_state *s = &d->buckets[b];
  if (comm_wait(&s->req))
    dp_fail(d, d->zero >= 2 ? "gradient reduce-scatter" : "gradient all-reduce");
  if (d->zero < 2 || d->grads_step) /* "step": reduce-scattered into the shard itself */
    return;
  const struct dp_bucket *k = &d->layout.buckets[b];
  if (s->recv && d->shard_gbf16) /* precision.grads = "bf16": one rounding per reduction */
    d->model->k->accumulate_bf16(d->model->kctx, d->shard_gbf16 + k->shard_offset, (const bf16 *)s->recv, k->share);
  else if (s->recv) {
    real *shard = d->shard_grads + k->shard_offset;
    d->model->k->vec_add(d->model->kctx, shard, shard, s->recv, k->share);
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

/* Zero 2, 3 with zero_every.grads = "step": the step's whole gradients, zeroed, at its first
 * backward (in that piece's round), every bucket's gradients pointed there. */
static void step_grads_ready(struct dp *d)
{
  if (d->step_grads || d->step_gbf16)
    return;
  if (d->shard_gbf16) { /* bf16 gradients: the whole of them in bf16, summed unit by unit */
    d->step_gbf16 = round_alloc_of(d, ALLOC_GRADS, d->layout.n_elems, sizeof(bf16), "the step's gradients");
    return;
  }
  d->step_grads = round_alloc(d, ALLOC_GRADS, d->layout.n_elems, "the step's gradients");
  for (int b = 0; d->step_grads && b < d->layout.n_buckets; b++)
    dp_bind_bucket(d, b, d->step_grads + d->layout.buckets[b].start, 1);
}

/* Under zero 2 and 3: gives unit u's buckets zeroed gradients (a bucket still reducing from the
 * last micro-batch is finished first). */
static void buckets_ready_for(struct dp *d, int u)
{
  if (d->zero < 2)
    return;
  if (d->grads_step) {
    step_grads_ready(d);
    return;
  }
  const struct dp_unit *unit = &d->layout.units[u];
  for (int b = unit->first_bucket; unit->first_bucket >= 0 && b <= unit->last_bucket; b++) {
    struct dp_bucket_state *s = &d->buckets[b];
    for (int i = 0; i < d->n_inflight; i++)
      if (d->inflight[i] == b) { /* in issue order: every rank waits for the same ones */
        for (int k = 0; k <= i; k++)
          inflight_finish_oldest(d);
        break;
      }
    if (s->grads)
      continue; /* already filling in this backward */
    /* precision.grads = "bf16": the fp32 sums and, after them, their bf16 image (bucket_start) */
    s->grads = round_alloc_of(d, ALLOC_GRADS, d->layout.buckets[b].n_elems,
                              d->shard_gbf16 ? sizeof(real) + sizeof(bf16) : sizeof(real), "a gradient bucket");
    if (s->grads)
      dp_bind_bucket(d, b, s->grads, 1);
  }
}

/* ---- bf16 gradients kept whole (precision.grads = "bf16": dp.h grads_gbf16 under zero 0 and 1,
 * step_gbf16 under zero 2 and 3 with zero_every.grads = "step") ---- */

/* Points unit u's parameters' gradients at `area` (its span's first element), or NULL. */
static void unit_bind_grads(struct dp *d, int u, real *area, size_t start)
{
  const struct dp_unit *unit = &d->layout.units[u];
  for (int i = unit->first_param; unit->first_param >= 0 && i <= unit->last_param; i++) {
    struct model_param *p = &d->model->params[i];
    p->grad = area ? area + (p->offset - start) : NULL;
  }
}

/* Unit u's fp32 area, zeroed (the allocator's), with room for its bf16 image after it, unless it
 * has one already (a tied embedding's, from the head's backward on). In the piece's round. */
static void unit_grads_ready(struct dp *d, int u)
{
  if (d->unit_grads[u])
    return;
  size_t start, n = dp_unit_span(&d->layout, &d->model->table, u, &start);
  d->unit_grads[u] = round_alloc_of(d, ALLOC_GRADS, n, sizeof(real) + sizeof(bf16), "a unit's gradients");
  if (d->unit_grads[u])
    unit_bind_grads(d, u, d->unit_grads[u], start);
}

/* Unit u's gradients are final for this pass: its sums rounded into the image, added into the
 * whole bf16 gradients (accumulate_bf16), the area freed. */
static void unit_grads_fold(struct dp *d, int u)
{
  real *area = d->unit_grads[u];
  if (!area)
    return;
  size_t start, n = dp_unit_span(&d->layout, &d->model->table, u, &start);
  bf16 *image = (bf16 *)(area + n), *whole = d->grads_gbf16 ? d->grads_gbf16 : d->step_gbf16;
  d->model->k->round_bf16(d->model->kctx, image, area, n);
  d->model->k->accumulate_bf16(d->model->kctx, whole + start, image, n);
  unit_bind_grads(d, u, NULL, 0);
  alloc_free(area);
  d->unit_grads[u] = NULL;
}

/* Starts bucket b's reduction; under zero 2, 3 into the output units_final made, or with
 * zero_every.grads = "step" into the shard (written once a step). */
static void bucket_start(struct dp *d, int b)
{
  const struct dp_bucket *k = &d->layout.buckets[b];
  struct dp_bucket_state *s = &d->buckets[b];
  if (d->zero < 2 && d->grads_gbf16)
    dp_all_reduce_bf16(d, b, d->grads_gbf16 + k->start, k->n_elems, &s->req);
  else if (d->zero < 2)
    dp_all_reduce(d, b, d->model->grad_memory + k->start, k->n_elems, &s->req);
  else if (d->grads_step && d->step_gbf16)
    dp_reduce_scatter_bf16(d, b, d->step_gbf16 + k->start, d->shard_gbf16 + k->shard_offset, k->share, &s->req);
  else if (d->grads_step)
    dp_reduce_scatter(d, b, d->step_grads + k->start, d->shard_grads + k->shard_offset, k->share, &s->req);
  else if (d->shard_gbf16) { /* the bucket's sums rounded once, into the image after them */
    bf16 *image = (bf16 *)(s->grads + k->n_elems);
    d->model->k->round_bf16(d->model->kctx, image, s->grads, k->n_elems);
    dp_reduce_scatter_bf16(d, b, image, (bf16 *)s->recv, k->share, &s->req);
  } else
    dp_reduce_scatter(d, b, s->grads, s->recv, k->share, &s->req);
  d->inflight[d->n_inflight++] = b;
}

/* Zero 2, 3: the gradients of units[0 .. n) are final for this pass: their buckets reduce, the
 * last bucket first. "micro_batch": in every backward, after the reductions still in flight
 * (the unit before's, which had this piece's backward to run) are finished, into outputs
 * allocated in one round; "step": in the stage's last backward only, into the shard (no memory,
 * so no round), every reduction left in flight until dp_reduce_rest. 0, or −1 when the round
 * failed. */
static int units_final(struct dp *d, const struct dp_pass *ps, const int *units, int n)
{
  const struct dp_layout *l = &d->layout;
  if (d->grads_step) {
    if (!ps->last)
      return 0;
  } else {
    while (d->n_inflight > 0)
      inflight_finish_oldest(d);
    for (int i = 0; i < n; i++)
      for (int b = l->units[units[i]].first_bucket; b >= 0 && b <= l->units[units[i]].last_bucket; b++)
        d->buckets[b].recv = round_alloc_of(d, ALLOC_COMM, l->buckets[b].share,
                                            d->shard_gbf16 ? sizeof(bf16) : sizeof(real), "a reduce-scatter output");
    if (round_end(d))
      return -1;
  }
  for (int i = 0; i < n; i++)
    for (int b = l->units[units[i]].last_bucket; b >= 0 && b >= l->units[units[i]].first_bucket; b--)
      bucket_start(d, b);
  return 0;
}

/* Zero 0, 1: the gradients of parameters from `first_final` on are final: reduce every bucket
 * that now is, in the stage's last backward (d->reducing). */
static int grads_final_from(struct dp *d, int first_final)
{
  if (!d->reducing) /* the same on every rank */
    return 0;
  int stop = d->next_bucket;
  while (stop >= 0 && d->layout.buckets[stop].first_held >= first_final)
    stop--;
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
  /* zero ≥ 2: the round of this piece's gradient buffers (none once a "step" buffer exists: the
   * same on every rank, which all allocated it at the same piece) */
  /* bf16 gradients kept whole (zero 0, 1; zero 2, 3 once a step): per-unit fp32 areas */
  const int fold = d->grads_gbf16 || (d->grads_step && d->shard_gbf16);
  const int round = (d->zero >= 2 && !(d->grads_step && d->step_grads)) || fold;
  switch (pc.kind) {
  case PIECE_EMBED_FWD: model_embed_forward(m, ps->a, ps->tokens, ps->dropout, ps->B, ps->T); break;
  case PIECE_LAYER_FWD: model_layer_forward(m, ps->a, pc.layer, ps->dropout); break;
  case PIECE_HEAD_FWD: *loss = model_head_forward(m, ps->a, ps->targets); break;
  case PIECE_HEAD_BWD: {
    const int head = m->config.n_layers + 1;
    const struct dp_unit *u = &l->units[head];
    buckets_ready_for(d, head);
    if (tied)
      buckets_ready_for(d, 0);
    if (fold) {
      unit_grads_ready(d, head);
      if (tied)
        unit_grads_ready(d, 0);
    }
    if (round && round_end(d))
      return -1;
    model_bind_views(m);
    model_head_backward(m, ps->a, ps->loss_scale);
    if (fold) {
      unit_grads_fold(d, head);
      if (tied && !ps->stage->has_embed)
        unit_grads_fold(d, 0);
    }
    if (d->zero < 2)
      return grads_final_from(d, u->first_param);
    /* a tied embedding's gradient is final here on a last stage without the embedding */
    const int final[2] = { head, 0 };
    return units_final(d, ps, final, tied && !ps->stage->has_embed ? 2 : 1);
  }
  case PIECE_LAYER_BWD: {
    const int unit = 1 + pc.layer;
    buckets_ready_for(d, unit);
    if (fold)
      unit_grads_ready(d, unit);
    if (round && round_end(d))
      return -1;
    model_bind_views(m);
    ps->a->loss_scale = ps->loss_scale;
    model_layer_backward(m, ps->a, pc.layer);
    if (fold)
      unit_grads_fold(d, unit);
    return d->zero < 2 ? grads_final_from(d, l->units[unit].first_param) : units_final(d, ps, &unit, 1);
  }
  case PIECE_EMBED_BWD: {
    const int unit = 0;
    buckets_ready_for(d, unit);
    if (fold)
      unit_grads_ready(d, unit);
    if (round && round_end(d))
      return -1;
    model_bind_views(m);
    model_embed_backward(m, ps->a);
    if (fold)
      unit_grads_fold(d, unit);
    if (d->zero >= 2)
      return units_final(d, ps, &unit, 1);
    if (!ps->embed_waits) /* zero 0, 1: a tied embedding is summed between the stages first */
      return grads_final_from(d, 0);
    break;
  }
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
  if (d->shard_gbf16)
    m->k->zero(m->kctx, d->shard_gbf16, d->layout.n_shard * sizeof(bf16));
  if (d->grads_gbf16)
    m->k->zero(m->kctx, d->grads_gbf16, d->layout.n_elems * sizeof(bf16));
  d->reducing = 0;
  d->next_bucket = d->layout.n_buckets - 1;
}

/* Whether stage st's pieces read unit u (zero_every.params = "step" frees only its own). */
static int stage_reads(const struct dp *d, const struct plan_stage *st, int u)
{
  const int L = d->model->config.n_layers;
  if (u == 0)
    return st->has_embed || (st->has_head && d->model->config.tie_embeddings);
  if (u == L + 1)
    return st->has_head;
  return st->first_layer >= 0 && u - 1 >= st->first_layer && u - 1 < st->first_layer + st->n_layers;
}

double dp_run_pass(struct dp *d, const struct dp_pass *ps, const struct piece *then)
{
  struct piece *pcs = d->pieces;
  const int n = pieces_of_stage(ps->stage, ps->backward, pcs);
  double loss = 0.0;
  /* zero_every.params = "step": the stage's gathered units stay until its last backward, which
   * frees each after the last of its pieces that reads it */
  const int step_held = d->zero == 3 && d->params_step && ps->in_step;
  ps->a->moe_in_step = ps->in_step;
  const int keep = step_held && !(ps->backward && ps->last);
  if (!ps->backward && !ps->stage->has_embed) /* the input came from the stage before */
    model_forward_begin(d->model, ps->a, ps->dropout, ps->B, ps->T);
  if (ps->backward)
    d->reducing = d->zero < 2 && ps->last;
  for (int k = 0; k < n && !d->aborted; k++) {
    const struct piece *next = k + 1 < n ? &pcs[k + 1] : then;
    int units[2], n_units = units_of(d, &pcs[k], units);
    int next_units[2], n_next = units_of(d, next, next_units);
    if (d->zero == 3) { /* the round of this piece's gathers and the next one's */
      for (int i = 0; i < n_units; i++)
        unit_alloc(d, units[i]);
      for (int i = 0; i < n_next; i++)
        unit_alloc(d, next_units[i]);
      if (round_end(d))
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
    for (int u = 0; u < d->layout.n_units && !keep; u++) {
      int needed = piece_needs(d, next, u);
      for (int j = k + 2; step_held && j < n && !needed; j++) needed = piece_needs(d, &pcs[j], u);
      if (stage_reads(d, ps->stage, u) && !needed)
        unit_release(d, u);
    }
  }
  model_bind_views(d->model);
  d->reducing = 0;
  return loss;
}

/* Zero 2, 3 with zero_every.grads = "step": the step's whole gradients go (their reductions ended). */
static void step_grads_free(struct dp *d)
{
  alloc_free(d->step_gbf16);
  d->step_gbf16 = NULL;
  if (!d->step_grads)
    return;
  for (int b = 0; b < d->layout.n_buckets; b++)
    dp_bind_bucket(d, b, NULL, 1);
  alloc_free(d->step_grads);
  d->step_grads = NULL;
}

void dp_pass_abort(struct dp *d)
{
  /* reductions in flight first (their buckets' gradients and outputs), then the rest */
  while (d->n_inflight > 0) {
    const int b = d->inflight[0];
    memmove(d->inflight, d->inflight + 1, (size_t)(--d->n_inflight) * sizeof *d->inflight);
    comm_wait(&d->buckets[b].req);
  }
  step_grads_free(d);
  for (int b = 0; b < d->layout.n_buckets; b++) {
    struct dp_bucket_state *s = &d->buckets[b];
    if (d->zero >= 2 && s->grads)
      dp_bind_bucket(d, b, NULL, 1);
    alloc_free(s->grads);
    alloc_free(s->recv);
    s->grads = s->recv = NULL;
  }
  for (int u = 0; u < d->layout.n_units && d->unit_grads; u++) { /* bf16 gradients' areas */
    if (d->unit_grads[u])
      unit_bind_grads(d, u, NULL, 0);
    alloc_free(d->unit_grads[u]);
    d->unit_grads[u] = NULL;
  }
  for (int u = 0; u < d->layout.n_units && d->zero == 3; u++) {
    struct dp_unit_state *s = &d->units[u];
    const struct dp_unit *unit = &d->layout.units[u];
    if (s->hold == DP_UNIT_GATHERING)
      comm_wait_all(s->reqs, unit->last_bucket - unit->first_bucket + 1);
    unit_free(d, u);
  }
  model_bind_views(d->model);
  d->reducing = 0;
  d->next_bucket = -1;
  d->round_failed = 0;
  d->aborted = 0;
}

/* The tied embedding's gradient summed between the first and last stage: zero 0, 1 the whole
 * of it (before its bucket reduces), zero 2, 3 this rank's share of its bucket (after). */
static int embed_sum(struct dp *d, struct comm_group *embed)
{
  if (!embed)
    return 0;
  const struct model_param *e = &d->model->params[0];
  void *at = d->grads_gbf16 ? (void *)(d->grads_gbf16 + e->offset) : (void *)e->grad;
  size_t n = e->n_elems;
  enum comm_dtype type = d->grads_gbf16 ? COMM_BF16 : COMM_REAL;
  if (d->zero >= 2) {
    const struct dp_bucket *k = &d->layout.buckets[d->layout.param_bucket[0]];
    at = d->shard_gbf16 ? (void *)(d->shard_gbf16 + k->shard_offset) : (void *)(d->shard_grads + k->shard_offset);
    type = d->shard_gbf16 ? COMM_BF16 : COMM_REAL;
    n = k->share;
  }
  if (dcomm_all_reduce(DCOMM_OF(d->model), embed, at, at, n, type, COMM_SUM, NULL))
    return dp_fail(d, "all-reduce of the tied embedding's gradient");
  return 0;
}

int dp_reduce_rest(struct dp *d, struct comm_group *embed)
{
  if (d->zero < 2) {
    embed_sum(d, embed);
    while (d->next_bucket >= 0)
      bucket_start(d, d->next_bucket--);
  }
  d->reducing = 0;
  while (d->n_inflight > 0)
    inflight_finish_oldest(d);
  step_grads_free(d);
  if (d->zero >= 2)
    embed_sum(d, embed);
  return FAULT_OF(d)->set ? -1 : 0;
}
