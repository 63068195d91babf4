/* The activation buffers (model.h, model_acts_*): carved from one allocation per category, so a
 * category is one block on the memory bill; with recompute, the buffers of discarded parts are
 * carved from one area the size of one layer's, shared by every layer and slot. */
#include "runtime/model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model/alloc.h"

/* ---- activations ------------------------------------------------------------------------- */

/* Hands out consecutive slices of one allocation, so a category is one block on the bill. */
struct carve {
  real *base;
  size_t used;
  size_t id_used; /* of used: what carve_bytes handed out (ids, not compute elements) */
};

static real *carve(struct carve *c, size_t n_elems)
{
  real *p = c->base ? c->base + c->used : NULL;
  c->used += (n_elems + MODEL_ALIGN_FLOATS - 1) / MODEL_ALIGN_FLOATS * MODEL_ALIGN_FLOATS;
  return p;
}

/* n bf16 elements, carved as whole reals (billed as compute elements: bytes, not reals, count). */
static bf16 *carve_bf16(struct carve *c, size_t n)
{
  return (bf16 *)carve(c, (n * sizeof(bf16) + sizeof(real) - 1) / sizeof(real));
}

/* n_bytes of another type (token ids, sample indices) carved as whole reals. */
static void *carve_bytes(struct carve *c, size_t n_bytes)
{
  const size_t before = c->used;
  void *p = carve(c, (n_bytes + sizeof(real) - 1) / sizeof(real));
  c->id_used += c->used - before;
  return p;
}

void model_layer_dims(const struct model *m, int layer, struct model_layer_dims *d)
{
  const struct plan_model *c = &m->config;
  const struct tp_layer_layout *y = &m->tp.layers[layer];
  const int tp = m->tp.size, HS = c->head_dim;
  const int full_out[PLAN_N_MODULES] = { 0, c->n_heads * HS, c->n_kv_heads * HS, c->n_kv_heads * HS,
                                         c->dim, c->ffn_dim, c->ffn_dim, c->dim, 0 };
  const int full_in[PLAN_N_MODULES] = { 0, c->dim, c->dim, c->dim, c->n_heads * HS, c->dim, c->dim,
                                        c->ffn_dim, 0 };
  memset(d, 0, sizeof *d);
  for (int k = PLAN_LAYER_MOD_FIRST; k <= PLAN_LAYER_MOD_LAST; k++) {
    d->w_out[k] = full_out[k] / (y->split[k] == PLAN_SPLIT_COLUMN ? tp : 1);
    d->w_in[k] = full_in[k] / (y->split[k] == PLAN_SPLIT_ROW ? tp : 1);
  }
  d->NHl = y->attn_sharded ? c->n_heads / tp : c->n_heads;
  d->NKVl = y->kv == TP_FEAT ? c->n_kv_heads / tp : y->kv == TP_KV ? d->NHl : c->n_kv_heads;
  d->A = d->NHl * HS;
  d->Fl = y->mlp_sharded ? c->ffn_dim / tp : c->ffn_dim;
  if (m->moe && m->moe[layer])
    d->Fl = c->moe.ffn_dim; /* the experts are whole on every TP rank (replicated over tp) */
}

/* Whether parameters first .. last (kinds, one after the other in the table) of layer l lie one
 * after the other in the flat layout as laid out (the data-parallel buckets pad at their ends)
 * and among the bf16 copies: one product over them can read their weights, and write their
 * gradients, as one matrix. One TP rank and ZeRO ≤ 1 only (gradients in grad_memory). */
static int adjacent_weights(const struct model *m, int layer, enum model_param_kind first,
                            enum model_param_kind last)
{
  if (m->tp.size != 1 || m->zero > 1 || !m->layer_here[layer])
    return 0;
  /* the layer's parameters, from layer_param0 (create_table: the embedding, then the layers);
   * called for every layer of every pass, so only those are looked at */
  const int base = m->layer_param0[layer];
  const int end = layer + 1 < m->config.n_layers ? m->layer_param0[layer + 1] : m->n_params;
  const struct model_param *prev = NULL;
  for (int i = base; i < end; i++) {
    const struct model_param *p = &m->params[i];
    if (p->layer != layer || p->kind < first || p->kind > last)
      continue;
    if (prev && (prev->offset + prev->n_elems != p->offset ||
                 (m->bf16 && prev->bf16_offset + prev->n_elems != p->bf16_offset)))
      return 0;
    prev = p;
  }
  return prev != NULL;
}

