/* After backward under data parallelism (dp.h): sums of doubles over the group that come out
 * the same on every rank, the global gradient norm, clipping, and the AdamW update on the
 * elements this rank owns followed (zero 1, 2) by the all-gather of the new weights (a bf16
 * model's copies, in bf16). Kernels go through
 * the model's table (d->model->k), as in optimizer.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "ops.h"
#include "runtime/model/alloc.h"
#include "runtime/parallel/dp.h"

/* out = Σ over group g of local, in rank order (the same bits everywhere). */
static int ordered_sum(struct dp *d, struct comm_group *g, const double *local, double *out, int n);

int dp_sum(struct dp *d, const double *local, double *out, int n)
{
  return ordered_sum(d, d->group, local, out, n);
}

static int ordered_sum(struct dp *d, struct comm_group *g, const double *local, double *out, int n)
{
  const int size = g ? g->size : 1;
  if (size == 1) {
    memcpy(out, local, (size_t)n * sizeof *out);
    return 0;
  }
  /* All-gathered as 64-bit words (moved, never reduced by MPI), then summed here in rank
   * order: every rank adds the same numbers in the same order. */
  int64_t mine[8];
  int64_t *all = malloc((size_t)size * (size_t)n * sizeof *all);
  if (!all || n > 8) {
    free(all);
    return fault_set(FAULT_OF(d), FAULT_LEVEL_DP, "dp_sum: out of memory");
  }
  memcpy(mine, local, (size_t)n * sizeof(double));
  if (comm_all_gather(g, mine, all, (size_t)n, COMM_INT64, NULL)) {
    free(all);
    return dp_fail(d, "all-gather of the loss and norm");
  }
  for (int i = 0; i < n; i++) {
    double sum = 0.0;
    for (int r = 0; r < size; r++) {
      double x;
      memcpy(&x, &all[(size_t)r * (size_t)n + (size_t)i], sizeof x);
      sum += x;
    }
    out[i] = sum;
  }
  free(all);
  return 0;
}

/* This rank's share of bucket b's gradients (valid after dp_reduce_rest); precision.grads =
 * "bf16": the bf16 shard's share widened (exact) into `scratch`. */
static real *share_grads(struct dp *d, int b, real *scratch)
{
  const struct dp_bucket *k = &d->layout.buckets[b];
  if (d->shard_gbf16) {
    d->model->k->widen_bf16(d->model->kctx, scratch, d->shard_gbf16 + k->shard_offset, k->share);
    return scratch;
  }
  if (d->grads_gbf16) {
    const size_t at = k->start + (size_t)dp_bucket_rank(d, b) * k->share;
    d->model->k->widen_bf16(d->model->kctx, scratch, d->grads_gbf16 + at, k->share);
    return scratch;
  }
  if (d->zero >= 2)
    return d->shard_grads + k->shard_offset;
  return d->model->grad_memory + k->start + (size_t)dp_bucket_rank(d, b) * k->share;
}

/* precision.grads = "bf16": room for the largest share widened (zero 0: the largest bucket, which
 * AdamW updates whole), billed "grads" while the norm or the update runs; else NULL. 0, or -1
 * (FAULT_OF(d)) when there is none. */
static int widen_scratch(struct dp *d, real **scratch)
{
  *scratch = NULL;
  if (!d->shard_gbf16 && !d->grads_gbf16)
    return 0;
  size_t most = 0;
  for (int b = 0; b < d->layout.n_buckets; b++) {
    const size_t n = d->zero == 0 ? d->layout.buckets[b].n_elems : d->layout.buckets[b].share;
    most = n > most ? n : most;
  }
  *scratch = alloc_reals_on(d->model->device, ALLOC_GRADS, most);
  return *scratch ? 0 : fault_set(FAULT_OF(d), FAULT_LEVEL_DP, "out of memory widening a bf16 gradient share "
                                  "(%zu elements)", most);
}

