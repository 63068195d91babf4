/* The model's parameter table and its initialization (the activation buffers are in
 * model_acts.c). Parameters live in one contiguous block (and gradients in another, with the same
 * offsets), so the gradient norm and zeroing are one call each; each tensor starts on a 64-byte
 * boundary (MODEL_ALIGN_FLOATS). The data-parallel layer (dp.h) lays the same table out in
 * buckets instead and points each parameter where its values and gradient live on this rank. */
#include "runtime/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "philox.h"
#include "comm/comm.h"
#include "runtime/model/alloc.h"
#include "runtime/model/hostview.h"
#include "util/err.h"
#include "util/hash.h"

void model_param_take_block(const struct model_param *p, const real *whole, real *block)
{
  if (p->n_dims == 1 || p->tp_dim < 0) {
    memcpy(block, whole, p->n_elems * sizeof(real));
    return;
  }
  const int64_t cols = p->shape[1];
  for (int64_t r = 0; r < p->local[0]; r++)
    memcpy(block + r * p->local[1], whole + (p->start[0] + r) * cols + p->start[1],
           (size_t)p->local[1] * sizeof(real));
}

void model_param_put_block(const struct model_param *p, int tp_size, int tp_rank,
                           const real *block, real *whole)
{
  if (p->n_dims == 1 || p->tp_dim < 0) {
    memcpy(whole, block, p->n_elems * sizeof(real));
    return;
  }
  (void)tp_size;
  const int64_t cols = p->shape[1];
  int64_t r0 = p->tp_dim == 0 ? p->local[0] * tp_rank : 0;
  int64_t c0 = p->tp_dim == 1 ? p->local[1] * tp_rank : 0;
  for (int64_t r = 0; r < p->local[0]; r++)
    memcpy(whole + (r0 + r) * cols + c0, block + r * p->local[1], (size_t)p->local[1] * sizeof(real));
}

/* Builds the parameters from the layout's table of m->rank (set by the caller): the model takes
 * the rank's description and binds each parameter to the kernel table and the device. */
static int create_table(struct model *m, char *err, size_t err_size)
{
  const struct layout_rank *r = &m->rank;
  m->tp.size = r->tp_size;
  m->tp.rank = r->tp_rank;
  m->tp.io = r->io;
  m->tp.layers = r->layers;
  m->layer_here = r->layer_here;
  m->embed_here = r->embed_here;
  m->head_here = r->head_here;
  m->recompute = r->recompute;
  m->moe = r->moe;
  m->ep.size = r->ep_size;
  m->ep.rank = r->ep_rank;
  m->zero = r->zero;
  m->bf16 = r->bf16;
  m->grads_bf16 = r->grads_bf16;
  m->config = r->config;
  m->k = kernels_active();
  m->kctx = kernels_active_context();
  m->device = alloc_current_device();
  m->tp.k = m->k;
  m->tp.kctx = m->kctx;
  m->tp.wire_bf16 = m->bf16;
  if (m->k->compute_dtype != REAL_TENSOR_DTYPE)
    return errf(err, err_size, "the %s kernel table computes in %s; this build's tensors are %s (%s)",
                m->k->name, tensor_dtype_name(m->k->compute_dtype), tensor_dtype_name(REAL_TENSOR_DTYPE),
                REAL_NAME);
  if (layout_params_build(&m->table, &m->rank, err, err_size))
    return -1;
  m->config = m->rank.config; /* head_dim and vocab_padded filled in */
  const struct plan_model *c = &m->config;
  const int L = c->n_layers, E = c->moe.experts > 0 ? c->moe.experts : 0;
  int n_sparse = 0;
  for (int l = 0; l < L && E; l++) n_sparse += m->moe && m->moe[l];
  m->params = calloc((size_t)m->table.n, sizeof *m->params);
  m->layer_param0 = m->table.layer_param0;
  m->layers = calloc((size_t)L, sizeof *m->layers);
  m->layer_grads = calloc((size_t)L, sizeof *m->layer_grads);
  m->moe_views = n_sparse ? calloc((size_t)n_sparse * 6 * E, sizeof *m->moe_views) : NULL;
  if (n_sparse) { /* the statistics, their routed counts after them in one block */
    m->moe_stat = calloc(1, (size_t)L * (sizeof *m->moe_stat + (size_t)E * sizeof(long long)));
    long long *routed = m->moe_stat ? (long long *)(m->moe_stat + L) : NULL;
    for (int l = 0; routed && l < L; l++) m->moe_stat[l].routed = routed + (size_t)l * E;
    m->moe_collect = 1;
  }
  if (!m->params || !m->layers || !m->layer_grads || (n_sparse && (!m->moe_views || !m->moe_stat)) ||
      (m->bf16 && !(m->layers_bf16 = calloc((size_t)L, sizeof *m->layers_bf16)))) {
    snprintf(err, err_size, "out of memory for the parameter table of a %d-layer model", L);
    model_free(m);
    return -1;
  }
  m->n_params = m->table.n;
  for (int i = 0; i < m->n_params; i++) {
    const struct layout_param *t = &m->table.p[i];
    struct model_param *p = &m->params[i];
    memcpy(p->name, t->name, sizeof p->name);
    p->kind = t->kind;
    p->layer = t->layer;
    p->expert = t->expert;
    p->n_dims = t->n_dims;
    memcpy(p->shape, t->shape, sizeof p->shape);
    p->rows = t->rows;
    p->n_elems = t->n_elems;
    p->here = t->here;
    p->tp_dim = t->tp_dim;
    memcpy(p->local, t->local, sizeof p->local);
    memcpy(p->start, t->start, sizeof p->start);
    p->offset = t->offset;
    p->dtype = m->k->compute_dtype;
    p->device = m->device;
    p->weight_decay = t->weight_decay;
    p->init_std = t->init_std;
    p->bf16_offset = t->bf16_offset;
  }
  /* the sparse layers' expert views: weights w1, w2, w3 then their gradients, E each */
  real **views = m->moe_views;
  for (int l = 0; views && l < L; l++) {
    if (!m->moe[l])
      continue;
    m->layers[l].w1 = views;
    m->layers[l].w2 = views + E;
    m->layers[l].w3 = views + 2 * E;
    m->layer_grads[l].w1 = views + 3 * E;
    m->layer_grads[l].w2 = views + 4 * E;
    m->layer_grads[l].w3 = views + 5 * E;
    views += 6 * E;
  }
  m->n_elems = m->table.n_elems;
  m->n_bf16 = m->table.n_bf16;
  return 0;
}

