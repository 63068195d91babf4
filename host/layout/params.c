/* The parameter table of a rank (params.h): the rank's description from a plan or a whole model,
 * and its parameters in Hugging Face order with their blocks, offsets and bf16 copies. */
#include "layout/params.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/err.h"

enum { BF16_ALIGN = 32 /* 64 bytes */ };

static void replicated_layout(struct tp_layer_layout *y)
{
  memset(y, 0, sizeof *y);
  for (int k = 0; k < PLAN_N_MODULES; k++) y->split[k] = PLAN_SPLIT_REPLICATE;
  y->home = TP_R;
  y->kv = TP_R;
}

void layout_rank_free(struct layout_rank *r)
{
  free(r->layers);
  free(r->layer_here);
  free(r->recompute);
  free(r->moe);
  memset(r, 0, sizeof *r);
}

int layout_rank_whole(struct layout_rank *r, const struct plan_model *cfg, const uint8_t *sparse, char *err,
                      size_t err_size)
{
  memset(r, 0, sizeof *r);
  r->config = *cfg;
  r->tp_size = 1;
  r->ep_size = 1;
  replicated_layout(&r->io);
  r->embed_here = r->head_here = 1;
  if (cfg->n_layers > 0) {
    r->layers = calloc((size_t)cfg->n_layers, sizeof *r->layers);
    r->layer_here = malloc((size_t)cfg->n_layers);
    if (!r->layers || !r->layer_here) {
      layout_rank_free(r);
      return errf(err, err_size, "out of memory for the layer layouts");
    }
    for (int l = 0; l < cfg->n_layers; l++) replicated_layout(&r->layers[l]);
    memset(r->layer_here, 1, (size_t)cfg->n_layers);
    if (cfg->moe.experts > 0) { /* without a plan, every layer is sparse */
      if (!(r->moe = malloc((size_t)cfg->n_layers))) {
        layout_rank_free(r);
        return errf(err, err_size, "out of memory for the layer layouts");
      }
      if (sparse)
        memcpy(r->moe, sparse, (size_t)cfg->n_layers);
      else
        memset(r->moe, 1, (size_t)cfg->n_layers);
    }
  }
  return 0;
}

