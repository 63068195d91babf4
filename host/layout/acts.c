/* The activation and workspace layout (acts.h): one walk of the buffers, in the order the areas
 * are carved. */
#include "layout/acts.h"

#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"
#include "real.h"

void layout_layer_dims(const struct layout_rank *r, int layer, struct model_layer_dims *d)
{
  const struct plan_model *c = &r->config;
  const struct tp_layer_layout *y = &r->layers[layer];
  const int tp = r->tp_size, HS = c->head_dim;
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
  if (r->moe && r->moe[layer])
    d->Fl = c->moe.ffn_dim; /* the experts are whole on every TP rank (replicated over tp) */
}

int layout_cp_rows(int T, int cp)
{
  if (cp <= 1)
    return T;
  int most = 0;
  for (int i = 0; i < cp; i++) {
    const int n = attention_cp_rank_tokens(T, cp, i);
    most = n > most ? n : most;
  }
  return most;
}

void layout_cp_heads(const struct layout_rank *r, int *NH, int *NKV)
{
  *NH = *NKV = 1;
  for (int l = 0; l < r->config.n_layers; l++) {
    struct model_layer_dims d;
    layout_layer_dims(r, l, &d);
    *NH = d.NHl > *NH ? d.NHl : *NH;
    *NKV = d.NKVl > *NKV ? d.NKVl : *NKV;
  }
}

void layout_cp_ring(struct layout_cp_ring *out, const struct kernel_ops *k, void *kctx, int B, int T, int cp, int NH,
                    int NKV, int HS)
{
  memset(out, 0, sizeof *out);
  out->maxTl = layout_cp_rows(T, cp);
  out->rows = (size_t)B * out->maxTl;
  out->kv = 2 * out->rows * NKV * HS;
  out->scratch = k->attention_cp_scratch_n_elems(kctx, B, out->maxTl, out->maxTl, NH, NKV, HS);
  out->comm = 4 * out->kv;
  out->work = out->kv + out->rows * NH * HS + 2 * out->rows * NH + out->scratch;
}

int layout_home_T(const struct layout_rank *r, int T)
{
  return r->io.home == TP_SEQ ? T / r->tp_size : T;
}

size_t layout_moe_rows(const struct plan_model *c, int B, int T)
{
  const struct plan_moe *e = &c->moe;
  if (e->experts <= 0)
    return 0;
  const size_t all = (size_t)B * T * e->top_k;
  const int cap = plan_moe_capacity(c, T);
  const size_t kept = (size_t)B * e->experts * cap;
  return cap > 0 && kept < all ? kept : all;
}

size_t layout_moe_rows_received(const struct plan_model *c, int ep_size, int B, int T)
{
  const struct plan_moe *e = &c->moe;
  const int ep = ep_size;
  if (e->experts <= 0 || ep <= 1)
    return layout_moe_rows(c, B, T);
  const int cap = plan_moe_capacity(c, T), El = e->experts / ep;
  if (cap > 0) /* every expert's block padded to B · capacity rows */
    return (size_t)e->experts * B * cap;
  return (size_t)ep * B * T * (size_t)(e->top_k < El ? e->top_k : El);
}

/* One area being carved: consecutive aligned slices. */
struct carve {
  enum acts_area area;
  size_t used;
  size_t id_used;    /* of used: what carve_bytes handed out (ids, not compute elements) */
  size_t elem_bytes; /* one compute element's bytes where the area lives (carve_bf16) */
};

static struct acts_at carve(struct carve *c, size_t n_elems)
{
  const struct acts_at at = { c->used, c->area };
  c->used += (n_elems + LAYOUT_ALIGN - 1) / LAYOUT_ALIGN * LAYOUT_ALIGN;
  return at;
}

/* n bf16 elements, carved as whole compute elements (billed as such: bytes, not reals, count) of
 * the area's element size: this build's real, or the GPU's fp32 where a float64 build bills a GPU
 * plan. */
static struct acts_at carve_bf16(struct carve *c, size_t n)
{
  return carve(c, (n * sizeof(bf16) + c->elem_bytes - 1) / c->elem_bytes);
}