int model_create_table(struct model *m, const struct plan_model *cfg, char *err, size_t err_size)
{
  return model_create_table_sparse(m, cfg, NULL, err, err_size);
}

int model_create_table_sparse(struct model *m, const struct plan_model *cfg, const uint8_t *sparse,
                              char *err, size_t err_size)
{
  memset(m, 0, sizeof *m);
  if (layout_rank_whole(&m->rank, cfg, sparse, err, err_size))
    return -1;
  return create_table(m, err, err_size);
}

int model_create_table_tp(struct model *m, const struct plan *p, struct comm_group *tp,
                          int pp_rank, int ep_rank, char *err, size_t err_size)
{
  if ((tp ? tp->size : 1) != p->mesh.tp) {
    memset(m, 0, sizeof *m);
    return errf(err, err_size, "mesh.tp = %d, but the tensor-parallel group has %d ranks",
                p->mesh.tp, tp ? tp->size : 1);
  }
  int rc = model_create_table_at(m, p, tp ? tp->rank : 0, pp_rank, ep_rank, err, err_size);
  m->tp.group = tp;
  return rc;
}

int model_create_table_at(struct model *m, const struct plan *p, int tp_rank, int pp_rank, int ep_rank,
                          char *err, size_t err_size)
{
  memset(m, 0, sizeof *m);
  if (layout_rank_of_plan(&m->rank, p, tp_rank, pp_rank, ep_rank, 0, err, err_size))
    return -1;
  return create_table(m, err, err_size);
}

int model_create(struct model *m, const struct plan_model *cfg, char *err, size_t err_size)
{
  if (model_create_table(m, cfg, err, err_size))
    return -1;
  m->param_memory = alloc_reals_on(m->device, ALLOC_PARAMS, m->n_elems);
  m->grad_memory = alloc_reals_on(m->device, ALLOC_GRADS, m->n_elems);
  if (!m->param_memory || !m->grad_memory) {
    snprintf(err, err_size, "out of memory for the parameters of a %d-layer model of dim %d",
             m->config.n_layers, m->config.dim);
    model_free(m);
    return -1;
  }
  model_bind_memory(m, m->param_memory, m->grad_memory);
  return 0;
}

