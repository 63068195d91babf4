/* The data-parallel layer's set-up and the memory it keeps (dp.h): what each ZeRO stage
 * allocates, initialization one bucket at a time under ZeRO-3, gathering every parameter on
 * rank 0 for export, and the collectives with their one-rank stand-ins. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "runtime/parallel/dcomm.h"
#include "ops.h"
#include "runtime/model/alloc.h"
#include "runtime/parallel/dp.h"
#include "runtime/model/hostview.h"
#include "runtime/model/weights.h"
#include "util/err.h"

int dp_fail(struct dp *d, const char *what)
{
  return fault_set(FAULT_OF(d), FAULT_LEVEL_DP, "%s: %s", what, comm_error());
}

struct comm_group *dp_bucket_group(const struct dp *d, int b)
{
  return d->layout.buckets[b].expert ? d->edp : d->group;
}

int dp_bucket_size(const struct dp *d, int b)
{
  return d->layout.buckets[b].expert ? d->edp_size : d->size;
}

int dp_bucket_rank(const struct dp *d, int b)
{
  return d->layout.buckets[b].expert ? d->edp_rank : d->rank;
}

/* Bucket b's gradient sums of elem_size-byte elements of comm type `type` (fp32 or, for bf16
 * gradients, bf16): an all-reduce of recv in place (all = 1) or a reduce-scatter of send's shares
 * into recv; a group of one moves nothing, or copies. */
static int reduce_typed(struct dp *d, int b, const void *send, void *recv, size_t n_elems, size_t elem_size,
                        enum comm_dtype type, int all, struct comm_request **req)
{
  *req = NULL;
  struct comm_group *g = dp_bucket_group(d, b);
  if (!g || g->size == 1) { /* a group of one: nothing to move */
    if (!all)
      d->model->k->copy(d->model->kctx, recv, send, n_elems * elem_size);
    return 0;
  }
  const int bf = type == COMM_BF16;
  if (all)
    return dcomm_all_reduce(DCOMM_OF(d->model), g, recv, recv, n_elems, type, COMM_SUM, req)
             ? dp_fail(d, bf ? "gradient all-reduce (bf16)" : "gradient all-reduce") : 0;
  return dcomm_reduce_scatter(DCOMM_OF(d->model), g, send, recv, n_elems, type, COMM_SUM, req)
           ? dp_fail(d, bf ? "gradient reduce-scatter (bf16)" : "gradient reduce-scatter") : 0;
}

int dp_all_reduce(struct dp *d, int b, real *buf, size_t n_elems, struct comm_request **req)
{
  return reduce_typed(d, b, NULL, buf, n_elems, sizeof(real), COMM_REAL, 1, req);
}

int dp_all_reduce_bf16(struct dp *d, int b, bf16 *buf, size_t n_elems, struct comm_request **req)
{
  return reduce_typed(d, b, NULL, buf, n_elems, sizeof(bf16), COMM_BF16, 1, req);
}

int dp_reduce_scatter(struct dp *d, int b, const real *send, real *recv, size_t n_elems,
                      struct comm_request **req)
{
  return reduce_typed(d, b, send, recv, n_elems, sizeof(real), COMM_REAL, 0, req);
}

int dp_reduce_scatter_bf16(struct dp *d, int b, const bf16 *send, bf16 *recv, size_t n_elems,
                           struct comm_request **req)
{
  return reduce_typed(d, b, send, recv, n_elems, sizeof(bf16), COMM_BF16, 0, req);
}

/* An all-gather of bucket b's shares of elem_size-byte elements of comm type `type`, in place or
 * not; a group of one copies. */
static int all_gather_typed(struct dp *d, int b, const void *send, void *recv, size_t n_elems, size_t elem_size,
                            enum comm_dtype type, const char *what, struct comm_request **req)
{
  *req = NULL;
  struct comm_group *g = dp_bucket_group(d, b);
  if (!g || g->size == 1) {
    if (send != recv)
      d->model->k->copy(d->model->kctx, recv, send, n_elems * elem_size);
    return 0;
  }
  return dcomm_all_gather(DCOMM_OF(d->model), g, send, recv, n_elems, type, req) ? dp_fail(d, what) : 0;
}