int model_gate_up_fused(const struct model *m, int layer)
{
  return adjacent_weights(m, layer, MODEL_GATE, MODEL_UP);
}

int model_qkv_fused(const struct model *m, int layer)
{
  return adjacent_weights(m, layer, MODEL_Q, MODEL_V);
}

int model_home_T(const struct model *m, int T)
{
  return m->tp.io.home == TP_SEQ ? T / m->tp.size : T;
}

/* What the layer's recompute policy discards after forward (and its backward recomputes): the
 * buffers of each part. */
static int discarded(uint8_t rc, uint8_t parts)
{
  return (rc & parts) != 0;
}

/* Lays out every buffer; with base NULL it only counts. act: this slot's saved activations;
 * rec: what recomputed parts write (every layer starts it again from 0: one layer's worth);
 * work: the workspace. rec and work are skipped (left as they are) when a->shares. */
static void layout_acts(struct model_acts *a, const struct model *m, const struct model_acts_scope *sc,
                        struct carve *act, struct carve *rec, struct carve *work)
{
  const struct plan_model *c = &m->config;
  const int L = c->n_layers;
  const size_t BT = (size_t)a->B_max * a->T_max, C = (size_t)c->dim, F = (size_t)c->ffn_dim;
  const size_t BTh = (size_t)a->B_max * model_home_T(m, a->T_max);
  const size_t TT = (size_t)a->T_max * a->T_max, HS = (size_t)c->head_dim;
  const size_t Vl = (size_t)c->vocab_padded / (m->tp.io.split[PLAN_MOD_HEAD] == PLAN_SPLIT_VOCAB ? m->tp.size : 1);
  const int drop = c->dropout > 0.0, lowp = m->bf16;
  int NH_max = 1, any_fused = 0, any_sparse = 0;
  size_t qkv_max = 0; /* the widest fused q|k|v row */
  size_t rec_max = 0;
  /* what this set covers: the model's, cut to the scope */
#define IN_SCOPE(l) (m->layer_here[l] && (!sc || ((l) >= sc->first && (l) < sc->first + sc->n)))
  const int embed = m->embed_here && (!sc || sc->embed), head = m->head_here && (!sc || sc->head);
  for (int i = 0; i <= L; i++) { /* residual[i]: the input of layer i, the output of layer i − 1 */
    int needed = (i < L && IN_SCOPE(i)) || (i > 0 && IN_SCOPE(i - 1)) || (i == 0 && embed) || (i == L && head);
    a->residual[i] = needed ? carve(act, BTh * C) : NULL;
  }
  for (int l = 0; l < L; l++) {
    struct model_layer_acts *la = &a->layers[l];
    if (!IN_SCOPE(l)) /* left as the callers allocate them, zero */
      continue;
    memset(la, 0, sizeof *la);
    struct model_layer_dims d;
    model_layer_dims(m, l, &d);
    const uint8_t rc = m->recompute ? m->recompute[l] : 0;
    const size_t rec_start = rec->used;
#define BUF(parts, n) (discarded(rc, (parts)) ? carve(rec, (n)) : carve(act, (n)))
    NH_max = d.NHl > NH_max ? d.NHl : NH_max;
#define BUF_B(parts, n) (discarded(rc, (parts)) ? carve_bf16(rec, (n)) : carve_bf16(act, (n)))
    if (lowp) /* the linears' inputs in bf16 only, as their producers write them */
      la->ln1_b = BUF_B(PLAN_RC_ATTN_NORM | PLAN_RC_ATTN, BTh * C);
    else
      la->ln1 = BUF(PLAN_RC_ATTN_NORM | PLAN_RC_ATTN, BTh * C);
    la->ln1_rstd = BUF(PLAN_RC_ATTN_NORM | PLAN_RC_ATTN, BTh);
    if (model_qkv_fused(m, l)) { /* rows of [q | k | v] */
      const size_t Dq = (size_t)d.NHl * HS, Dkv = (size_t)d.NKVl * HS;
      la->q = BUF(PLAN_RC_ATTN, BT * (Dq + 2 * Dkv));
      la->k = la->q ? la->q + Dq : NULL;
      la->v = la->q ? la->q + Dq + Dkv : NULL;
      qkv_max = Dq + 2 * Dkv > qkv_max ? Dq + 2 * Dkv : qkv_max;
    } else {
      la->q = BUF(PLAN_RC_ATTN, BT * (size_t)d.NHl * HS);
      la->k = BUF(PLAN_RC_ATTN, BT * (size_t)d.NKVl * HS);
      la->v = BUF(PLAN_RC_ATTN, BT * (size_t)d.NKVl * HS);
    }
    la->probs = BUF(PLAN_RC_ATTN_CORE | PLAN_RC_ATTN, a->B_max * (size_t)d.NHl * TT);
    la->probs_mask = drop ? BUF(PLAN_RC_ATTN_CORE | PLAN_RC_ATTN, a->B_max * (size_t)d.NHl * TT) : NULL;
    if (lowp) {
      la->o_in_b = BUF_B(PLAN_RC_ATTN_CORE | PLAN_RC_ATTN, BT * (size_t)d.w_in[PLAN_MOD_O]);
    } else {
      la->atty = BUF(PLAN_RC_ATTN_CORE | PLAN_RC_ATTN, BT * (size_t)d.A);
      la->o_in = m->tp.layers[l].attn_sharded == (m->tp.layers[l].split[PLAN_MOD_O] == PLAN_SPLIT_ROW)
                   ? la->atty : BUF(PLAN_RC_ATTN_CORE | PLAN_RC_ATTN, BT * (size_t)d.w_in[PLAN_MOD_O]);
    }
    la->attn_mask = drop ? BUF(PLAN_RC_ATTN, BTh * C) : NULL;
    la->mid = BUF(PLAN_RC_ATTN, BTh * C);
    if (lowp)
      la->ln2_b = BUF_B(PLAN_RC_MLP_NORM | PLAN_RC_MLP, BTh * C);
    else
      la->ln2 = BUF(PLAN_RC_MLP_NORM | PLAN_RC_MLP, BTh * C);
    la->ln2_rstd = BUF(PLAN_RC_MLP_NORM | PLAN_RC_MLP, BTh);
    if (m->moe && m->moe[l]) { /* the sparse MLP (model_moe.c); never recomputed (plan_validate) */
      const size_t E = (size_t)c->moe.experts, K = (size_t)c->moe.top_k, Fe = (size_t)c->moe.ffn_dim;
      const size_t R = model_moe_rows(m, a->B_max, a->T_max);
      const size_t Rx = model_moe_rows_received(m, a->B_max, a->T_max); /* the experts' rows here */
      la->moe_probs = carve(act, BT * E);
      la->moe_topw = carve(act, BT * K);
      la->moe_lse = carve(act, BT);
      la->moe_topi = carve_bytes(act, BT * K * sizeof(int));
      la->moe_slot = carve_bytes(act, BT * K * sizeof(int));
      la->moe_counts = carve_bytes(act, E * sizeof(int));
      la->moe_routed = carve_bytes(act, E * sizeof(int));
      la->moe_xe = carve(act, R * C);
      la->moe_xr = m->ep.size > 1 ? carve(act, Rx * C) : NULL;
      la->gate = carve(act, Rx * Fe);
      la->up = carve(act, Rx * Fe);
      la->hidden = carve(act, Rx * Fe);
      la->moe_ye = carve(act, R * C);
      la->moe_rows = a->moe_rows_memory ? a->moe_rows_memory + (size_t)l * E : NULL;
      la->mlp_mask = drop ? carve(act, BTh * C) : NULL;
      any_sparse = 1;
      rec_max = rec->used - rec_start > rec_max ? rec->used - rec_start : rec_max;
      rec->used = rec_start;
      continue;
    }
    if (model_gate_up_fused(m, l)) {
      la->gate = BUF(PLAN_RC_MLP, BT * 2 * (size_t)d.Fl);
      any_fused = 1;
    } else {
      la->gate = BUF(PLAN_RC_MLP, BT * (size_t)d.Fl);
      la->up = BUF(PLAN_RC_MLP, BT * (size_t)d.Fl);
    }
    if (lowp) {
      la->down_in_b = BUF_B(PLAN_RC_MLP_ACT | PLAN_RC_MLP, BT * (size_t)d.w_in[PLAN_MOD_DOWN]);
    } else {
      la->hidden = BUF(PLAN_RC_MLP_ACT | PLAN_RC_MLP, BT * (size_t)d.Fl);
      la->down_in = (m->tp.layers[l].mlp_sharded == (m->tp.layers[l].split[PLAN_MOD_DOWN] == PLAN_SPLIT_ROW))
                      ? la->hidden : BUF(PLAN_RC_MLP_ACT | PLAN_RC_MLP, BT * (size_t)d.w_in[PLAN_MOD_DOWN]);
    }
    la->mlp_mask = drop ? BUF(PLAN_RC_MLP, BTh * C) : NULL;
#undef BUF
#undef BUF_B
    rec_max = rec->used - rec_start > rec_max ? rec->used - rec_start : rec_max;
    rec->used = rec_start; /* the next layer writes over this one's */
  }
#undef IN_SCOPE
  rec->used += rec_max;
  if (head) {
    if (lowp) {
      a->head_in_b = carve_bf16(act, BT * C);
    } else {
      a->lnf = carve(act, BTh * C);
      a->head_in = m->tp.io.home == TP_R ? a->lnf : carve(act, BT * C);
    }
    a->lnf_rstd = carve(act, BTh);
    a->logits = carve(act, BT * Vl);
    a->losses = carve(act, BT);
    a->targets = carve_bytes(act, BT * sizeof(int));
  }
  a->ce_stats = carve(act, BT * 3);
  a->rope_cos = carve(act, (size_t)a->T_max * HS / 2);
  a->rope_sin = carve(act, (size_t)a->T_max * HS / 2);
  a->tokens = carve_bytes(act, BT * sizeof(int));