int layout_rank_of_plan(struct layout_rank *r, const struct plan *p, int tp_rank, int pp_rank, int ep_rank,
                        int outline, char *err, size_t err_size)
{
  memset(r, 0, sizeof *r);
  r->config = p->model;
  r->bf16 = p->precision.compute == PLAN_BF16; /* the CPU's and the GPU's bf16 mode alike */
  r->grads_bf16 = r->bf16 && p->precision.grads == PLAN_BF16;
  r->zero = p->zero;
  r->cp_size = p->mesh.cp > 1 ? p->mesh.cp : 1;
  r->outline = outline;
  r->tp_size = p->mesh.tp;
  r->tp_rank = tp_rank;
  tp_layer_layout(p, -1, &r->io);
  const int L = p->model.n_layers;
  r->layers = calloc((size_t)L, sizeof *r->layers);
  r->layer_here = calloc((size_t)L, 1);
  r->recompute = calloc((size_t)L, 1);
  r->moe = calloc((size_t)L, 1);
  if (!r->layers || !r->layer_here || !r->recompute || !r->moe) {
    layout_rank_free(r);
    return errf(err, err_size, "out of memory for the layer layouts");
  }
  for (int l = 0; l < L; l++) {
    if (!outline) /* an outline lays out the layers here only, below */
      tp_layer_layout(p, l, &r->layers[l]);
    r->recompute[l] = p->layers ? p->layers[l].recompute : 0;
    r->moe[l] = p->model.moe.experts > 0 && p->layers && p->layers[l].moe;
  }
  r->ep_size = p->model.moe.experts > 0 ? plan_ep(p) : 1;
  r->ep_rank = r->ep_size > 1 ? ep_rank : 0;
  if (!p->stages || p->n_stages == 0) { /* a plan made by hand, without stages: all of it here */
    memset(r->layer_here, 1, (size_t)L);
    r->embed_here = r->head_here = 1;
  }
  for (int s = 0; p->stages && s < p->n_stages; s++) {
    const struct plan_stage *st = &p->stages[s];
    if (st->pp_rank != pp_rank)
      continue;
    r->embed_here |= st->has_embed;
    r->head_here |= st->has_head;
    for (int l = st->first_layer; l >= 0 && l < st->first_layer + st->n_layers; l++) r->layer_here[l] = 1;
  }
  for (int l = 0; outline && l < L; l++)
    if (r->layer_here[l])
      tp_layer_layout(p, l, &r->layers[l]);
  return 0;
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

static void add_param(struct layout_params *t, const struct layout_rank *r, enum model_param_kind kind,
                      int layer, const char *name, int n_dims, int64_t d0, int64_t d1, int64_t rows,
                      float init_std, int tp_dim, int here, size_t *offset)
{
  struct layout_param *p = &t->p[t->n++];
  if (name) /* NULL: an outline's parameter, unnamed */
    snprintf(p->name, sizeof p->name, "%s", name);
  p->kind = kind;
  p->layer = layer;
  p->expert = -1;
  p->n_dims = n_dims;
  p->shape[0] = d0;
  p->shape[1] = n_dims == 2 ? d1 : 0;
  p->rows = rows;
  p->tp_dim = r->tp_size > 1 && n_dims == 2 ? tp_dim : -1;
  p->local[0] = rows;
  p->local[1] = p->shape[1];
  p->start[0] = p->start[1] = 0;
  if (p->tp_dim >= 0) {
    p->local[p->tp_dim] /= r->tp_size;
    p->start[p->tp_dim] = p->local[p->tp_dim] * r->tp_rank;
  }
  p->here = here;
  if (!here)
    p->local[0] = 0;
  p->n_elems = n_dims == 2 ? (size_t)p->local[0] * (size_t)p->local[1] : (size_t)p->local[0];
  p->offset = *offset;
  p->weight_decay = n_dims == 2;
  p->init_std = init_std;
  *offset += (p->n_elems + LAYOUT_ALIGN - 1) / LAYOUT_ALIGN * LAYOUT_ALIGN;
}

/* The dimension of the weight (OC, IC) a split cuts: rows for column and vocab, columns for row. */
static int split_dim(uint8_t split)
{
  return split == PLAN_SPLIT_COLUMN || split == PLAN_SPLIT_VOCAB ? 0
       : split == PLAN_SPLIT_ROW ? 1 : -1;
}

/* The empty parameters of an outline's layer l, which is not here: three for a sparse layer whose
 * experts the data-parallel layout keeps apart (mesh.ep > 1); none under zero < 2 when the layer
 * before is also not here and has no such experts (no unit boundary cuts a bucket there, so the
 * run of layers is one parameter); else one. */
static int outline_empty_params(const struct layout_rank *r, int l)
{
  const int split = r->ep_size > 1 && r->config.moe.experts > 0 && r->moe;
  if (split && r->moe[l])
    return 3;
  return r->zero < 2 && l > 0 && !r->layer_here[l - 1] && !(split && r->moe[l - 1]) ? 0 : 1;
}

void layout_params_free(struct layout_params *t)
{
  free(t->p);
  free(t->layer_param0);
  memset(t, 0, sizeof *t);
}

int layout_params_build(struct layout_params *t, struct layout_rank *r, char *err, size_t err_size)
{
  memset(t, 0, sizeof *t);
  struct plan_model *c = &r->config;
  if (check_config(c, err, err_size))
    return -1;
  const int outline = r->outline;
  const int L = c->n_layers, C = c->dim, F = c->ffn_dim, HS = c->head_dim;
  const int64_t Vp = c->vocab_padded, V = c->vocab;
  const float std = 0.02f, std_out = (float)(0.02 / sqrt(2.0 * L));
  const int E = c->moe.experts > 0 ? c->moe.experts : 0, Fe = c->moe.ffn_dim;
  int n_sparse = 0;
  for (int l = 0; l < L && E; l++) n_sparse += r->moe && r->moe[l];
  size_t n_params = (size_t)L * 9 + (size_t)n_sparse * (3 * (size_t)E + 1) + 3;
  if (outline) {
    n_params = 3;
    for (int l = 0; l < L; l++) {
      const int sparse = E && r->moe && r->moe[l];
      n_params += r->layer_here[l] ? 9 + (sparse ? 3 * (size_t)E + 1 : 0) : (size_t)outline_empty_params(r, l);
    }
  }
  t->p = calloc(n_params, sizeof *t->p);
  t->layer_param0 = calloc((size_t)L, sizeof *t->layer_param0);
  if (!t->p || !t->layer_param0 || (n_sparse && !r->moe)) {
    layout_params_free(t);
    return errf(err, err_size, "out of memory for the parameter table of a %d-layer model", L);
  }

  size_t offset = 0;
  char name[LAYOUT_NAME_MAX];
  add_param(t, r, MODEL_EMBED, -1, outline ? NULL : "model.embed_tokens.weight", 2, V, C, Vp, std,
            split_dim(r->io.split[PLAN_MOD_EMBED]), r->embed_here || (c->tie_embeddings && r->head_here), &offset);
  /* expert parallelism: this ep rank holds experts [rank·E/ep, (rank + 1)·E/ep) only */
  const int ep = r->ep_size > 1 ? r->ep_size : 1, ep_rank = ep > 1 ? r->ep_rank : 0;
#define mine(x) (ep == 1 || (x) / (E / ep) == ep_rank)
  for (int l = 0; l < L; l++) {
    t->layer_param0[l] = t->n;
    const int sparse = E && r->moe && r->moe[l];
    if (outline && !r->layer_here[l]) {
      /* no elements here: what the layout reads of the layer's parameters is their units (the
       * layer's) and where experts begin and end, so a run of one class is one parameter */
      const int n = outline_empty_params(r, l);
      if (n == 0)
        t->layer_param0[l] = t->n - 1; /* the run's parameter, the layer before's */
      if (n >= 1)
        add_param(t, r, MODEL_Q, l, NULL, 1, C, 0, C, 0.0f, -1, 0, &offset);
      if (n == 3) {
        add_param(t, r, MODEL_EXPERT_W1, l, NULL, 1, C, 0, C, 0.0f, -1, 0, &offset);
        t->p[t->n - 1].expert = 0;
        add_param(t, r, MODEL_ATTN_NORM, l, NULL, 1, C, 0, C, 0.0f, -1, 0, &offset);
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
        add_param(t, r, MODEL_ROUTER, l, outline ? NULL : name, 2, E, C, E, std, -1, r->layer_here[l], &offset);
        for (int x = 0; x < E; x++) {
          static const enum model_param_kind kinds[3] = { MODEL_EXPERT_W1, MODEL_EXPERT_W2, MODEL_EXPERT_W3 };
          for (int w = 0; w < 3; w++) {
            if (!outline)
              snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.w%d.weight", l, x, w + 1);
            const int64_t o = w == 1 ? C : Fe, i = w == 1 ? Fe : C;
            add_param(t, r, kinds[w], l, outline ? NULL : name, 2, o, i, o, w == 1 ? std_out : std, -1,
                      r->layer_here[l] && mine(x), &offset);
            t->p[t->n - 1].expert = x;
          }
        }
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
        add_param(t, r, table[j].kind, l, outline ? NULL : name, 2, out, in, out,
                  table[j].kind == MODEL_O || table[j].kind == MODEL_DOWN ? std_out : std,
                  split_dim(r->layers[l].split[table[j].module]), r->layer_here[l], &offset);
      else
        add_param(t, r, table[j].kind, l, outline ? NULL : name, 1, C, 0, C, 0.0f, -1, r->layer_here[l], &offset);
    }
  }
#undef mine
  add_param(t, r, MODEL_FINAL_NORM, -1, outline ? NULL : "model.norm.weight", 1, C, 0, C, 0.0f, -1, r->head_here,
            &offset);
  if (!c->tie_embeddings)
    add_param(t, r, MODEL_HEAD, -1, outline ? NULL : "lm_head.weight", 2, V, C, Vp, std,
              split_dim(r->io.split[PLAN_MOD_HEAD]), r->head_here, &offset);
  t->n_elems = offset;
  /* bf16 models: a copy of every parameter held here (the passes read no fp32 weight), packed in
   * table order */
  t->n_bf16 = 0;
  for (int i = 0; i < t->n; i++) {
    struct layout_param *p = &t->p[i];
    p->bf16_offset = LAYOUT_NO_BF16;
    if (r->bf16 && p->n_elems > 0) {
      p->bf16_offset = t->n_bf16;
      t->n_bf16 += (p->n_elems + BF16_ALIGN - 1) / BF16_ALIGN * BF16_ALIGN;
    }
  }
  return 0;
}

int layout_params_adjacent(const struct layout_rank *r, const struct layout_params *t, int layer,
                           enum model_param_kind first, enum model_param_kind last)
{
  if (r->tp_size != 1 || r->zero > 1 || !r->layer_here[layer])
    return 0;
  if (first == MODEL_Q && r->cp_size > 1) /* the ring takes q, k and v apart (runtime/parallel/cp.h) */
    return 0;
  /* the layer's parameters, from layer_param0 (the embedding, then the layers); called for every
   * layer of every pass, so only those are looked at */
  const int base = t->layer_param0[layer];
  const int end = layer + 1 < r->config.n_layers ? t->layer_param0[layer + 1] : t->n;
  const struct layout_param *prev = NULL;
  for (int i = base; i < end; i++) {
    const struct layout_param *p = &t->p[i];
    if (p->layer != layer || p->kind < first || p->kind > last)
      continue;
    if (prev && (prev->offset + prev->n_elems != p->offset ||
                 (r->bf16 && prev->bf16_offset + prev->n_elems != p->bf16_offset)))
      return 0;
    prev = p;
  }
  return prev != NULL;
}
