/* The model's parameter table, its initialization, and the activation buffers. Parameters live
 * in one contiguous block (and gradients in another, with the same offsets), so the gradient
 * norm and zeroing are one call each; each tensor starts on a 64-byte boundary. The data-parallel
 * layer (dp.h) lays the same table out in buckets instead and points each parameter where its
 * values and gradient live on this rank. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "philox.h"
#include "runtime/alloc.h"
#include "util/hash.h"

enum { PARAM_ALIGN_FLOATS = 16 };

static void add_param(struct model *m, enum model_param_kind kind, int layer, const char *name,
                      int n_dims, int64_t d0, int64_t d1, int64_t rows, float init_std,
                      size_t *offset)
{
  struct model_param *p = &m->params[m->n_params++];
  snprintf(p->name, sizeof p->name, "%s", name);
  p->kind = kind;
  p->layer = layer;
  p->n_dims = n_dims;
  p->shape[0] = d0;
  p->shape[1] = n_dims == 2 ? d1 : 0;
  p->rows = rows;
  p->n_elems = n_dims == 2 ? (size_t)rows * (size_t)d1 : (size_t)d0;
  p->offset = *offset;
  p->weight_decay = n_dims == 2;
  p->init_std = init_std;
  *offset += (p->n_elems + PARAM_ALIGN_FLOATS - 1) / PARAM_ALIGN_FLOATS * PARAM_ALIGN_FLOATS;
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
    return 1;
  }
  return 0;
}

int model_create_table(struct model *m, const struct plan_model *cfg, char *err, size_t err_size)
{
  memset(m, 0, sizeof *m);
  m->config = *cfg;
  struct plan_model *c = &m->config;
  if (check_config(c, err, err_size))
    return 1;
  const int L = c->n_layers, C = c->dim, F = c->ffn_dim, HS = c->head_dim;
  const int64_t Vp = c->vocab_padded, V = c->vocab;
  const float std = 0.02f, std_out = (float)(0.02 / sqrt(2.0 * L));
  m->params = calloc((size_t)L * 9 + 3, sizeof *m->params);
  m->layers = calloc((size_t)L, sizeof *m->layers);
  m->layer_grads = calloc((size_t)L, sizeof *m->layer_grads);
  if (!m->params || !m->layers || !m->layer_grads) {
    snprintf(err, err_size, "out of memory for the parameter table of a %d-layer model", L);
    model_free(m);
    return 1;
  }

  size_t offset = 0;
  char name[MODEL_NAME_MAX];
  add_param(m, MODEL_EMBED, -1, "model.embed_tokens.weight", 2, V, C, Vp, std, &offset);
  for (int l = 0; l < L; l++) {
    static const struct { enum model_param_kind kind; const char *suffix; } table[] = {
      { MODEL_Q, "self_attn.q_proj.weight" }, { MODEL_K, "self_attn.k_proj.weight" },
      { MODEL_V, "self_attn.v_proj.weight" }, { MODEL_O, "self_attn.o_proj.weight" },
      { MODEL_GATE, "mlp.gate_proj.weight" }, { MODEL_UP, "mlp.up_proj.weight" },
      { MODEL_DOWN, "mlp.down_proj.weight" }, { MODEL_ATTN_NORM, "input_layernorm.weight" },
      { MODEL_MLP_NORM, "post_attention_layernorm.weight" },
    };
    for (int j = 0; j < 9; j++) {
      int64_t out = 0, in = 0;
      switch (table[j].kind) {
      case MODEL_Q: out = (int64_t)c->n_heads * HS; in = C; break;
      case MODEL_K: case MODEL_V: out = (int64_t)c->n_kv_heads * HS; in = C; break;
      case MODEL_O: out = C; in = (int64_t)c->n_heads * HS; break;
      case MODEL_GATE: case MODEL_UP: out = F; in = C; break;
      case MODEL_DOWN: out = C; in = F; break;
      default: break;
      }
      snprintf(name, sizeof name, "model.layers.%d.%s", l, table[j].suffix);
      if (out)
        add_param(m, table[j].kind, l, name, 2, out, in, out,
                  table[j].kind == MODEL_O || table[j].kind == MODEL_DOWN ? std_out : std, &offset);
      else
        add_param(m, table[j].kind, l, name, 1, C, 0, C, 0.0f, &offset);
    }
  }
  add_param(m, MODEL_FINAL_NORM, -1, "model.norm.weight", 1, C, 0, C, 0.0f, &offset);
  if (!c->tie_embeddings)
    add_param(m, MODEL_HEAD, -1, "lm_head.weight", 2, V, C, Vp, std, &offset);
  m->n_elems = offset;
  return 0;
}

int model_create(struct model *m, const struct plan_model *cfg, char *err, size_t err_size)
{
  if (model_create_table(m, cfg, err, err_size))
    return 1;
  m->param_memory = alloc_floats(ALLOC_PARAMS, m->n_elems);
  m->grad_memory = alloc_floats(ALLOC_GRADS, m->n_elems);
  if (!m->param_memory || !m->grad_memory) {
    snprintf(err, err_size, "out of memory for the parameters of a %d-layer model of dim %d",
             m->config.n_layers, m->config.dim);
    model_free(m);
    return 1;
  }
  model_bind_memory(m, m->param_memory, m->grad_memory);
  return 0;
}

void model_bind_memory(struct model *m, float *params, float *grads)
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
  free(m->params);
  free(m->layers);
  free(m->layer_grads);
  memset(m, 0, sizeof *m);
}

void model_init(struct model *m, uint64_t seed)
{
  for (int i = 0; i < m->n_params; i++) {
    struct model_param *p = &m->params[i];
    if (!p->data)
      continue; /* not held here (a ZeRO-3 rank initializes one bucket at a time) */
    if (p->n_dims == 1) {
      for (size_t e = 0; e < p->n_elems; e++) p->data[e] = 1.0f;
      continue;
    }
    uint64_t stream = hash_fnv1a64(p->name);
    const uint32_t lo = (uint32_t)stream, hi = (uint32_t)(stream >> 32);
    const size_t n_logical = (size_t)p->shape[0] * (size_t)p->shape[1];
    const float std = p->init_std;
    float *data = p->data;