void model_bind_memory(struct model *m, real *params, real *grads)
{
  for (int i = 0; i < m->n_params; i++) {
    struct model_param *p = &m->params[i];
    p->data = params ? params + p->offset : NULL;
    p->grad = grads ? grads + p->offset : NULL;
  }
  model_bind_views(m);
}

void model_bind_views(struct model *m)
{
  m->wte = m->dwte = m->final_norm = m->dfinal_norm = m->head = m->dhead = NULL;
  for (int i = 0; i < m->n_params; i++) {
    struct model_param *p = &m->params[i];
    struct model_layer_weights *w = p->layer >= 0 ? &m->layers[p->layer] : NULL;
    struct model_layer_weights *g = p->layer >= 0 ? &m->layer_grads[p->layer] : NULL;
    switch (p->kind) {
    case MODEL_EMBED: m->wte = p->data; m->dwte = p->grad; break;
    case MODEL_ATTN_NORM: w->attn_norm = p->data; g->attn_norm = p->grad; break;
    case MODEL_Q: w->wq = p->data; g->wq = p->grad; break;
    case MODEL_K: w->wk = p->data; g->wk = p->grad; break;
    case MODEL_V: w->wv = p->data; g->wv = p->grad; break;
    case MODEL_O: w->wo = p->data; g->wo = p->grad; break;
    case MODEL_MLP_NORM: w->mlp_norm = p->data; g->mlp_norm = p->grad; break;
    case MODEL_GATE: w->wgate = p->data; g->wgate = p->grad; break;
    case MODEL_UP: w->wup = p->data; g->wup = p->grad; break;
    case MODEL_DOWN: w->wdown = p->data; g->wdown = p->grad; break;
    case MODEL_FINAL_NORM: m->final_norm = p->data; m->dfinal_norm = p->grad; break;
    case MODEL_HEAD: m->head = p->data; m->dhead = p->grad; break;
    case MODEL_ROUTER: w->router = p->data; g->router = p->grad; break;
    case MODEL_EXPERT_W1: w->w1[p->expert] = p->data; g->w1[p->expert] = p->grad; break;
    case MODEL_EXPERT_W2: w->w2[p->expert] = p->data; g->w2[p->expert] = p->grad; break;
    case MODEL_EXPERT_W3: w->w3[p->expert] = p->data; g->w3[p->expert] = p->grad; break;
    default: break;
    }
  }
  m->head_bf16 = m->wte_bf16 = m->final_norm_bf16 = NULL;
  for (int i = 0; m->layers_bf16 && i < m->n_params; i++) {
    const struct model_param *p = &m->params[i];
    const bf16 *b = model_param_bf16(m, p, 0);
    struct model_layer_weights_bf16 *w = p->layer >= 0 ? &m->layers_bf16[p->layer] : NULL;
    switch (p->kind) {
    case MODEL_Q: w->wq = b; break;
    case MODEL_K: w->wk = b; break;
    case MODEL_V: w->wv = b; break;
    case MODEL_O: w->wo = b; break;
    case MODEL_GATE: w->wgate = b; break;
    case MODEL_UP: w->wup = b; break;
    case MODEL_DOWN: w->wdown = b; break;
    case MODEL_ATTN_NORM: w->attn_norm = b; break;
    case MODEL_MLP_NORM: w->mlp_norm = b; break;
    case MODEL_FINAL_NORM: m->final_norm_bf16 = b; break;
    case MODEL_EMBED: m->wte_bf16 = b; break;
    case MODEL_HEAD: m->head_bf16 = b; break;
    default: break;
    }
  }
  if (m->config.tie_embeddings) {
    m->head_bf16 = m->wte_bf16;
    m->head = m->wte; /* the head's gradient adds into the embedding's */
    m->dhead = m->dwte;
  }
}

void model_free(struct model *m)
{
  alloc_free(m->param_memory);
  alloc_free(m->grad_memory);
  alloc_free(m->bf16_memory);
  free(m->layers_bf16);
  free(m->params);
  layout_params_free(&m->table); /* layer_param0 */
  layout_rank_free(&m->rank);    /* tp.layers, layer_here, recompute, moe */
  free(m->moe_views);
  free(m->moe_stat);
  free(m->layers);
  free(m->layer_grads);
  memset(m, 0, sizeof *m);
}

