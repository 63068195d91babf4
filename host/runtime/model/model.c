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

enum { BF16_ALIGN = 32 /* 64 bytes */ };

static void add_param(struct model *m, enum model_param_kind kind, int layer, const char *name,
                      int n_dims, int64_t d0, int64_t d1, int64_t rows, float init_std,
                      int tp_dim, int here, size_t *offset)
{
  struct model_param *p = &m->params[m->n_params++];
  if (name) /* NULL: an outline's parameter (model_create_table_outline), unnamed */
    snprintf(p->name, sizeof p->name, "%s", name);
  p->dtype = m->k->compute_dtype;
  p->device = m->device;
  p->kind = kind;
  p->layer = layer;
  p->expert = -1;
  p->n_dims = n_dims;
  p->shape[0] = d0;
  p->shape[1] = n_dims == 2 ? d1 : 0;
  p->rows = rows;
  p->tp_dim = m->tp.size > 1 && n_dims == 2 ? tp_dim : -1;
  p->local[0] = rows;
  p->local[1] = p->shape[1];
  p->start[0] = p->start[1] = 0;
  if (p->tp_dim >= 0) {
    p->local[p->tp_dim] /= m->tp.size;
    p->start[p->tp_dim] = p->local[p->tp_dim] * m->tp.rank;
  }
  p->here = here;
  if (!here)
    p->local[0] = 0;
  p->n_elems = n_dims == 2 ? (size_t)p->local[0] * (size_t)p->local[1] : (size_t)p->local[0];
  p->offset = *offset;
  p->weight_decay = n_dims == 2;
  p->init_std = init_std;
  *offset += (p->n_elems + MODEL_ALIGN_FLOATS - 1) / MODEL_ALIGN_FLOATS * MODEL_ALIGN_FLOATS;
}

/* The dimension of the weight (OC, IC) a split cuts: rows for column and vocab, columns for row. */
static int split_dim(uint8_t split)
{
  return split == PLAN_SPLIT_COLUMN || split == PLAN_SPLIT_VOCAB ? 0
       : split == PLAN_SPLIT_ROW ? 1 : -1;
}

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

static int check_config(struct plan_model *c, char *err, size_t n)
{
  if (c->head_dim == 0 && c->n_heads > 0)
    c->head_dim = c->dim / c->n_heads;
  if (c->vocab_padded == 0)
    c->vocab_padded = c->vocab;
  if (c->n_layers < 1 || c->dim < 1 || c->n_heads < 1 || c->n_kv_heads < 1 || c->ffn_dim < 1 ||
      c->vocab < 1 || c->vocab_padded < c->vocab || c->head_dim * c->n_heads != c->dim ||
      c->head_dim % 2 || c->n_heads % c->n_kv_heads || !(c->rope_theta > 0) ||
      !(c->norm_eps >= 0) || !(c->dropout >= 0 && c->dropout < 1)) {
    snprintf(err, n, "model: inconsistent shape (n_layers %d, dim %d, n_heads %d, n_kv_heads %d, "
             "ffn_dim %d, vocab %d, vocab_padded %d, rope_theta %g, norm_eps %g, dropout %g)",
             c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->ffn_dim, c->vocab,
             c->vocab_padded, c->rope_theta, c->norm_eps, c->dropout);
    return -1;
  }
  const struct plan_moe *e = &c->moe;
  if (e->experts > 0 && (e->top_k < 1 || e->top_k > e->experts || e->ffn_dim < 1 ||
                         !(e->aux_loss >= 0) || !(e->z_loss >= 0) || !(e->capacity_factor >= 0))) {
    snprintf(err, n, "model.moe: inconsistent (experts %d, top_k %d, ffn_dim %d, aux_loss %g, "
             "z_loss %g, capacity_factor %g)", e->experts, e->top_k, e->ffn_dim, e->aux_loss,
             e->z_loss, e->capacity_factor);
    return -1;
  }
  return 0;
}

/* The empty parameters of an outline's layer l, which is not here (model_create_table_outline):
 * three for a sparse layer whose experts the data-parallel layout keeps apart (mesh.ep > 1); none
 * under zero < 2 when the layer before is also not here and has no such experts (no unit boundary
 * cuts a bucket there, so the run of layers is one parameter); else one. */