#pragma omp parallel for
    for (size_t e = 0; e < n_logical; e++) data[e] = std * philox_normal(seed, lo, hi, e);
    memset(data + n_logical, 0, (p->n_elems - n_logical) * sizeof(float)); /* padding rows */
  }
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
    memset(m->grad_memory, 0, m->n_elems * sizeof(float));
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

/* ---- activations ------------------------------------------------------------------------- */

/* Hands out consecutive slices of one allocation, so a category is one block on the bill. */
struct carve {
  float *base;
  size_t used;
};

static float *carve(struct carve *c, size_t n_elems)
{
  float *p = c->base ? c->base + c->used : NULL;
  c->used += (n_elems + PARAM_ALIGN_FLOATS - 1) / PARAM_ALIGN_FLOATS * PARAM_ALIGN_FLOATS;
  return p;
}

/* Lays out every buffer; with base NULL it only counts. */
static void layout_acts(struct model_acts *a, const struct plan_model *c, struct carve *act,
                        struct carve *work)
{
  const size_t BT = (size_t)a->B_max * a->T_max, C = (size_t)c->dim, F = (size_t)c->ffn_dim;
  const size_t HS = (size_t)c->head_dim, NH = (size_t)c->n_heads, NKV = (size_t)c->n_kv_heads;
  const size_t TT = (size_t)a->T_max * a->T_max;
  const int drop = c->dropout > 0.0;
  a->residual = carve(act, (size_t)(c->n_layers + 1) * BT * C);
  for (int l = 0; l < c->n_layers; l++) {
    struct model_layer_acts *la = &a->layers[l];
    la->ln1 = carve(act, BT * C);
    la->ln1_rstd = carve(act, BT);
    la->q = carve(act, BT * NH * HS);
    la->k = carve(act, BT * NKV * HS);
    la->v = carve(act, BT * NKV * HS);
    la->probs = carve(act, a->B_max * NH * TT);
    la->probs_mask = drop ? carve(act, a->B_max * NH * TT) : NULL;
    la->atty = carve(act, BT * NH * HS);
    la->attn_mask = drop ? carve(act, BT * C) : NULL;
    la->mid = carve(act, BT * C);
    la->ln2 = carve(act, BT * C);
    la->ln2_rstd = carve(act, BT);
    la->gate = carve(act, BT * F);
    la->up = carve(act, BT * F);
    la->hidden = carve(act, BT * F);
    la->mlp_mask = drop ? carve(act, BT * C) : NULL;
  }
  a->lnf = carve(act, BT * C);
  a->lnf_rstd = carve(act, BT);
  a->logits = carve(act, BT * (size_t)c->vocab_padded);
  a->losses = carve(act, BT);
  a->rope_cos = carve(act, (size_t)a->T_max * HS / 2);
  a->rope_sin = carve(act, (size_t)a->T_max * HS / 2);
  a->tokens = (int *)carve(act, BT); /* sizeof(int) == sizeof(float) */

  a->dresidual = carve(work, BT * C);
  a->work_c1 = carve(work, BT * C);
  a->work_c2 = carve(work, BT * C);
  a->dq = carve(work, BT * NH * HS);
  a->dk = carve(work, BT * NKV * HS);
  a->dv = carve(work, BT * NKV * HS);
  a->dhidden = carve(work, BT * F);
  a->dgate = carve(work, BT * F);
  a->dup = carve(work, BT * F);
  a->attn_scratch = carve(work, attention_scratch_n_elems(a->B_max, a->T_max, c->n_heads,
                                                          c->n_kv_heads));
}

int model_acts_create(struct model_acts *a, const struct model *m, int B_max, int T_max,
                      char *err, size_t err_size)
{
  _Static_assert(sizeof(int) == sizeof(float), "tokens are carved from a float buffer");
  memset(a, 0, sizeof *a);
  a->B_max = B_max;
  a->T_max = T_max;
  a->layers = calloc((size_t)m->config.n_layers, sizeof *a->layers);
  if (!a->layers)
    goto out_of_memory;
  struct carve act = { 0 }, work = { 0 };
  layout_acts(a, &m->config, &act, &work);
  act.base = alloc_floats(ALLOC_ACTIVATIONS, act.used);
  work.base = alloc_floats(ALLOC_WORKSPACE, work.used);
  if (!act.base || !work.base) {
    alloc_free(act.base);
    alloc_free(work.base);
    goto out_of_memory;
  }
  act.used = work.used = 0;
  a->activation_memory = act.base;
  a->workspace_memory = work.base;
  layout_acts(a, &m->config, &act, &work);
  rope_table(a->rope_cos, a->rope_sin, T_max, m->config.head_dim, m->config.rope_theta, 0);
  return 0;

out_of_memory:
  snprintf(err, err_size, "out of memory for the activations of %d × %d tokens", B_max, T_max);
  free(a->layers);
  memset(a, 0, sizeof *a);
  return 1;
}

void model_acts_free(struct model_acts *a)
{
  alloc_free(a->activation_memory);
  alloc_free(a->workspace_memory);
  free(a->layers);
  memset(a, 0, sizeof *a);
}