  if (a->shares)
    return;
  size_t widest = C > F ? C : F;
  widest = widest > (size_t)c->vocab_padded ? widest : (size_t)c->vocab_padded;
  a->dresidual = carve(work, BTh * C);
  a->work_c1 = carve(work, BT * C);
  a->work_c2 = carve(work, BT * C);
  a->work_c3 = carve(work, BT * C);
  a->work_c4 = carve(work, BT * C);
  a->in_r = carve(work, BT * C);
  a->in_f = carve(work, BT * C);
  a->dq = carve(work, BT * (qkv_max > C ? qkv_max : C));
  a->dk = carve(work, BT * C);
  a->dv = carve(work, BT * C);
  a->dhidden = carve(work, BT * F);
  a->dgate = carve(work, BT * F * (any_fused ? 2 : 1));
  a->dup = carve(work, BT * F);
  a->work_f1 = carve(work, BT * F);
  a->work_f2 = carve(work, BT * F);
  a->pack = m->tp.size > 1 ? carve(work, BT * widest) : NULL;
  a->gains = carve(work, 2 * C);
  if (any_sparse) {
    const size_t E = (size_t)c->moe.experts, K = (size_t)c->moe.top_k, Fe = (size_t)c->moe.ffn_dim;
    const size_t R = model_moe_rows(m, a->B_max, a->T_max);
    const size_t Rx = model_moe_rows_received(m, a->B_max, a->T_max);
    a->moe_dxe = carve(work, R * C);
    a->moe_dye = carve(work, R * C);
    a->moe_dgate = carve(work, Rx * Fe);
    a->moe_dup = carve(work, Rx * Fe);
    a->moe_dhid = carve(work, Rx * Fe);
    if (m->ep.size > 1) {
      const int cap = plan_moe_capacity(c, a->T_max);
      a->moe_pad = cap > 0 ? carve(work, E * (size_t)a->B_max * (size_t)cap * C) : NULL;
      a->moe_yr = carve(work, Rx * C);
      a->moe_dyr = carve(work, Rx * C);
      a->moe_dxr = carve(work, Rx * C);
    }
    a->moe_logits = carve(work, BT * E);
    a->moe_dtopw = carve(work, BT * K);
    a->moe_aux = carve(work, (size_t)a->B_max);
  }
  a->attn_scratch = carve(work, m->k->attention_scratch_n_elems(m->kctx, a->B_max, a->T_max,
                                                                 NH_max, NH_max));
  if (lowp) { /* the widest product output: a fused gate|up's is 2F */
    size_t out_max = widest > Vl ? widest : Vl;
    out_max = any_fused && 2 * F > out_max ? 2 * F : out_max;
    out_max = qkv_max > out_max ? qkv_max : out_max;
    a->dout_b = carve_bf16(work, BT * out_max);
  }
}