double dp_grad_norm(struct dp *d)
{
  double local = 0.0, total;
  const struct model *m = d->model;
  real *scratch;
  if (widen_scratch(d, &scratch))
    return -1.0;
  const int pp = d->pp_group ? d->pp_group->size : 1;
  if (m->tp.size == 1 && pp == 1) {
    for (int b = 0; b < d->layout.n_buckets; b++) /* the padding holds zeros */
      local += m->k->sumsq(m->kctx, share_grads(d, b, scratch), d->layout.buckets[b].share);
  } else {
    /* Split parameters count on every TP rank, whole ones on TP rank 0 only; a tied embedding
     * held by the last pipeline stage as its head counts on the first stage only. */
    for (int b = 0; b < d->layout.n_buckets; b++) {
      const struct dp_bucket *k = &d->layout.buckets[b];
      const size_t s0 = k->start + (size_t)dp_bucket_rank(d, b) * k->share, s1 = s0 + k->share;
      const real *g = share_grads(d, b, scratch);
      for (int i = k->first_param; i <= k->last_param; i++) {
        const struct model_param *p = &m->params[i];
        if ((p->tp_dim < 0 && m->tp.rank != 0) || (p->kind == MODEL_EMBED && !m->embed_here))
          continue;
        size_t lo = p->offset > s0 ? p->offset : s0;
        size_t hi = p->offset + p->n_elems < s1 ? p->offset + p->n_elems : s1;
        if (lo < hi)
          local += m->k->sumsq(m->kctx, g + (lo - s0), hi - lo);
      }
    }
  }
  alloc_free(scratch);
  if (dp_sum(d, &local, &total, 1))
    return -1.0;
  if (m->tp.size > 1) {
    double over_dp = total;
    if (ordered_sum(d, m->tp.group, &over_dp, &total, 1))
      return -1.0;
  }
  if (pp > 1) {
    double over_tp = total;
    if (ordered_sum(d, d->pp_group, &over_tp, &total, 1))
      return -1.0;
  }
  return sqrt(total);
}

int dp_update(struct dp *d, struct optimizer *o, long long step, double lr, real grad_scale)
{
  struct model *m = d->model;
  if (d->zero == 0 && d->grads_gbf16) { /* bucket by bucket, each one's bf16 gradients widened */
    real *scratch;
    if (widen_scratch(d, &scratch))
      return -1;
    for (int b = 0; b < d->layout.n_buckets; b++) {
      const struct dp_bucket *k = &d->layout.buckets[b];
      m->k->widen_bf16(m->kctx, scratch, d->grads_gbf16 + k->start, k->n_elems);
      optimizer_update_range(o, m, k->start, k->n_elems, m->param_memory + k->start, scratch, k->start, step, lr,
                             grad_scale, m->bf16_memory ? m->bf16_memory + k->start : NULL);
    }
    alloc_free(scratch);
    return FAULT_OF(d)->set ? -1 : 0;
  }
  if (d->zero == 0) {
    optimizer_update_range(o, m, 0, d->layout.n_elems, m->param_memory, m->grad_memory, 0, step, lr,
                           grad_scale, m->bf16_memory);
    return FAULT_OF(d)->set ? -1 : 0;
  }
  /* A bf16 model writes the copies of what it updates: its slice of the whole copies (zero 1, 2),
   * or the shard's copies (zero 3) */
  const int sharded = dp_master_sharded(d);
  real *scratch;
  if (widen_scratch(d, &scratch))
    return -1;
  for (int b = 0; b < d->layout.n_buckets; b++) {
    const struct dp_bucket *k = &d->layout.buckets[b];
    size_t flat = k->start + (size_t)dp_bucket_rank(d, b) * k->share;
    real *params = sharded ? d->shard_params + k->shard_offset : m->param_memory + flat;
    bf16 *copies = !m->bf16 ? NULL : d->zero == 3 ? d->shard_bf16 + k->shard_offset : m->bf16_memory + flat;
    optimizer_update_range(o, m, flat, k->share, params, share_grads(d, b, scratch), k->shard_offset, step, lr,
                           grad_scale, copies);
  }
  alloc_free(scratch);
  if (d->zero == 3)
    return FAULT_OF(d)->set ? -1 : 0;
  /* Zero 1, 2: every rank gets every bucket's new weights, in place: a bf16 model's copies in
   * bf16 (its fp32 master stays sharded), an fp32 model's parameters. */
  struct comm_request **reqs = d->gather_reqs;
  for (int b = 0; b < d->layout.n_buckets; b++) {
    const struct dp_bucket *k = &d->layout.buckets[b];
    const size_t mine = (size_t)dp_bucket_rank(d, b) * k->share;
    if (m->bf16) {
      bf16 *bucket = m->bf16_memory + k->start;
      dp_all_gather_bf16(d, b, bucket + mine, bucket, k->share, &reqs[b]);
    } else {
      real *bucket = m->param_memory + k->start;
      dp_all_gather(d, b, bucket + mine, bucket, k->share, &reqs[b]);
    }
  }
  if (comm_wait_all(reqs, d->layout.n_buckets))
    dp_fail(d, m->bf16 ? "bf16 weight all-gather" : "parameter all-gather");
  return FAULT_OF(d)->set ? -1 : 0;
}