int dp_all_gather(struct dp *d, int b, const real *send, real *recv, size_t n_elems,
                  struct comm_request **req)
{
  return all_gather_typed(d, b, send, recv, n_elems, sizeof(real), COMM_REAL, "parameter all-gather", req);
}

int dp_all_gather_bf16(struct dp *d, int b, const bf16 *send, bf16 *recv, size_t n_elems,
                       struct comm_request **req)
{
  return all_gather_typed(d, b, send, recv, n_elems, sizeof(bf16), COMM_BF16, "bf16 weight all-gather", req);
}

void dp_bind_bucket(struct dp *d, int b, real *base, int grads)
{
  const struct dp_bucket *k = &d->layout.buckets[b];
  for (int i = k->first_param; i <= k->last_param; i++) {
    struct model_param *p = &d->model->params[i];
    real *at = base ? base + (p->offset - k->start) : NULL;
    if (grads)
      p->grad = at;
    else
      p->data = at;
  }
}

int dp_open(struct dp *d, struct model *m, struct comm_group *group, struct comm_group *edp, int zero,
            double bucket_mb, char *err, size_t err_size)
{
  memset(d, 0, sizeof *d);
  d->group = group;
  d->size = group ? group->size : 1;
  d->rank = group ? group->rank : 0;
  d->edp = edp;
  d->edp_size = edp ? edp->size : 1;
  d->edp_rank = edp ? edp->rank : 0;
  const int ep = m->ep.size > 1 ? m->ep.size : 1;
  if (ep > 1 && (d->size % ep || d->edp_size != d->size / ep || d->rank / ep != d->edp_rank))
    return errf(err, err_size, "mesh.ep = %d: the expert-data-parallel group has %d rank%s (rank %d), the "
                "data-parallel group %d (rank %d)", ep, d->edp_size, d->edp_size == 1 ? "" : "s", d->edp_rank,
                d->size, d->rank);
  d->zero = zero;
  d->model = m;
  if (dp_layout_build(&d->layout, m, d->size, zero, bucket_mb, err, err_size))
    return -1;
  const struct dp_layout *l = &d->layout;
  d->buckets = calloc((size_t)l->n_buckets, sizeof *d->buckets);
  d->units = calloc((size_t)l->n_units, sizeof *d->units);
  d->inflight = calloc((size_t)l->n_buckets, sizeof *d->inflight);
  d->gather_reqs = calloc((size_t)l->n_buckets, sizeof *d->gather_reqs);
  int ok = d->buckets && d->units && d->inflight && d->gather_reqs && dp_pieces_alloc(d) == 0;
  for (int u = 0; ok && u < l->n_units; u++) {
    const struct dp_unit *unit = &l->units[u];
    d->units[u].hold = zero == 3 ? DP_UNIT_FREE : DP_UNIT_HELD;
    d->units[u].reqs = calloc((size_t)(unit->last_bucket - unit->first_bucket + 1),
                              sizeof *d->units[u].reqs);
    ok = d->units[u].reqs != NULL;
  }
  /* a bf16 model's fp32 weights are the master, optimizer state (whole under zero 0, the shard
   * from zero 1 on); an fp32 model's are its parameters (the shard under zero 3) */
  const enum alloc_category master = m->bf16 ? ALLOC_OPTIMIZER : ALLOC_PARAMS;
  const int sharded = dp_master_sharded(d);
  if (ok && !sharded)
    ok = (m->param_memory = alloc_reals_on(m->device, master, l->n_elems)) != NULL;
  if (ok && m->grads_bf16) /* bf16 gradients kept whole are summed per unit (dp_passes.c) */
    ok = (d->unit_grads = calloc((size_t)l->n_units, sizeof *d->unit_grads)) != NULL;
  if (ok && zero < 2 && m->grads_bf16)
    ok = (d->grads_gbf16 = alloc_bytes_on(m->device, ALLOC_GRADS, l->n_elems * sizeof(bf16))) != NULL;
  else if (ok && zero < 2)
    ok = (m->grad_memory = alloc_reals_on(m->device, ALLOC_GRADS, l->n_elems)) != NULL;
  if (ok && zero < 3) /* bf16 models: the compute copies of the weights at the flat layout's */
    ok = model_bf16_alloc(m) == 0; /* offsets (zero 3: each gathered unit's, dp_passes.c) */
  if (ok && sharded)
    ok = (d->shard_params = alloc_reals_on(m->device, master, l->n_shard)) != NULL;
  if (ok && zero == 3 && m->bf16)
    ok = (d->shard_bf16 = alloc_bytes_on(m->device, ALLOC_PARAMS, l->n_shard * sizeof(bf16))) != NULL;
  if (ok && zero >= 2 && m->grads_bf16)
    ok = (d->shard_gbf16 = alloc_bytes_on(m->device, ALLOC_GRADS, l->n_shard * sizeof(bf16))) != NULL;
  else if (ok && zero >= 2)
    ok = (d->shard_grads = alloc_reals_on(m->device, ALLOC_GRADS, l->n_shard)) != NULL;
  if (!ok) {
    const size_t n_elems = l->n_elems; /* dp_close clears the layout */
    const int size = d->size;
    dp_close(d);
    return errf(err, err_size, "out of memory for the parameters and gradients (%zu elements, "
                "zero %d over %d rank%s)", n_elems, zero, size, size == 1 ? "" : "s");
  }
  model_bind_memory(m, m->param_memory, m->grad_memory);
  return 0;
}