bf16 *model_param_bf16(const struct model *m, const struct model_param *p, size_t at)
{
  (void)m;
  return p->bf16_data ? p->bf16_data + at : NULL;
}

void model_bf16_bind(struct model *m, int first, int last, bf16 *base, size_t base_offset)
{
  for (int i = first; i >= 0 && i <= last; i++) {
    struct model_param *p = &m->params[i];
    p->bf16_data = base && p->bf16_offset != MODEL_NO_BF16 ? base + (p->bf16_offset - base_offset) : NULL;
  }
}

void model_bf16_round(struct model *m, int first, int last)
{
  for (int i = first; i >= 0 && i <= last; i++) {
    const struct model_param *p = &m->params[i];
    if (p->bf16_data && p->data)
      m->k->round_bf16(m->kctx, p->bf16_data, p->data, p->n_elems);
  }
}

int model_bf16_alloc(struct model *m)
{
  if (!m->bf16 || m->bf16_memory)
    return 0;
  m->bf16_memory = alloc_bytes_on(m->device, ALLOC_PARAMS, m->n_bf16 * sizeof(bf16));
  if (!m->bf16_memory)
    return -1;
  model_bf16_bind(m, 0, m->n_params - 1, m->bf16_memory, 0);
  m->bf16_fresh = 0;
  model_bind_views(m);
  return 0;
}

void model_bf16_sync(struct model *m)
{
  /* ZeRO 3 has no whole copies: each gathered unit's are rounded as it arrives (dp_passes.c) */
  if (!m->bf16_memory || m->bf16_fresh)
    return;
  model_bf16_round(m, 0, m->n_params - 1);
  m->bf16_fresh = 1;
}

int model_init(struct model *m, uint64_t seed, char *err, size_t err_size)
{
  m->bf16_fresh = 0;
  for (int i = 0; i < m->n_params; i++) {
    struct model_param *p = &m->params[i];
    if (!p->data)
      continue; /* not held here (a ZeRO-3 rank initializes one bucket at a time) */
    const size_t n_bytes = p->n_elems * sizeof(real);
    real *data = hostview_open(m->k, m->kctx, p->data, n_bytes, 0);
    if (!data) {
      snprintf(err, err_size, "out of host memory initializing %s (%zu elements)", p->name, p->n_elems);
      return -1;
    }
    if (p->n_dims == 1) {
      for (size_t e = 0; e < p->n_elems; e++) data[e] = 1.0f;
      hostview_close(m->k, m->kctx, p->data, data, n_bytes, 1);
      continue;
    }
    uint64_t stream = hash_fnv1a64(p->name);
    const uint32_t lo = (uint32_t)stream, hi = (uint32_t)(stream >> 32);
    const int64_t cols = p->shape[1], rows = p->local[0], lcols = p->local[1];
    const float std = p->init_std; /* the product in float: the same weights in the float64 build */
#pragma omp parallel for
    for (int64_t r = 0; r < rows; r++) {
      const int64_t row = p->start[0] + r; /* in the whole tensor; rows ≥ shape[0] are padding */
      for (int64_t c = 0; c < lcols; c++) {
        uint64_t e = (uint64_t)(row * cols + p->start[1] + c);
        data[r * lcols + c] = row < p->shape[0] ? (real)(std * philox_normal(seed, lo, hi, e)) : 0;
      }
    }
    hostview_close(m->k, m->kctx, p->data, data, n_bytes, 1);
  }
  return 0;
}

const struct model_param *model_find(const struct model *m, const char *name)
{
  for (int i = 0; i < m->n_params; i++)
    if (strcmp(m->params[i].name, name) == 0)
      return &m->params[i];
  return NULL;
}

void model_zero_grads(struct model *m)
{
  if (m->grad_memory)
    m->k->zero(m->kctx, m->grad_memory, m->n_elems * sizeof(real));
}

long long model_n_params(const struct model *m)
{
  long long n = 0;
  for (int i = 0; i < m->n_params; i++) {
    const struct model_param *p = &m->params[i];
    n += p->n_dims == 2 ? (long long)p->shape[0] * p->shape[1] : p->shape[0];
  }
  return n;
}