static int outline_empty_params(const struct model *m, int l)
{
  const int split = m->ep.size > 1 && m->config.moe.experts > 0 && m->moe;
  if (split && m->moe[l])
    return 3;
  return m->zero < 2 && l > 0 && !m->layer_here[l - 1] && !(split && m->moe[l - 1]) ? 0 : 1;
}

/* outline 1: model_create_table_outline's table (model.h): unnamed parameters, no views, and the
 * layers not here as outline_empty_params says. */
static int create_table(struct model *m, int outline, char *err, size_t err_size)
{
  struct plan_model *c = &m->config;
  m->k = kernels_active();
  m->kctx = kernels_active_context();
  m->device = alloc_current_device();
  m->tp.k = m->k;
  m->tp.kctx = m->kctx;
  if (m->k->compute_dtype != REAL_TENSOR_DTYPE)
    return errf(err, err_size, "the %s kernel table computes in %s; this build's tensors are %s (%s)",
                m->k->name, tensor_dtype_name(m->k->compute_dtype), tensor_dtype_name(REAL_TENSOR_DTYPE),
                REAL_NAME);
  if (check_config(c, err, err_size))
    return -1;
  const int L = c->n_layers, C = c->dim, F = c->ffn_dim, HS = c->head_dim;
  const int64_t Vp = c->vocab_padded, V = c->vocab;
  const float std = 0.02f, std_out = (float)(0.02 / sqrt(2.0 * L));
  const int E = c->moe.experts > 0 ? c->moe.experts : 0, Fe = c->moe.ffn_dim;
  int n_sparse = 0;
  for (int l = 0; l < L && E; l++) n_sparse += m->moe && m->moe[l];
  size_t n_params = (size_t)L * 9 + (size_t)n_sparse * (3 * (size_t)E + 1) + 3;
  if (outline) {
    n_params = 3;
    for (int l = 0; l < L; l++) {
      const int sparse = E && m->moe && m->moe[l];
      n_params += m->layer_here[l] ? 9 + (sparse ? 3 * (size_t)E + 1 : 0) : (size_t)outline_empty_params(m, l);
    }
  }
  m->params = calloc(n_params, sizeof *m->params);
  m->layer_param0 = calloc((size_t)L, sizeof *m->layer_param0);
  if (!outline) {
    m->layers = calloc((size_t)L, sizeof *m->layers);
    m->layer_grads = calloc((size_t)L, sizeof *m->layer_grads);
    m->moe_views = n_sparse ? calloc((size_t)n_sparse * 6 * E, sizeof *m->moe_views) : NULL;
  }
  if (n_sparse && !outline) { /* the statistics, their routed counts after them in one block */
    m->moe_stat = calloc(1, (size_t)L * (sizeof *m->moe_stat + (size_t)E * sizeof(long long)));
    long long *routed = m->moe_stat ? (long long *)(m->moe_stat + L) : NULL;
    for (int l = 0; routed && l < L; l++) m->moe_stat[l].routed = routed + (size_t)l * E;
    m->moe_collect = 1;
  }
  if (!m->params || (!outline && (!m->layers || !m->layer_grads)) || !m->tp.layers || !m->layer_here ||
      !m->layer_param0 || (n_sparse && (!m->moe || (!outline && (!m->moe_views || !m->moe_stat))))) {
    snprintf(err, err_size, "out of memory for the parameter table of a %d-layer model", L);
    model_free(m);
    return -1;
  }

  size_t offset = 0;
  char name[MODEL_NAME_MAX];
  add_param(m, MODEL_EMBED, -1, outline ? NULL : "model.embed_tokens.weight", 2, V, C, Vp, std,
            split_dim(m->tp.io.split[PLAN_MOD_EMBED]),
            m->embed_here || (c->tie_embeddings && m->head_here), &offset);
  real **views = m->moe_views;
  /* expert parallelism: this ep rank holds experts [rank·E/ep, (rank + 1)·E/ep) only */
  const int ep = m->ep.size > 1 ? m->ep.size : 1, ep_rank = ep > 1 ? m->ep.rank : 0;
#define mine(x) (ep == 1 || (x) / (E / ep) == ep_rank)
  for (int l = 0; l < L; l++) {
    m->layer_param0[l] = m->n_params;
    const int sparse = E && m->moe && m->moe[l];
    if (outline && !m->layer_here[l]) {
      /* no elements here: what the layout reads of the layer's parameters is their units (the
       * layer's) and where experts begin and end, so a run of one class is one parameter */
      const int n = outline_empty_params(m, l);
      if (n == 0)
        m->layer_param0[l] = m->n_params - 1; /* the run's parameter, the layer before's */
      if (n >= 1)
        add_param(m, MODEL_Q, l, NULL, 1, C, 0, C, 0.0f, -1, 0, &offset);
      if (n == 3) {
        add_param(m, MODEL_EXPERT_W1, l, NULL, 1, C, 0, C, 0.0f, -1, 0, &offset);
        m->params[m->n_params - 1].expert = 0;
        add_param(m, MODEL_ATTN_NORM, l, NULL, 1, C, 0, C, 0.0f, -1, 0, &offset);
      }
      continue;
    }
    static const struct { enum model_param_kind kind; const char *suffix; int module; } table[] = {
      { MODEL_Q, "self_attn.q_proj.weight", PLAN_MOD_Q }, { MODEL_K, "self_attn.k_proj.weight", PLAN_MOD_K },
      { MODEL_V, "self_attn.v_proj.weight", PLAN_MOD_V }, { MODEL_O, "self_attn.o_proj.weight", PLAN_MOD_O },
      { MODEL_GATE, "mlp.gate_proj.weight", PLAN_MOD_GATE }, { MODEL_UP, "mlp.up_proj.weight", PLAN_MOD_UP },
      { MODEL_DOWN, "mlp.down_proj.weight", PLAN_MOD_DOWN }, { MODEL_ATTN_NORM, "input_layernorm.weight", -1 },
      { MODEL_MLP_NORM, "post_attention_layernorm.weight", -1 },
    };
    for (int j = 0; j < 9; j++) {
      int64_t out = 0, in = 0;
      if (sparse && table[j].kind == MODEL_GATE) { /* Mixtral's block_sparse_moe in place of the MLP */
        if (!outline)
          snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.gate.weight", l);
        add_param(m, MODEL_ROUTER, l, outline ? NULL : name, 2, E, C, E, std, -1, m->layer_here[l], &offset);
        for (int x = 0; x < E; x++) {
          static const enum model_param_kind kinds[3] = { MODEL_EXPERT_W1, MODEL_EXPERT_W2, MODEL_EXPERT_W3 };
          for (int w = 0; w < 3; w++) {
            if (!outline)
              snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.w%d.weight", l, x, w + 1);
            const int64_t o = w == 1 ? C : Fe, i = w == 1 ? Fe : C;
            add_param(m, kinds[w], l, outline ? NULL : name, 2, o, i, o, w == 1 ? std_out : std, -1,
                      m->layer_here[l] && mine(x), &offset);
            m->params[m->n_params - 1].expert = x;
          }
        }
        if (outline)
          continue;
        m->layers[l].w1 = views;
        m->layers[l].w2 = views + E;
        m->layers[l].w3 = views + 2 * E;
        m->layer_grads[l].w1 = views + 3 * E;
        m->layer_grads[l].w2 = views + 4 * E;
        m->layer_grads[l].w3 = views + 5 * E;
        views += 6 * E;
      }
      if (sparse && (table[j].kind == MODEL_GATE || table[j].kind == MODEL_UP || table[j].kind == MODEL_DOWN))
        continue;
      switch (table[j].kind) {
      case MODEL_Q: out = (int64_t)c->n_heads * HS; in = C; break;
      case MODEL_K: case MODEL_V: out = (int64_t)c->n_kv_heads * HS; in = C; break;
      case MODEL_O: out = C; in = (int64_t)c->n_heads * HS; break;
      case MODEL_GATE: case MODEL_UP: out = F; in = C; break;
      case MODEL_DOWN: out = C; in = F; break;
      default: break;
      }
      if (!outline)
        snprintf(name, sizeof name, "model.layers.%d.%s", l, table[j].suffix);
      if (out)
        add_param(m, table[j].kind, l, outline ? NULL : name, 2, out, in, out,
                  table[j].kind == MODEL_O || table[j].kind == MODEL_DOWN ? std_out : std,
                  split_dim(m->tp.layers[l].split[table[j].module]), m->layer_here[l], &offset);
      else
        add_param(m, table[j].kind, l, outline ? NULL : name, 1, C, 0, C, 0.0f, -1, m->layer_here[l], &offset);
    }
  }
#undef mine
  add_param(m, MODEL_FINAL_NORM, -1, outline ? NULL : "model.norm.weight", 1, C, 0, C, 0.0f, -1, m->head_here,
            &offset);
  if (!c->tie_embeddings)
    add_param(m, MODEL_HEAD, -1, outline ? NULL : "lm_head.weight", 2, V, C, Vp, std,
              split_dim(m->tp.io.split[PLAN_MOD_HEAD]), m->head_here, &offset);
  m->n_elems = offset;
  /* bf16 models: a copy of each matmul weight held here, packed in table order */
  m->n_bf16 = 0;
  for (int i = 0; i < m->n_params; i++) {
    struct model_param *p = &m->params[i];
    const int matmul = p->n_dims == 2 && (p->kind != MODEL_EMBED || c->tie_embeddings);
    p->bf16_offset = MODEL_NO_BF16;
    if (m->bf16 && matmul && p->n_elems > 0) {
      p->bf16_offset = m->n_bf16;
      m->n_bf16 += (p->n_elems + BF16_ALIGN - 1) / BF16_ALIGN * BF16_ALIGN;
    }
  }
  if (m->bf16 && !outline && !(m->layers_bf16 = calloc((size_t)L, sizeof *m->layers_bf16))) {
    snprintf(err, err_size, "out of memory for the parameter table of a %d-layer model", L);
    model_free(m);
    return -1;
  }
  return 0;
}