static int acts_create(struct model_acts *a, const struct model *m, int B_max, int T_max,
                       const struct model_acts *first, const struct model_acts_scope *scope, char *err,
                       size_t err_size)
{
  memset(a, 0, sizeof *a);
  a->B_max = B_max;
  a->T_max = T_max;
  a->shares = first != NULL;
  const int L = m->config.n_layers;
  a->layers = calloc((size_t)L, sizeof *a->layers);
  a->residual = calloc((size_t)L + 1, sizeof *a->residual);
  uint64_t *samples = calloc((size_t)B_max, sizeof *samples);
  int *moe_rows = m->moe_stat ? calloc((size_t)L * (size_t)m->config.moe.experts, sizeof *moe_rows) : NULL;
  if (!a->layers || !a->residual || !samples || (m->moe_stat && !moe_rows)) {
    free(samples);
    free(moe_rows);
    goto out_of_memory;
  }
  struct carve act = { 0 }, rec = { 0 }, work = { 0 };
  layout_acts(a, m, scope, &act, &rec, &work);
  act.base = alloc_reals_on(m->device, ALLOC_ACTIVATIONS, act.used);
  if (first) {
    rec.base = first->recompute_memory;
    work.base = first->workspace_memory;
  } else {
    rec.base = rec.used ? alloc_reals_on(m->device, ALLOC_ACTIVATIONS, rec.used) : NULL;
    work.base = alloc_reals_on(m->device, ALLOC_WORKSPACE, work.used);
  }
  if (!act.base || (!first && ((rec.used && !rec.base) || !work.base))) {
    alloc_free(act.base);
    if (!first) {
      alloc_free(rec.base);
      alloc_free(work.base);
    }
    free(samples);
    free(moe_rows);
    goto out_of_memory;
  }
  act.used = rec.used = work.used = 0;
  a->activation_memory = act.base;
  a->recompute_memory = rec.base;
  a->workspace_memory = work.base;
  if (first) { /* the workspace pointers are first's */
    struct model_acts mine = *a;
    *a = *first;
    a->layers = mine.layers;
    a->residual = mine.residual;
    a->activation_memory = mine.activation_memory;
    a->shares = 1;
  }
  a->drop.samples = samples;
  a->moe_rows_memory = moe_rows;
  layout_acts(a, m, scope, &act, &rec, &work);
  m->k->rope_table(m->kctx, a->rope_cos, a->rope_sin, T_max, m->config.head_dim,
                   m->config.rope_theta, 0);
  return 0;

out_of_memory:
  snprintf(err, err_size, "out of memory for the activations of %d × %d tokens", B_max, T_max);
  free(a->layers);
  free(a->residual);
  memset(a, 0, sizeof *a);
  return -1;
}