/* n_bytes of another type (token ids, sample indices) carved as whole reals. */
static struct acts_at carve_bytes(struct carve *c, size_t n_bytes)
{
  const size_t before = c->used;
  const struct acts_at at = carve(c, (n_bytes + sizeof(real) - 1) / sizeof(real));
  c->id_used += c->used - before;
  return at;
}

static const struct acts_at none = { 0, ACTS_NULL };

/* `by` elements past a buffer (a view into it). */
static struct acts_at shift(struct acts_at at, size_t by)
{
  at.off += by;
  return at;
}

/* What the layer's recompute policy discards after forward (and its backward recomputes): the
 * buffers of each part. */
static int discarded(uint8_t rc, uint8_t parts)
{
  return (rc & parts) != 0;
}

void layout_acts_free(struct acts_layout *a)
{
  free(a->residual);
  free(a->layers);
  memset(a, 0, sizeof *a);
}

int layout_acts_build(struct acts_layout *a, const struct layout_rank *r, const struct layout_params *t,
                      const struct kernel_ops *kt, void *kctx, int B_max, int T_max,
                      const struct model_acts_scope *sc, int shares, size_t elem_bytes)
{
  memset(a, 0, sizeof *a);
  const struct plan_model *c = &r->config;
  const int L = c->n_layers;
  a->layers = calloc((size_t)L, sizeof *a->layers);
  a->residual = calloc((size_t)L + 1, sizeof *a->residual);
  if (!a->layers || !a->residual) {
    layout_acts_free(a);
    return -1;
  }
  const size_t eb = elem_bytes ? elem_bytes : sizeof(real);
  struct carve act_ = { ACTS_SAVED, 0, 0, eb }, rec_ = { ACTS_RECOMPUTE, 0, 0, eb }, work_ = { ACTS_WORK, 0, 0, eb };
  struct carve *act = &act_, *rec = &rec_, *work = &work_;
  const size_t BT = (size_t)B_max * T_max, C = (size_t)c->dim, F = (size_t)c->ffn_dim;
  const size_t BTh = (size_t)B_max * layout_home_T(r, T_max);
  const size_t HS = (size_t)c->head_dim;
  const size_t Vl = (size_t)c->vocab_padded / (r->io.split[PLAN_MOD_HEAD] == PLAN_SPLIT_VOCAB ? r->tp_size : 1);
  /* lowp: a bf16 model on one TP rank, whose linears' inputs are written in bf16 by their producers
   * and kept so; at tp > 1 a bf16 model keeps the fp32 inputs its conversions move and each
   * product rounds its input into in_b (runtime/model/model_passes_bf16.c) */
  const int drop = c->dropout > 0.0, lowp = r->bf16 && r->tp_size == 1;
  int NH_max = 1, any_fused = 0, any_sparse = 0;
  size_t qkv_max = 0; /* the widest fused q|k|v row */
  size_t rec_max = 0;
  /* what this set covers: the rank's, cut to the scope */
#define IN_SCOPE(l) (r->layer_here[l] && (!sc || ((l) >= sc->first && (l) < sc->first + sc->n)))
  const int embed = r->embed_here && (!sc || sc->embed), head = r->head_here && (!sc || sc->head);
  for (int i = 0; i <= L; i++) { /* residual[i]: the input of layer i, the output of layer i − 1 */
    int needed = (i < L && IN_SCOPE(i)) || (i > 0 && IN_SCOPE(i - 1)) || (i == 0 && embed) || (i == L && head);
    a->residual[i] = needed ? carve(act, BTh * C) : none;
  }
  for (int l = 0; l < L; l++) {
    struct acts_layer_layout *la = &a->layers[l];
    if (!IN_SCOPE(l)) /* left as the callers have them */
      continue;
    la->in_scope = 1;
    const int lowl = lowp && !(r->moe && r->moe[l]); /* a sparse layer keeps fp32 inputs */
#define NONE_(f) la->f = none;
    ACTS_LAYER_BUFFERS(NONE_)
#undef NONE_
    struct model_layer_dims d;
    layout_layer_dims(r, l, &d);
    const uint8_t rc = r->recompute ? r->recompute[l] : 0;
    const size_t rec_start = rec->used;
#define BUF(parts, n) (discarded(rc, (parts)) ? carve(rec, (n)) : carve(act, (n)))
    NH_max = d.NHl > NH_max ? d.NHl : NH_max;
#define BUF_B(parts, n) (discarded(rc, (parts)) ? carve_bf16(rec, (n)) : carve_bf16(act, (n)))
    if (lowl) /* the linears' inputs in bf16 only, as their producers write them */
      la->ln1_b = BUF_B(PLAN_RC_ATTN_NORM | PLAN_RC_ATTN, BTh * C);
    else
      la->ln1 = BUF(PLAN_RC_ATTN_NORM | PLAN_RC_ATTN, BTh * C);
    la->ln1_rstd = BUF(PLAN_RC_ATTN_NORM | PLAN_RC_ATTN, BTh);
    if (layout_params_adjacent(r, t, l, MODEL_Q, MODEL_V)) { /* fused: rows of [q | k | v] */
      const size_t Dq = (size_t)d.NHl * HS, Dkv = (size_t)d.NKVl * HS;
      la->q = BUF(PLAN_RC_ATTN, BT * (Dq + 2 * Dkv));
      la->k = shift(la->q, Dq);
      la->v = shift(la->q, Dq + Dkv);
      qkv_max = Dq + 2 * Dkv > qkv_max ? Dq + 2 * Dkv : qkv_max;
    } else {
      la->q = BUF(PLAN_RC_ATTN, BT * (size_t)d.NHl * HS);
      la->k = BUF(PLAN_RC_ATTN, BT * (size_t)d.NKVl * HS);
      la->v = BUF(PLAN_RC_ATTN, BT * (size_t)d.NKVl * HS);
    }
    /* The attention keeps O(T · d) for its backward: each row's log-sum-exp and its output in
     * fp32 (a bf16 model's too: backward's Σ dout · out must see what the forward computed). */
    la->lse = BUF(PLAN_RC_ATTN_CORE | PLAN_RC_ATTN, (size_t)B_max * (size_t)d.NHl * T_max);
    la->atty = BUF(PLAN_RC_ATTN_CORE | PLAN_RC_ATTN, BT * (size_t)d.A);
    if (lowl) {
      la->o_in_b = BUF_B(PLAN_RC_ATTN_CORE | PLAN_RC_ATTN, BT * (size_t)d.w_in[PLAN_MOD_O]);
    } else {
      la->o_in = r->layers[l].attn_sharded == (r->layers[l].split[PLAN_MOD_O] == PLAN_SPLIT_ROW)
                   ? la->atty : BUF(PLAN_RC_ATTN_CORE | PLAN_RC_ATTN, BT * (size_t)d.w_in[PLAN_MOD_O]);
    }
    la->attn_mask = drop ? BUF(PLAN_RC_ATTN, BTh * C) : none;
    la->mid = BUF(PLAN_RC_ATTN, BTh * C);
    if (lowl)
      la->ln2_b = BUF_B(PLAN_RC_MLP_NORM | PLAN_RC_MLP, BTh * C);
    else
      la->ln2 = BUF(PLAN_RC_MLP_NORM | PLAN_RC_MLP, BTh * C);
    la->ln2_rstd = BUF(PLAN_RC_MLP_NORM | PLAN_RC_MLP, BTh);
    if (r->moe && r->moe[l]) { /* the sparse MLP; never recomputed (plan_validate) */
      const size_t E = (size_t)c->moe.experts, K = (size_t)c->moe.top_k, Fe = (size_t)c->moe.ffn_dim;
      const size_t R = layout_moe_rows(c, B_max, T_max);
      const size_t Rx = layout_moe_rows_received(c, r->ep_size, B_max, T_max); /* the experts' rows here */
      la->moe_probs = carve(act, BT * E);
      la->moe_topw = carve(act, BT * K);
      la->moe_lse = carve(act, BT);
      la->moe_topi = carve_bytes(act, BT * K * sizeof(int));
      la->moe_slot = carve_bytes(act, BT * K * sizeof(int));
      la->moe_counts = carve_bytes(act, E * sizeof(int));
      la->moe_routed = carve_bytes(act, E * sizeof(int));
      if (r->bf16) { /* the experts' rows in bf16 (model_moe.c): what their products read and
                      * what backward needs, the fp32 ones in the workspace's moe_xw */
        la->moe_x_b = carve_bf16(act, (r->ep_size > 1 ? Rx : R) * C);
        la->gate_b = carve_bf16(act, Rx * Fe);
        la->up_b = carve_bf16(act, Rx * Fe);
        la->hidden_b = carve_bf16(act, Rx * Fe);
        la->moe_ye_b = carve_bf16(act, R * C);
      } else {
        la->moe_xe = carve(act, R * C);
        la->moe_xr = r->ep_size > 1 ? carve(act, Rx * C) : none;
        la->gate = carve(act, Rx * Fe);
        la->up = carve(act, Rx * Fe);
        la->hidden = carve(act, Rx * Fe);
        la->moe_ye = carve(act, R * C);
      }
      la->mlp_mask = drop ? carve(act, BTh * C) : none;
      any_sparse = 1;
      rec_max = rec->used - rec_start > rec_max ? rec->used - rec_start : rec_max;
      rec->used = rec_start;
      continue;
    }
    if (layout_params_adjacent(r, t, l, MODEL_GATE, MODEL_UP)) {
      la->gate = BUF(PLAN_RC_MLP, BT * 2 * (size_t)d.Fl);
      any_fused = 1;
    } else {
      la->gate = BUF(PLAN_RC_MLP, BT * (size_t)d.Fl);
      la->up = BUF(PLAN_RC_MLP, BT * (size_t)d.Fl);
    }
    if (lowl) {
      la->down_in_b = BUF_B(PLAN_RC_MLP_ACT | PLAN_RC_MLP, BT * (size_t)d.w_in[PLAN_MOD_DOWN]);
    } else {
      la->hidden = BUF(PLAN_RC_MLP_ACT | PLAN_RC_MLP, BT * (size_t)d.Fl);
      la->down_in = (r->layers[l].mlp_sharded == (r->layers[l].split[PLAN_MOD_DOWN] == PLAN_SPLIT_ROW))
                      ? la->hidden : BUF(PLAN_RC_MLP_ACT | PLAN_RC_MLP, BT * (size_t)d.w_in[PLAN_MOD_DOWN]);
    }
    la->mlp_mask = drop ? BUF(PLAN_RC_MLP, BTh * C) : none;
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
      a->head_in = r->io.home == TP_R ? a->lnf : carve(act, BT * C);
    }
    a->lnf_rstd = carve(act, BTh);
    a->logits = carve(act, BT * Vl);
    a->losses = carve(act, BT);
    a->targets = carve_bytes(act, BT * sizeof(int));
  }
  a->ce_stats = carve(act, BT * 3);
  a->rope_cos = carve(act, (size_t)T_max * HS / 2);
  a->rope_sin = carve(act, (size_t)T_max * HS / 2);
  a->tokens = carve_bytes(act, BT * sizeof(int));

  if (!shares) {
    size_t widest = C > F ? C : F;
    const size_t widest_in = (size_t)c->n_heads * HS > F ? (size_t)c->n_heads * HS : F;
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
    a->pack = r->tp_size > 1 ? carve(work, BT * widest) : none;
    a->gains = carve(work, 2 * C);
    a->gain_w = r->bf16 ? carve(work, C) : none; /* a bf16 model: a norm's gain widened from its copy */
    if (any_sparse) {
      const size_t E = (size_t)c->moe.experts, K = (size_t)c->moe.top_k, Fe = (size_t)c->moe.ffn_dim;
      const size_t R = layout_moe_rows(c, B_max, T_max);
      const size_t Rx = layout_moe_rows_received(c, r->ep_size, B_max, T_max);
      a->moe_xw = r->bf16 ? carve(work, R * C) : none;
      a->moe_dxe = carve(work, R * C);
      a->moe_dye = carve(work, R * C);
      a->moe_dgate = carve(work, Rx * Fe);
      a->moe_dup = carve(work, Rx * Fe);
      a->moe_dhid = carve(work, Rx * Fe);
      if (r->ep_size > 1) {
        const int cap = plan_moe_capacity(c, T_max);
        a->moe_pad = cap > 0 ? carve(work, E * (size_t)B_max * (size_t)cap * C) : none;
        a->moe_yr = carve(work, Rx * C);
        a->moe_dyr = carve(work, Rx * C);
        a->moe_dxr = carve(work, Rx * C);
        /* a bf16 model's rows travel in bf16 (model_moe.c, ep_exchange): what a rank sends,
         * rounded, and what it receives, each the larger of the two directions' row counts */
        const size_t sent = cap > 0 ? E * (size_t)B_max * (size_t)cap : R, wire = (sent > Rx ? sent : Rx) * C;
        a->moe_wire_out = r->bf16 ? carve_bf16(work, wire) : none;
        a->moe_wire_in = r->bf16 ? carve_bf16(work, wire) : none;
      }
      a->moe_logits = carve(work, BT * E);
      a->moe_dtopw = carve(work, BT * K);
      a->moe_aux = carve(work, (size_t)B_max);
    }
    /* the bf16 mode's attention packs its bf16 operands there too, where the backend has it; under
     * context parallelism the ring runs every attention, in scratch of its own (layout_cp_ring) */
    a->attn_scratch = carve(work, r->cp_size > 1 ? 0
                                  : (r->bf16 && kt->attention_scratch_n_elems_bf16 ? kt->attention_scratch_n_elems_bf16
                                                                                  : kt->attention_scratch_n_elems)(
                                      kctx, B_max, T_max, NH_max, NH_max, (int)HS));
    /* a sparse layer's products: the router's (B·T rows, E out) and an expert's (at most every
     * row its rank's experts receive, C or Fe wide in and out) */
    const size_t E = any_sparse ? (size_t)c->moe.experts : 0, Fe = any_sparse ? (size_t)c->moe.ffn_dim : 0;
    const size_t Rx = any_sparse ? layout_moe_rows_received(c, r->ep_size, B_max, T_max) : 0;
    const size_t expert_n = Rx * (C > Fe ? C : Fe);
    /* a product's fp32 input rounded: at tp > 1 any linear's (the widest: C, F, o's NH·HS), on
     * one tp rank only a router's (C); the experts read their kept bf16 rows (model_moe.c) */
    if (r->bf16 && (!lowp || any_sparse))
      a->in_b = carve_bf16(work, BT * (lowp || widest_in < C ? C : widest_in));
    if (r->bf16) { /* the widest product output: a fused gate|up's is 2F */
      size_t out_max = widest > Vl ? widest : Vl;
      out_max = any_fused && 2 * F > out_max ? 2 * F : out_max;
      out_max = qkv_max > out_max ? qkv_max : out_max;
      out_max = E > out_max ? E : out_max;
      a->dout_b = carve_bf16(work, BT * out_max > expert_n ? BT * out_max : expert_n);
    }
  }
  a->n[ACTS_SAVED] = act->used;
  a->n[ACTS_RECOMPUTE] = rec->used;
  a->n[ACTS_WORK] = work->used;
  a->ids = act->id_used;
  return 0;
}