void dp_close(struct dp *d)
{
  if (!d->model)
    return;
  for (int b = 0; b < d->layout.n_buckets && d->buckets; b++) {
    comm_wait(&d->buckets[b].req);
    alloc_free(d->buckets[b].grads);
    alloc_free(d->buckets[b].recv);
  }
  for (int u = 0; u < d->layout.n_units && d->units; u++) {
    const struct dp_unit *unit = &d->layout.units[u];
    if (d->units[u].reqs)
      comm_wait_all(d->units[u].reqs, unit->last_bucket - unit->first_bucket + 1);
    if (d->zero == 3) {
      alloc_free(d->units[u].params); /* an fp32 model's */
      alloc_free(d->units[u].copies); /* a bf16 model's, of a unit still gathered */
    }
    free(d->units[u].reqs);
    if (d->unit_grads)
      alloc_free(d->unit_grads[u]);
  }
  struct model *m = d->model;
  alloc_free(m->param_memory);
  alloc_free(m->grad_memory);
  m->param_memory = m->grad_memory = NULL;
  if (d->zero == 3) /* the units' copies went above */
    model_bf16_bind(m, 0, m->n_params - 1, NULL, 0);
  model_bind_memory(m, NULL, NULL);
  alloc_free(d->shard_params);
  alloc_free(d->shard_bf16);
  alloc_free(d->shard_grads);
  alloc_free(d->shard_gbf16);
  alloc_free(d->grads_gbf16);
  free(d->unit_grads);
  alloc_free(d->step_grads); /* a step that never reached its reductions */
  alloc_free(d->step_gbf16);
  free(d->buckets);
  free(d->units);
  free(d->inflight);
  free(d->gather_reqs);
  free(d->pieces);
  dp_layout_free(&d->layout);
  memset(d, 0, sizeof *d);
}

size_t dp_state_elems(const struct dp *d)
{
  return d->zero == 0 ? d->layout.n_elems : d->layout.n_shard;
}

static int fill_params(struct model *m, const struct plan *p, char *err, size_t err_size)
{
  if (p->init.from[0])
    return weights_load(m, p->init.from, err, err_size);
  return model_init(m, (uint64_t)p->seeds.value[PLAN_SEED_MODEL], err, err_size) ? -1 : 0;
}