static void replicated_layout(struct tp_layer_layout *y)
{
  memset(y, 0, sizeof *y);
  for (int k = 0; k < PLAN_N_MODULES; k++) y->split[k] = PLAN_SPLIT_REPLICATE;
  y->home = TP_R;
  y->kv = TP_R;
}

int model_create_table(struct model *m, const struct plan_model *cfg, char *err, size_t err_size)
{
  return model_create_table_sparse(m, cfg, NULL, err, err_size);
}

int model_create_table_sparse(struct model *m, const struct plan_model *cfg, const uint8_t *sparse,
                              char *err, size_t err_size)
{
  memset(m, 0, sizeof *m);
  m->config = *cfg;
  m->tp.size = 1;
  replicated_layout(&m->tp.io);
  m->embed_here = m->head_here = 1;
  if (cfg->n_layers > 0) {
    m->tp.layers = calloc((size_t)cfg->n_layers, sizeof *m->tp.layers);
    m->layer_here = malloc((size_t)cfg->n_layers);
    if (!m->tp.layers || !m->layer_here) {
      model_free(m);
      return errf(err, err_size, "out of memory for the layer layouts");
    }
    for (int l = 0; l < cfg->n_layers; l++) replicated_layout(&m->tp.layers[l]);
    memset(m->layer_here, 1, (size_t)cfg->n_layers);
    if (cfg->moe.experts > 0) { /* without a plan, every layer is sparse */
      if (!(m->moe = malloc((size_t)cfg->n_layers))) {
        model_free(m);
        return errf(err, err_size, "out of memory for the layer layouts");
      }
      if (sparse)
        memcpy(m->moe, sparse, (size_t)cfg->n_layers);
      else
        memset(m->moe, 1, (size_t)cfg->n_layers);
    }
  }
  return create_table(m, 0, err, err_size);
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

static int table_at(struct model *m, const struct plan *p, int tp_rank, int pp_rank, int ep_rank, int outline,
                    char *err, size_t err_size)
{
  memset(m, 0, sizeof *m);
  m->config = p->model;
  m->bf16 = p->precision.compute == PLAN_BF16 && plan_on_cpu(p); /* else the GPU's accounting */
  m->zero = p->zero;
  m->tp.size = p->mesh.tp;
  m->tp.rank = tp_rank;
  tp_layer_layout(p, -1, &m->tp.io);
  const int L = p->model.n_layers;
  m->tp.layers = calloc((size_t)L, sizeof *m->tp.layers);
  m->layer_here = calloc((size_t)L, 1);
  m->recompute = calloc((size_t)L, 1);
  m->moe = calloc((size_t)L, 1);
  if (!m->tp.layers || !m->layer_here || !m->recompute || !m->moe) {
    model_free(m);
    return errf(err, err_size, "out of memory for the layer layouts");
  }
  for (int l = 0; l < L; l++) {
    if (!outline) /* an outline lays out the layers here only, below */
      tp_layer_layout(p, l, &m->tp.layers[l]);
    m->recompute[l] = p->layers ? p->layers[l].recompute : 0;
    m->moe[l] = p->model.moe.experts > 0 && p->layers && p->layers[l].moe;
  }
  m->ep.size = p->model.moe.experts > 0 ? plan_ep(p) : 1; /* the group from the trainer */
  m->ep.rank = m->ep.size > 1 ? ep_rank : 0;
  if (!p->stages || p->n_stages == 0) { /* a plan made by hand, without stages: all of it here */
    memset(m->layer_here, 1, (size_t)L);
    m->embed_here = m->head_here = 1;
  }
  for (int s = 0; p->stages && s < p->n_stages; s++) {
    const struct plan_stage *st = &p->stages[s];
    if (st->pp_rank != pp_rank)
      continue;
    m->embed_here |= st->has_embed;
    m->head_here |= st->has_head;
    for (int l = st->first_layer; l >= 0 && l < st->first_layer + st->n_layers; l++) m->layer_here[l] = 1;
  }
  for (int l = 0; outline && l < L; l++)
    if (m->layer_here[l])
      tp_layer_layout(p, l, &m->tp.layers[l]);
  return create_table(m, outline, err, err_size);
}

int model_create_table_at(struct model *m, const struct plan *p, int tp_rank, int pp_rank, int ep_rank,
                          char *err, size_t err_size)
{
  return table_at(m, p, tp_rank, pp_rank, ep_rank, 0, err, err_size);
}

int model_create_table_outline(struct model *m, const struct plan *p, int pp_rank, char *err, size_t err_size)
{
  return table_at(m, p, 0, pp_rank, 0, 1, err, err_size);
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
  m->head_bf16 = NULL;
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
    case MODEL_HEAD: case MODEL_EMBED: m->head_bf16 = b; break; /* the embedding's only when tied */
    default: break;
    }
  }
  if (m->config.tie_embeddings) {
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
  free(m->tp.layers);
  free(m->layer_here);
  free(m->recompute);
  free(m->moe);
  free(m->layer_param0);
  free(m->moe_views);
  free(m->moe_stat);
  free(m->layers);
  free(m->layer_grads);
  memset(m, 0, sizeof *m);
}

bf16 *model_param_bf16(const struct model *m, const struct model_param *p, size_t at)
{
  return m->bf16_memory && p->bf16_offset != MODEL_NO_BF16 ? m->bf16_memory + p->bf16_offset + at : NULL;
}

int model_bf16_alloc(struct model *m)
{
  if (!m->bf16 || m->bf16_memory)
    return 0;
  m->bf16_memory = alloc_bytes_on(m->device, ALLOC_PARAMS, m->n_bf16 * sizeof(bf16));
  if (!m->bf16_memory)
    return -1;
  m->bf16_fresh = 0;
  model_bind_views(m);
  return 0;
}

void model_bf16_sync(struct model *m)
{
  if (!m->bf16_memory || m->bf16_fresh)
    return;
  for (int i = 0; i < m->n_params; i++) {
    const struct model_param *p = &m->params[i];
    bf16 *b = model_param_bf16(m, p, 0);
    if (b && p->data)
      m->k->round_bf16(m->kctx, b, p->data, p->n_elems);
  }
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