/* The linears' output widths per token of stage st on one tp rank: column-split outputs (q, k, v,
 * gate, up; the head's vocab) are 1/tp, row-split ones (o, down) whole before their reduction; a
 * sparse layer's experts are whole on every tp rank, top_k of them per token. */
static double dout_per_token(const struct plan *p, int st)
{
  const struct plan_model *c = &p->model;
  const struct plan_stage *s = &p->stages[st];
  const double tp = p->mesh.tp, hd = c->head_dim;
  double e = 0;
  for (int l = s->first_layer; s->first_layer >= 0 && l < s->first_layer + s->n_layers; l++) {
    e += (c->n_heads * hd + 2.0 * c->n_kv_heads * hd) / tp + c->dim; /* q, k, v; o */
    if (p->layers && p->layers[l].moe)
      e += (double)c->moe.top_k * (2.0 * c->moe.ffn_dim + c->dim);
    else
      e += 2.0 * c->ffn_dim / tp + c->dim; /* gate, up; down */
  }
  if (s->has_head)
    e += (double)(c->vocab_padded > 0 ? c->vocab_padded : c->vocab) / tp;
  return e;
}

/* 1: stage's embedding is tied to a head on the same pipeline rank (one model: both add into one
 * gradient, so the split backward's W adds the embedding's rows after the head's product) */