int dp_init_params(struct dp *d, const struct plan *p, char *err, size_t err_size)
{
  if (!dp_master_sharded(d)) {
    if (fill_params(d->model, p, err, err_size))
      return -1;
    return dp_bf16_refresh(d) ? errf(err, err_size, "%s", FAULT_OF(d)->msg) : 0;
  }
  /* A sharded master: one bucket at a time in a staging block, keeping this rank's share (the
   * whole gradients of zero 1 stay bound; zero 2 and 3 have none). */
  int rc = 0;
  model_bind_memory(d->model, NULL, d->model->grad_memory);
  for (int b = 0; b < d->layout.n_buckets && !rc; b++) {
    const struct dp_bucket *k = &d->layout.buckets[b];
    real *staging = alloc_reals_on(d->model->device, ALLOC_PARAMS, k->n_elems);
    if (!staging)
      return errf(err, err_size, "out of memory initializing a bucket of %zu elements", k->n_elems);
    dp_bind_bucket(d, b, staging, 0);
    rc = fill_params(d->model, p, err, err_size);
    d->model->k->copy(d->model->kctx, d->shard_params + k->shard_offset,
                      staging + (size_t)dp_bucket_rank(d, b) * k->share, k->share * sizeof(real));
    dp_bind_bucket(d, b, NULL, 0);
    alloc_free(staging);
  }
  model_bind_views(d->model);
  d->model->bf16_fresh = 0; /* the copies from the shards (a bf16 model) */
  if (!rc && dp_bf16_refresh(d))
    rc = errf(err, err_size, "%s", FAULT_OF(d)->msg);
  return rc;
}

int dp_bf16_refresh(struct dp *d)
{
  struct model *m = d->model;
  if (!m->bf16 || m->bf16_fresh)
    return 0;
  if (!dp_master_sharded(d)) {
    model_bf16_sync(m);
    return 0;
  }
  /* each rank rounds its shard: into its slice of the copies (zero 1, 2; the other ranks' slices
   * come in the all-gather) or into the shard's copies (zero 3, gathered with each unit) */
  const struct dp_layout *l = &d->layout;
  for (int b = 0; b < l->n_buckets; b++) {
    const struct dp_bucket *k = &l->buckets[b];
    bf16 *to = d->zero == 3 ? d->shard_bf16 + k->shard_offset
                            : m->bf16_memory + k->start + (size_t)dp_bucket_rank(d, b) * k->share;
    m->k->round_bf16(m->kctx, to, d->shard_params + k->shard_offset, k->share);
  }
  if (d->zero < 3) {
    struct comm_request **reqs = d->gather_reqs;
    for (int b = 0; b < l->n_buckets; b++) {
      const struct dp_bucket *k = &l->buckets[b];
      bf16 *bucket = m->bf16_memory + k->start;
      dp_all_gather_bf16(d, b, bucket + (size_t)dp_bucket_rank(d, b) * k->share, bucket, k->share, &reqs[b]);
    }
    if (comm_wait_all(reqs, l->n_buckets))
      dp_fail(d, "bf16 weight all-gather");
  }
  m->bf16_fresh = !FAULT_OF(d)->set;
  return FAULT_OF(d)->set ? -1 : 0;
}

/* The dp ranks that receive a whole copy of their layout in dp_gather_params: rank 0, and with
 * expert parallelism every rank of its ep group (rank 0 of the ranks holding those experts). */
static int gathers_whole(const struct dp *d)
{
  return d->rank < (d->layout.ep > 1 ? d->layout.ep : 1);
}