int model_acts_count(const struct model *m, int B_max, int T_max, const struct model_acts_scope *scope,
                     size_t counts[4])
{
  struct model_acts a;
  memset(&a, 0, sizeof a);
  a.B_max = B_max;
  a.T_max = T_max;
  a.layers = calloc((size_t)m->config.n_layers, sizeof *a.layers);
  a.residual = calloc((size_t)m->config.n_layers + 1, sizeof *a.residual);
  if (!a.layers || !a.residual) {
    free(a.layers);
    free(a.residual);
    return -1;
  }
  struct carve act = { 0 }, rec = { 0 }, work = { 0 };
  layout_acts(&a, m, scope, &act, &rec, &work);
  counts[0] = act.used;
  counts[1] = rec.used;
  counts[2] = work.used;
  counts[3] = act.id_used;
  free(a.layers);
  free(a.residual);
  return 0;
}

int model_acts_create(struct model_acts *a, const struct model *m, int B_max, int T_max,
                      char *err, size_t err_size)
{
  return acts_create(a, m, B_max, T_max, NULL, NULL, err, err_size);
}

int model_acts_create_slot(struct model_acts *a, const struct model *m, const struct model_acts *first,
                           const struct model_acts_scope *scope, char *err, size_t err_size)
{
  return acts_create(a, m, first->B_max, first->T_max, first, scope, err, err_size);
}

void model_acts_free(struct model_acts *a)
{
  alloc_free(a->activation_memory);
  if (!a->shares) {
    alloc_free(a->recompute_memory);
    alloc_free(a->workspace_memory);
  }
  free(a->layers);
  free(a->residual);
  free(a->drop.samples);
  free(a->moe_rows_memory);
  memset(a, 0, sizeof *a);
}