static int tied_here(const struct plan *p, int stage)
{
  const struct plan_stage *s = &p->stages[stage];
  if (!p->model.tie_embeddings || !s->has_embed || p->mesh.tp > 1)
    return 0;
  for (int k = 0; k < p->n_stages; k++)
    if (p->stages[k].has_head && p->stages[k].pp_rank == s->pp_rank)
      return 1;
  return 0;
}

/* At tp > 1, where no products are fused (layout_params_adjacent): each linear's output width
 * per token on rank r's layouts (q, k, v, o, gate, up, down, each split its own way), and its
 * input's: o's and down's each, and of q, k, v (of gate, up) one per layout their splits read
 * the norm's output in (tp_split_input: whole or by features), which those products share; and
 * the head's (its columns here, the final norm's output whole). */
static double products_per_token_tp(const struct plan *p, const struct layout_rank *r, int st)
{
  const struct plan_stage *s = &p->stages[st];
  double e = 0;
  for (int l = s->first_layer; s->first_layer >= 0 && l < s->first_layer + s->n_layers; l++) {
    struct model_layer_dims d;
    layout_layer_dims(r, l, &d);
    const uint8_t *split = r->layers[l].split;
    static const int groups[4][2] = { { PLAN_MOD_Q, PLAN_MOD_V }, { PLAN_MOD_O, PLAN_MOD_O },
                                      { PLAN_MOD_GATE, PLAN_MOD_UP }, { PLAN_MOD_DOWN, PLAN_MOD_DOWN } };
    for (int g = 0; g < 4; g++) {
      int seen_r = 0, seen_f = 0;
      for (int k = groups[g][0]; k <= groups[g][1]; k++) {
        e += d.w_out[k];
        const int whole = tp_split_input((enum plan_split)split[k]) == TP_R;
        if (groups[g][0] == groups[g][1] || (whole ? !seen_r : !seen_f))
          e += d.w_in[k];
        seen_r |= whole;
        seen_f |= !whole;
      }
    }
  }
  if (s->has_head) {
    const double Vp = p->model.vocab_padded > 0 ? p->model.vocab_padded : p->model.vocab;
    e += (r->io.split[PLAN_MOD_HEAD] == PLAN_SPLIT_VOCAB ? Vp / r->tp_size : Vp) + p->model.dim;
  }
  return e;
}

double layout_split_held_elems(const struct plan *p, int stage, const struct layout_rank *r)
{
  const double rows = (double)p->batch.micro * p->batch.seq;
  if (p->mesh.tp > 1)
    return rows * products_per_token_tp(p, r, stage);
  /* the embedding's input gradient is the runtime's reals (fp32 on a bf16 plan: two bf16's each) */
  const double embed = tied_here(p, stage) ? p->model.dim * (p->precision.compute == PLAN_BF16 ? 2.0 : 1.0) : 0;
  return rows * (dout_per_token(p, stage) + embed);
}

int layout_split_products(const struct plan *p, int stage)
{
  const struct plan_stage *s = &p->stages[stage];
  return 7 * (s->first_layer >= 0 ? s->n_layers : 0) + s->has_head + tied_here(p, stage);
}