int dp_gather_params(struct dp *d, real **full)
{
  *full = NULL;
  if (!dp_master_sharded(d)) {
    *full = gathers_whole(d) ? d->model->param_memory : NULL;
    return 0;
  }
  const struct dp_layout *l = &d->layout;
  const int dev = d->model->device, whole = gathers_whole(d);
  real *out = whole ? alloc_reals_on(dev, ALLOC_WORKSPACE, l->n_elems)
                    : alloc_reals_on(dev, ALLOC_WORKSPACE, l->max_bucket_elems);
  char msg[COMM_AGREE_MSG_MAX];
  snprintf(msg, sizeof msg, "out of memory gathering the parameters (%zu elements)",
           whole ? l->n_elems : l->max_bucket_elems);
  if (comm_agree_err(d->group, out ? 0 : -1, msg, sizeof msg, COMM_AGREE_NAME_RANK)) { /* before any gather: no rank waits alone */
    fault_set(FAULT_OF(d), FAULT_LEVEL_DP, "%.500s", msg);
    alloc_free(out);
    return -1;
  }
  int rc = 0;
  for (int b = 0; b < l->n_buckets && !rc; b++) {
    const struct dp_bucket *k = &l->buckets[b];
    struct comm_request *req;
    rc = dp_all_gather(d, b, d->shard_params + k->shard_offset, whole ? out + k->start : out, k->share, &req);
    rc = rc ? rc : comm_wait(&req) ? dp_fail(d, "parameter all-gather") : 0;
  }
  if (whole && !rc)
    *full = out;
  else
    alloc_free(out);
  return rc;
}

void dp_gather_params_free(struct dp *d, real *full)
{
  if (dp_master_sharded(d))
    alloc_free(full);
}

int dp_gather_whole(struct dp *d, struct model *whole, int *have, char *err, size_t err_size)
{
  const struct model *m = d->model;
  *have = 0;
  memset(whole, 0, sizeof *whole);
  real *full;
  if (dp_gather_params(d, &full))
    return errf(err, err_size, "%s", FAULT_OF(d)->msg);
  if (!full)
    return 0;
  const int tp = m->tp.size, ep = m->ep.size > 1 ? m->ep.size : 1;
  real *all = NULL;
  int rc = 0;
  if (tp > 1) {
    all = alloc_reals_on(m->device, ALLOC_WORKSPACE, (size_t)tp * m->n_elems);
    char msg[COMM_AGREE_MSG_MAX];
    snprintf(msg, sizeof msg, "out of memory gathering the tensor-parallel shards (%zu elements)",
             (size_t)tp * m->n_elems);
    if (comm_agree_err(m->tp.group, all ? 0 : -1, msg, sizeof msg, COMM_AGREE_NAME_RANK)) { /* before the gather, over the tp group */
      fault_set(FAULT_OF(d), FAULT_LEVEL_DP, "%.500s", msg);
      rc = errf(err, err_size, "%s", FAULT_OF(d)->msg);
    } else if (dcomm_all_gather(DCOMM_OF(m), m->tp.group, full, all, m->n_elems, COMM_REAL, NULL))
      rc = errf(err, err_size, "all-gather of the tensor-parallel shards: %s", comm_error());
  }
  const int pp = d->pp_group ? d->pp_group->size : 1;
  if (!rc && m->tp.rank == 0) {
    rc = model_create_table_sparse(whole, &m->config, m->moe, err, err_size); /* the same sparse layers */
    if (!rc) { /* a copy for export and tests: billed as workspace, as the ZeRO-3 gather is */
      whole->param_memory = alloc_reals_on(whole->device, ALLOC_WORKSPACE, whole->n_elems);
      if (!whole->param_memory)
        rc = errf(err, err_size, "out of memory for the whole model (%zu elements)", whole->n_elems);
      else
        model_bind_memory(whole, whole->param_memory, NULL);
    }
    for (int i = 0; !rc && i < m->n_params; i++) {
      const struct model_param *p = &m->params[i];
      if (!p->here || (p->kind == MODEL_EMBED && !m->embed_here))
        continue; /* another pipeline stage's (the first stage's, for a tied embedding) */
      if (ep > 1 && p->expert < 0 && m->ep.rank != 0)
        continue; /* ep rank 0's copy; the other ranks of its ep group add their experts */
      if (tp == 1 || p->tp_dim < 0) {
        m->k->copy(m->kctx, whole->params[i].data, full + p->offset, p->n_elems * sizeof(real));
        continue;
      }
      /* the blocks put together on the host, through views (the memory itself on the CPU) */
      const size_t n_whole = whole->params[i].n_elems * sizeof(real), n_block = p->n_elems * sizeof(real);
      real *w = hostview_open(m->k, m->kctx, whole->params[i].data, n_whole, 1);
      if (!w)
        rc = errf(err, err_size, "out of host memory putting %s together", p->name);
      for (int r = 0; r < tp && w; r++) {
        real *src = all + (size_t)r * m->n_elems + p->offset;
        real *b = hostview_open(m->k, m->kctx, src, n_block, 1);
        if (!b) {
          rc = errf(err, err_size, "out of host memory putting %s together", p->name);
          break;
        }
        model_param_put_block(p, tp, r, b, w);
        hostview_close(m->k, m->kctx, src, b, n_block, 0);
      }
      hostview_close(m->k, m->kctx, whole->params[i].data, w, n_whole, !rc);
    }
    if (!rc && ep > 1) { /* each rank's experts, zero elsewhere: summed over the ep group */
      if (dcomm_all_reduce(DCOMM_OF(m), m->ep.group, whole->param_memory, whole->param_memory, whole->n_elems,
                          COMM_REAL, COMM_SUM, NULL))
        rc = errf(err, err_size, "all-reduce of the expert-parallel ranks' experts: %s", comm_error());
    }
    if (!rc && ep > 1 && d->rank != 0) { /* only dp rank 0 goes on to the pipeline's sum */
      model_free(whole);
      alloc_free(all);
      dp_gather_params_free(d, full);
      return 0;
    }
    if (!rc && pp > 1) { /* each stage's parameters, zero elsewhere: summed, they are the model */
      if (dcomm_all_reduce(DCOMM_OF(m), d->pp_group, whole->param_memory, whole->param_memory, whole->n_elems,
                          COMM_REAL, COMM_SUM, NULL))
        rc = errf(err, err_size, "all-reduce of the pipeline stages' parameters: %s", comm_error());
    }
    *have = !rc && (pp == 1 || d->pp_group->rank == 0);
    if (rc || !*have)
      model_free(whole);
  }
  alloc_free(all);
  dp_gather_params_free(d, full);
  return rc;
}

int dp_export(struct dp *d, const char *path, uint64_t hf_shard_bytes, const struct hf_extras *hf_extras, char *err,
              size_t err_size)
{
  if (d->model->tp.size > 1 || (d->pp_group && d->pp_group->size > 1) || d->layout.ep > 1) { /* put together first */
    struct model whole;
    int have;
    if (dp_gather_whole(d, &whole, &have, err, err_size))
      return -1;
    int rc = !have ? 0 : hf_shard_bytes ? weights_export_hf(&whole, path, hf_shard_bytes, hf_extras, err, err_size)
                                        : weights_export(&whole, path, err, err_size);
    if (have)
      model_free(&whole);
    return rc;
  }
  real *full;
  if (dp_gather_params(d, &full))
    return errf(err, err_size, "%s", FAULT_OF(d)->msg);
  if (d->rank != 0)
    return 0;
  struct model *m = d->model;
  real **saved = malloc((size_t)m->n_params * sizeof *saved);
  if (!saved) {
    dp_gather_params_free(d, full);
    return errf(err, err_size, "export %s: out of memory", path);
  }
  for (int i = 0; i < m->n_params; i++) {
    saved[i] = m->params[i].data;
    m->params[i].data = full + m->params[i].offset;
  }
  int rc = hf_shard_bytes ? weights_export_hf(m, path, hf_shard_bytes, hf_extras, err, err_size)
                          : weights_export(m, path, err, err_size);
  for (int i = 0; i < m->n_params; i++)
    m->params[i].data = saved[i];
  free(saved);
  dp_gather_params_free(d, full);
  return rc;
}
