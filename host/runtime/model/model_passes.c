/* Forward and backward of the model, piece by piece: embedding, one block, head. Each piece reads
 * and writes the activations of struct model_acts only, so a pipeline stage runs the pieces it owns
 * and a recompute can rerun one. Dropout masks are drawn per sample from its logical coordinates
 * (docs/design.md, "Randomness"), never from the batch row or the rank, so micro-batching, data and
 * tensor parallelism and recompute all see the serial run's masks.
 *
 * Tensor parallelism follows layout/tp_layout.h: each linear computes on the layout its split
 * needs, and `convert` turns one layout into another with the collective the algebra names
 * (a group of one makes every conversion a copy). The order of conversions here is the order
 * tp_comm_list lists them in; mpi_tp_equiv holds the two together.
 *
 * The products go through passes_lin_* (model_passes_bf16.c): fp32, or on a bf16 model over a
 * tensor-parallel layout each on its input rounded to bf16 and its weight's bf16 copy, the
 * conversions staying fp32; a bf16 model on one TP rank runs that file's block instead. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "ops.h"
#include "runtime/model/model.h"
#include "runtime/model/model_passes_int.h"
#include "runtime/model/model_cp.h"
#include "runtime/model/hostview.h"
#include "runtime/parallel/tp.h"

/* The conversion from → to is no work here (a group of one, or the same layout): the producer
 * can write straight into the consumer's buffer. */
static int no_conversion(const struct model *m, enum tp_layout from, enum tp_layout to)
{
  return m->tp.size == 1 || tp_convert_op(from, to) == TP_OP_NONE;
}

/* One mask per sample: the rank holds elements [first, first + per_sample) of the sample's
 * logical tensor. */
void passes_draw_masks(const struct model *m, real *mask, size_t per_sample, uint64_t first,
                       const struct model_dropout *d, int B, int layer, enum model_dropout_site site)
{
  if (model_cp_draw_masks(m, mask, per_sample, first, d, B, layer, site)) /* mesh.cp: two chunks a sample */
    return;
  for (int b = 0; b < B; b++)
    m->k->dropout_mask(m->kctx, mask + (size_t)b * per_sample, per_sample, d->p, d->seed, d->step,
                       (uint32_t)d->samples[b], ((uint32_t)layer << 8) | (uint32_t)site, first);
}

/* The attention's dropout of layer `layer` for the kernels (no mask is kept: they draw it),
 * the numbers passes_draw_masks would put in a (NH, T, T) mask per sample: this rank's heads start at
 * head rank · NHl when the attention is sharded. NULL when the forward has no dropout. */
const struct attention_dropout *passes_attn_drop(const struct model *m, const struct model_acts *a,
                                                 struct attention_dropout *ad, int layer, int NHl, int T)
{
  if (!a->dropout_on)
    return NULL;
  if (m->cp.size > 1) /* the ring draws at the whole sequence's positions */
    T = a->seq_T;
  const int sharded = m->tp.layers[layer].attn_sharded;
  ad->p = (float)a->drop.p;
  ad->seed = a->drop.seed;
  ad->c1 = a->drop.step;
  ad->c3 = ((uint32_t)layer << 8) | (uint32_t)MODEL_DROP_ATTN_PROBS;
  ad->first = (uint64_t)(sharded ? m->tp.rank * NHl : 0) * (uint64_t)T * (uint64_t)T;
  ad->samples = a->drop.c2;
  return ad;
}

/* Where this rank's part of a (T, C) branch starts in the sample: row r·Th under SP. */
static uint64_t home_first(const struct model *m, int T)
{
  const int C = m->config.dim;
  return m->tp.io.home == TP_SEQ ? (uint64_t)m->tp.rank * (uint64_t)(T / m->tp.size) * C : 0;
}

/* A norm's output (home layout) brought to what the linears first..last need: in[k] for each. */
static void norm_inputs(struct model *m, struct model_acts *a, const struct tp_layer_layout *y,
                        real *n, int first, int last, const real *in[PLAN_N_MODULES])
{
  const int B = a->B, T = a->T, C = m->config.dim;
  int need_r = 0, need_f = 0;
  for (int k = first; k <= last; k++) {
    need_r |= tp_split_input(y->split[k]) == TP_R;
    need_f |= tp_split_input(y->split[k]) == TP_FEAT;
  }
  real *r = y->home == TP_R ? n : a->in_r;
  if (a->split) /* a split backward's products of this call share their inputs' held copies */
    a->split->group++;
  if (need_r)
    tp_convert(&m->tp, a->pack, r, n, y->home, TP_R, B, T, C, a->work_c4);
  if (need_f)
    tp_convert(&m->tp, a->pack, a->in_f, n, y->home, TP_FEAT, B, T, C, a->work_c4);
  for (int k = first; k <= last; k++) in[k] = tp_split_input(y->split[k]) == TP_R ? r : a->in_f;
}

/* The input gradients of linears first..last (dins[k], in the layout each arrives in) summed
 * per forward conversion, brought to the home layout and added: out (B, Th, C). The dins
 * buffers are overwritten. tmp: a (B, T, C) buffer. */
void passes_norm_input_grads(struct model *m, struct model_acts *a, const struct tp_layer_layout *y,
                             real *dins[PLAN_N_MODULES], int first, int last, real *out, real *tmp)
{
  const int B = a->B, T = a->T, C = m->config.dim, tp = m->tp.size;
  int wrote = 0;
  static const enum tp_layout needs[2] = { TP_R, TP_FEAT };
  for (int g = 0; g < 2; g++) {
    int partial = 0, any = 0;
    for (int k = first; k <= last; k++)
      if (tp_split_input(y->split[k]) == needs[g]) {
        any = 1;
        partial |= tp_split_input_grad(y->split[k]) == TP_P;
      }
    if (!any)
      continue;
    enum tp_layout arrival = needs[g] == TP_FEAT ? TP_FEAT : partial ? TP_P : TP_R;
    real *sum = NULL;
    for (int k = first; k <= last; k++) {
      if (tp_split_input(y->split[k]) != needs[g])
        continue;
      real *d = dins[k];
      size_t n = tp_local_elems(tp_split_input_grad(y->split[k]), B, T, C, tp);
      if (arrival == TP_P && tp_split_input_grad(y->split[k]) == TP_R)
        tp_convert(&m->tp, a->pack, d, d, TP_R, TP_P, B, T, C, NULL);
      if (!sum)
        sum = d;
      else
        m->k->vec_add(m->kctx, sum, sum, d, n);
    }
    real *dst = wrote ? tmp : out;
    tp_convert(&m->tp, a->pack, dst, sum, arrival, y->home, B, T, C, a->work_c4);
    if (wrote)
      m->k->vec_add(m->kctx, out, out, tmp, tp_local_elems(y->home, B, T, C, tp));
    wrote = 1;
  }
}

/* ---- embedding ---- */

void model_forward_begin(const struct model *m, struct model_acts *a,
                         const struct model_dropout *dropout, int B, int T)
{
  a->B = B;
  a->T = T;
  model_cp_begin((struct model *)m, a, B, T); /* mesh.cp: T becomes this rank's rows */
  a->dropout_on = dropout && dropout->p > 0.0f && m->config.dropout > 0.0;
  if (a->dropout_on) {
    a->drop.p = dropout->p;
    a->drop.seed = dropout->seed;
    a->drop.step = dropout->step;
    memcpy(a->drop.samples, dropout->samples, (size_t)B * sizeof *dropout->samples);
    for (int b = 0; b < B; b++) a->drop.c2[b] = (uint32_t)dropout->samples[b];
  }
}

void model_embed_forward(const struct model *mc, struct model_acts *a, const int *tokens,
                         const struct model_dropout *dropout, int B, int T)
{
  struct model *m = (struct model *)mc; /* the TP state records failures */
  model_forward_begin(m, a, dropout, B, T);
  tokens = model_cp_rows(m, a, tokens); /* mesh.cp: this rank's rows of each sample */
  const int C = m->config.dim, N = B * a->T;
  m->k->from_host(m->kctx, a->tokens, tokens, (size_t)N * sizeof(int));
  tokens = a->tokens; /* the kernels read the backend's copy */
  const struct model_param *e = &m->params[0]; /* the embedding */
  real *rows = m->tp.size == 1 ? passes_residual(a, 0) : a->work_c1;
  if (m->bf16 && m->wte_bf16 && m->k->encoder_forward_bf16) /* the rows from the bf16 copy */
    m->k->encoder_forward_bf16(m->kctx, rows, tokens, m->wte_bf16, e->tp_dim == 0 ? (int)e->start[0] : 0,
                               (int)e->local[0], N, C);
  else if (e->tp_dim == 0)
    m->k->encoder_forward_shard(m->kctx, rows, tokens, m->wte, (int)e->start[0], (int)e->local[0], N, C);
  else
    m->k->encoder_forward(m->kctx, rows, tokens, m->wte, N, C);
  if (m->tp.size == 1)
    return;
  enum tp_layout out = tp_embed_output(m->tp.io.split[PLAN_MOD_EMBED]);
  tp_convert(&m->tp, a->pack, passes_residual(a, 0), a->work_c1, out, m->tp.io.home, B, a->T, C, a->work_c4);
}

void model_embed_backward(struct model *m, struct model_acts *a)
{
  /* a split backward: the embedding's gradient is B's, unless the tied head's adds into the
   * same gradient on this rank; then it waits for W with the head's product, kept in the whole
   * backward's order (head, then embedding) */
  if (passes_split_embed(m, a))
    return;
  const int B = a->B, T = a->T, C = m->config.dim, N = B * T;
  if (m->tp.size == 1) {
    m->k->encoder_backward(m->kctx, m->dwte, a->dresidual, a->tokens, N, C);
    return;
  }
  const struct model_param *e = &m->params[0];
  real *d = tp_convert(&m->tp, a->pack, a->work_c1, a->dresidual, m->tp.io.home, TP_R, B, T, C, a->work_c4);
  if (e->tp_dim == 0)
    m->k->encoder_backward_shard(m->kctx, m->dwte, d, a->tokens, (int)e->start[0], (int)e->local[0],
                                 N, C);
  else
    m->k->encoder_backward(m->kctx, m->dwte, d, a->tokens, N, C);
}

/* ---- one block ---- */


/* The pieces that rebuild what recompute policy rc discarded (model.c lays them out). */
static int recompute_pieces(uint8_t rc)
{
  int f = 0;
  if (rc & PLAN_RC_ATTN)
    f |= F_ATTN_NORM | F_QKV | F_CORE | F_ATTN_OUT;
  if (rc & PLAN_RC_ATTN_NORM)
    f |= F_ATTN_NORM;
  if (rc & PLAN_RC_ATTN_CORE)
    f |= F_CORE;
  if (rc & PLAN_RC_MLP)
    f |= F_MLP_NORM | F_MLP_IN | F_MLP_ACT | F_MLP_MASK;
  if (rc & PLAN_RC_MLP_NORM)
    f |= F_MLP_NORM;
  if (rc & PLAN_RC_MLP_ACT)
    f |= F_MLP_ACT;
  return f;
}

static void layer_forward_pieces(struct model *m, struct model_acts *a, int layer,
                                 const struct model_dropout *dropout, int pieces)
{
  const struct plan_model *c = &m->config;
  const struct tp_layer_layout *y = &m->tp.layers[layer];
  struct model_layer_dims d;
  model_layer_dims(m, layer, &d);
  const int B = a->B, T = a->T, N = B * T, Th = model_home_T(m, T), Nh = B * Th;
  const int C = c->dim, F = c->ffn_dim, HS = c->head_dim, KVD = c->n_kv_heads * HS;
  const size_t n_home = (size_t)Nh * C;
  const struct model_layer_weights *w = &m->layers[layer];
  struct model_layer_acts *la = &a->layers[layer];
  const real *x = passes_residual(a, layer);
  real *out = passes_residual(a, layer + 1);
  const real eps = (real)c->norm_eps;
  const int drop = a->dropout_on;
  const enum tp_layout A = y->attn_sharded ? TP_FEAT : TP_R, M = y->mlp_sharded ? TP_FEAT : TP_R;
  const uint8_t *s = y->split;
  const real *in[PLAN_N_MODULES];
  real *branch = a->work_c2;
  static const struct model_layer_weights_bf16 fp32_only; /* an fp32 model's: no copies */
  const struct model_layer_weights_bf16 *wb = m->bf16 ? &m->layers_bf16[layer] : &fp32_only;
  if (passes_bf16_direct_layer(m, layer)) {
    passes_layer_forward_bf16(m, a, layer, dropout, pieces);
    return;
  }

  /* attention */
  if (pieces & F_ATTN_NORM)
    m->k->rmsnorm_forward(m->kctx, la->ln1, la->ln1_rstd, x, passes_gain(m, a, w->attn_norm, wb->attn_norm),
                          Nh, C, eps);
  const int qkv_fused = model_qkv_fused(m, layer);
  if ((pieces & F_QKV) && qkv_fused) { /* one product over [q; k; v], RoPE on its rows */
    norm_inputs(m, a, y, la->ln1, PLAN_MOD_Q, PLAN_MOD_V, in);
    passes_lin_fwd(m, a, la->q, in[PLAN_MOD_Q], w->wq, wb->wq, N, C, d.A + 2 * d.NKVl * HS);
    m->k->rope_forward_qkv(m->kctx, la->q, a->rope_cos, a->rope_sin, B, T, d.NHl, d.NKVl, HS);
  } else if (pieces & F_QKV) {
    norm_inputs(m, a, y, la->ln1, PLAN_MOD_Q, PLAN_MOD_V, in);
    real *raw[3] = { a->work_c1, a->work_c2, a->work_c3 }, *att[3] = { la->q, la->k, la->v };
    const real *wqkv[3] = { w->wq, w->wk, w->wv };
    const bf16 *bqkv[3] = { wb->wq, wb->wk, wb->wv };
    int direct[3];
    for (int j = 0; j < 3; j++) {
      enum tp_layout have = tp_split_output(s[PLAN_MOD_Q + j]), want = j == 0 ? A : y->kv;
      direct[j] = want != TP_KV && no_conversion(m, have, want);
      passes_lin_fwd(m, a, direct[j] ? att[j] : raw[j], in[PLAN_MOD_Q + j], wqkv[j], bqkv[j], N,
                     d.w_in[PLAN_MOD_Q + j], d.w_out[PLAN_MOD_Q + j]);
    }
    for (int j = 0; j < 3; j++) {
      enum tp_layout have = tp_split_output(s[PLAN_MOD_Q + j]), want = j == 0 ? A : y->kv;
      int X = j == 0 ? C : KVD;
      if (direct[j])
        continue;
      if (want == TP_KV) {
        tp_convert(&m->tp, a->pack, raw[j], raw[j], have, TP_R, B, T, X, NULL);
        tp_expand_kv(&m->tp, &m->config, att[j], raw[j], N, d.NHl);
      } else {
        tp_convert(&m->tp, a->pack, att[j], raw[j], have, want, B, T, X, a->work_c4);
      }
    }
    m->k->rope_forward(m->kctx, la->q, la->q, a->rope_cos, a->rope_sin, B, T, d.NHl, HS);
    m->k->rope_forward(m->kctx, la->k, la->k, a->rope_cos, a->rope_sin, B, T, d.NKVl, HS);
  }
  if (pieces & F_CORE) {
    struct attention_dropout ad;
    const struct attention_dropout *pd = passes_attn_drop(m, a, &ad, layer, d.NHl, T);
    const int att_b = m->bf16; /* a bf16 model's attention products on bf16 operands */
    if (m->cp.size > 1) /* mesh.cp: against every rank's keys, through the ring */
      model_cp_attention_forward(m, la, pd, d.NHl, d.NKVl);
    else if (qkv_fused)
      (att_b && m->k->attention_forward_qkv_bf16 ? m->k->attention_forward_qkv_bf16 : m->k->attention_forward_qkv)(
        m->kctx, la->atty, la->lse, a->attn_scratch, la->q, pd, B, T, d.NHl, d.NKVl, HS);
    else
      (att_b && m->k->attention_forward_bf16 ? m->k->attention_forward_bf16 : m->k->attention_forward)(
        m->kctx, la->atty, la->lse, a->attn_scratch, la->q, la->k, la->v, pd, B, T, d.NHl, d.NKVl, HS);
    tp_convert(&m->tp, a->pack, la->o_in, la->atty, A, tp_split_input(s[PLAN_MOD_O]), B, T, C, a->work_c4);
  }
  if ((pieces & F_ATTN_OUT) && !drop && no_conversion(m, tp_split_output(s[PLAN_MOD_O]), y->home)) {
    /* mid = x + o(atty): the residual add in the product (beta = 1) */
    m->k->copy(m->kctx, la->mid, x, n_home * sizeof(real));
    passes_lin_fwd_acc(m, a, la->mid, la->o_in, w->wo, wb->wo, N, d.w_in[PLAN_MOD_O], d.w_out[PLAN_MOD_O]);
  } else if (pieces & F_ATTN_OUT) {
    const int o_direct = no_conversion(m, tp_split_output(s[PLAN_MOD_O]), y->home);
    passes_lin_fwd(m, a, o_direct ? branch : a->work_c1, la->o_in, w->wo, wb->wo, N,
                   d.w_in[PLAN_MOD_O], d.w_out[PLAN_MOD_O]);
    if (!o_direct)
      tp_convert(&m->tp, a->pack, branch, a->work_c1, tp_split_output(s[PLAN_MOD_O]), y->home, B, T, C,
                 a->work_c3);
    if (drop) {
      passes_draw_masks(m, la->attn_mask, (size_t)Th * C, home_first(m, T), dropout, B, layer,
                 MODEL_DROP_ATTN_OUT);
      m->k->dropout_forward(m->kctx, branch, branch, la->attn_mask, n_home);
    }
    m->k->vec_add(m->kctx, la->mid, x, branch, n_home);
  }

  /* MLP */
  if (pieces & F_MLP_NORM)
    m->k->rmsnorm_forward(m->kctx, la->ln2, la->ln2_rstd, la->mid, passes_gain(m, a, w->mlp_norm, wb->mlp_norm),
                          Nh, C, eps);
  if (m->moe && m->moe[layer]) { /* the sparse MLP (one TP rank): out = mid + drop(moe(ln2)) */
    if (pieces & F_MLP_OUT) {
      model_moe_forward(m, a, layer, la->ln2, branch);
      if (drop) {
        passes_draw_masks(m, la->mlp_mask, (size_t)Th * C, home_first(m, T), dropout, B, layer,
                   MODEL_DROP_MLP_OUT);
        m->k->dropout_forward(m->kctx, branch, branch, la->mlp_mask, n_home);
      }
      m->k->vec_add(m->kctx, out, la->mid, branch, n_home);
    }
    return;
  }
  const int fused = model_gate_up_fused(m, layer);
  if ((pieces & F_MLP_IN) && fused) { /* one product over [gate; up] */
    norm_inputs(m, a, y, la->ln2, PLAN_MOD_GATE, PLAN_MOD_UP, in);
    passes_lin_fwd(m, a, la->gate, in[PLAN_MOD_GATE], w->wgate, wb->wgate, N, d.w_in[PLAN_MOD_GATE],
                   2 * d.w_out[PLAN_MOD_GATE]);
  } else if (pieces & F_MLP_IN) {
    norm_inputs(m, a, y, la->ln2, PLAN_MOD_GATE, PLAN_MOD_UP, in);
    const int g_direct = no_conversion(m, tp_split_output(s[PLAN_MOD_GATE]), M);
    const int u_direct = no_conversion(m, tp_split_output(s[PLAN_MOD_UP]), M);
    passes_lin_fwd(m, a, g_direct ? la->gate : a->work_f1, in[PLAN_MOD_GATE], w->wgate, wb->wgate, N,
                   d.w_in[PLAN_MOD_GATE], d.w_out[PLAN_MOD_GATE]);
    passes_lin_fwd(m, a, u_direct ? la->up : a->work_f2, in[PLAN_MOD_UP], w->wup, wb->wup, N,
                   d.w_in[PLAN_MOD_UP], d.w_out[PLAN_MOD_UP]);
    if (!g_direct)
      tp_convert(&m->tp, a->pack, la->gate, a->work_f1, tp_split_output(s[PLAN_MOD_GATE]), M, B, T, F, NULL);
    if (!u_direct)
      tp_convert(&m->tp, a->pack, la->up, a->work_f2, tp_split_output(s[PLAN_MOD_UP]), M, B, T, F, NULL);
  }
  if (pieces & F_MLP_ACT) {
    if (fused)
      m->k->swiglu_forward_rows(m->kctx, la->hidden, la->gate, N, d.Fl);
    else
      m->k->swiglu_forward(m->kctx, la->hidden, la->gate, la->up, (size_t)N * d.Fl);
    tp_convert(&m->tp, a->pack, la->down_in, la->hidden, M, tp_split_input(s[PLAN_MOD_DOWN]), B, T, F, NULL);
  }
  if ((pieces & F_MLP_MASK) && drop)
    passes_draw_masks(m, la->mlp_mask, (size_t)Th * C, home_first(m, T), dropout, B, layer,
               MODEL_DROP_MLP_OUT);
  if ((pieces & F_MLP_OUT) && !drop && no_conversion(m, tp_split_output(s[PLAN_MOD_DOWN]), y->home)) {
    m->k->copy(m->kctx, out, la->mid, n_home * sizeof(real)); /* out = mid + down(hidden) */
    passes_lin_fwd_acc(m, a, out, la->down_in, w->wdown, wb->wdown, N, d.w_in[PLAN_MOD_DOWN],
                       d.w_out[PLAN_MOD_DOWN]);
  } else if (pieces & F_MLP_OUT) {
    const int d_direct = no_conversion(m, tp_split_output(s[PLAN_MOD_DOWN]), y->home);
    passes_lin_fwd(m, a, d_direct ? branch : a->work_c1, la->down_in, w->wdown, wb->wdown, N,
                   d.w_in[PLAN_MOD_DOWN], d.w_out[PLAN_MOD_DOWN]);
    if (!d_direct)
      tp_convert(&m->tp, a->pack, branch, a->work_c1, tp_split_output(s[PLAN_MOD_DOWN]), y->home, B, T, C,
                 a->work_c3);
    if (drop)
      m->k->dropout_forward(m->kctx, branch, branch, la->mlp_mask, n_home);
    m->k->vec_add(m->kctx, out, la->mid, branch, n_home);
  }
}

void model_layer_forward(const struct model *mc, struct model_acts *a, int layer,
                         const struct model_dropout *dropout)
{
  layer_forward_pieces((struct model *)mc, a, layer, dropout, F_ALL);
}

/* Before layer `layer`'s backward: what its recompute policy discarded, computed again from what
 * was kept, with the forward's dropout masks (drawn again from the same coordinates). */
void passes_layer_recompute(struct model *m, struct model_acts *a, int layer)
{
  const uint8_t rc = m->recompute ? m->recompute[layer] : 0;
  if (!rc)
    return;
  struct model_dropout d = { a->drop.p, a->drop.seed, a->drop.step, a->drop.samples };
  layer_forward_pieces(m, a, layer, a->dropout_on ? &d : NULL, recompute_pieces(rc));
}

void model_layer_backward(struct model *m, struct model_acts *a, int layer)
{
  const struct plan_model *c = &m->config;
  const struct tp_layer_layout *y = &m->tp.layers[layer];
  struct model_layer_dims d;
  model_layer_dims(m, layer, &d);
  const int B = a->B, T = a->T, N = B * T, Th = model_home_T(m, T), Nh = B * Th;
  const int C = c->dim, F = c->ffn_dim, HS = c->head_dim, KVD = c->n_kv_heads * HS;
  const size_t n_home = (size_t)Nh * C;
  const struct model_layer_weights *w = &m->layers[layer];
  struct model_layer_weights *g = &m->layer_grads[layer];
  const struct model_layer_acts *la = &a->layers[layer];
  const real *x = passes_residual(a, layer);
  real *dres = a->dresidual;
  const int drop = a->dropout_on, sp = y->home == TP_SEQ;
  const enum tp_layout A = y->attn_sharded ? TP_FEAT : TP_R, M = y->mlp_sharded ? TP_FEAT : TP_R;
  const uint8_t *s = y->split;
  const real *in[PLAN_N_MODULES];
  real *dins[PLAN_N_MODULES];
  if (passes_split_w(m, a, layer))
    return;
  if (a->split)
    a->split->layer = layer;
  passes_layer_recompute(m, a, layer);
  if (passes_bf16_direct_layer(m, layer)) {
    passes_layer_backward_bf16(m, a, layer);
    return;
  }
  static const struct model_layer_weights_bf16 fp32_only;
  const struct model_layer_weights_bf16 *wb = m->bf16 ? &m->layers_bf16[layer] : &fp32_only;
  if (sp)
    m->k->zero(m->kctx, a->gains, 2 * (size_t)C * sizeof(real));

  /* MLP branch: out = mid + drop(down(hidden)). Gradients that need no conversion are read
   * where they are. */
  real *dh = dres;
  if (drop) {
    dh = a->work_c1;
    m->k->dropout_backward(m->kctx, dh, dres, la->mlp_mask, n_home);
  }
  enum tp_layout want, arrival;
  real *dout;
  if (m->moe && m->moe[layer]) { /* the sparse MLP (one TP rank) */
    model_moe_backward(m, a, layer, la->ln2, dh, a->work_c2, a->work_c3);
    m->k->rmsnorm_backward(m->kctx, a->work_c1, g->mlp_norm, a->work_c2, la->mid,
                           passes_gain(m, a, w->mlp_norm, wb->mlp_norm), la->ln2_rstd, Nh, C);
    m->k->vec_add(m->kctx, dres, dres, a->work_c1, n_home);
    goto attention;
  }
  want = tp_dual(tp_split_output(s[PLAN_MOD_DOWN]));
  dout = no_conversion(m, y->home, want) ? dh
       : tp_convert(&m->tp, a->pack, a->work_c2, dh, y->home, want, B, T, C, a->work_c3);
  passes_lin_bwd(m, a, a->dhidden, g->wdown, dout, la->down_in, w->wdown, wb->wdown, N,
                 d.w_in[PLAN_MOD_DOWN], d.w_out[PLAN_MOD_DOWN]);
  arrival = tp_split_input_grad(s[PLAN_MOD_DOWN]);
  real *dhid = no_conversion(m, arrival, M) ? a->dhidden
              : tp_convert(&m->tp, a->pack, a->work_f1, a->dhidden, arrival, M, B, T, F, NULL);
  dins[PLAN_MOD_GATE] = a->dq;
  dins[PLAN_MOD_UP] = a->dk;
  if (model_gate_up_fused(m, layer)) { /* one product over [gate; up] (one TP rank: no conversion) */
    m->k->swiglu_backward_rows(m->kctx, a->dgate, dhid, la->gate, N, d.Fl);
    norm_inputs(m, a, y, la->ln2, PLAN_MOD_GATE, PLAN_MOD_UP, in);
    passes_lin_bwd(m, a, a->dq, g->wgate, a->dgate, in[PLAN_MOD_GATE], w->wgate, wb->wgate, N,
                   d.w_in[PLAN_MOD_GATE], 2 * d.w_out[PLAN_MOD_GATE]);
    passes_norm_input_grads(m, a, y, dins, PLAN_MOD_GATE, PLAN_MOD_GATE, a->work_c1, a->work_c2);
  } else {
    m->k->swiglu_backward(m->kctx, a->dgate, a->dup, dhid, la->gate, la->up, (size_t)N * d.Fl);
    want = tp_dual(tp_split_output(s[PLAN_MOD_GATE]));
    real *dgate = no_conversion(m, M, want) ? a->dgate
                 : tp_convert(&m->tp, a->pack, a->work_f1, a->dgate, M, want, B, T, F, NULL);
    want = tp_dual(tp_split_output(s[PLAN_MOD_UP]));
    real *dup = no_conversion(m, M, want) ? a->dup
               : tp_convert(&m->tp, a->pack, a->work_f2, a->dup, M, want, B, T, F, NULL);
    norm_inputs(m, a, y, la->ln2, PLAN_MOD_GATE, PLAN_MOD_UP, in);
    passes_lin_bwd(m, a, a->dq, g->wgate, dgate, in[PLAN_MOD_GATE], w->wgate, wb->wgate, N,
                   d.w_in[PLAN_MOD_GATE], d.w_out[PLAN_MOD_GATE]);
    passes_lin_bwd(m, a, a->dk, g->wup, dup, in[PLAN_MOD_UP], w->wup, wb->wup, N,
                   d.w_in[PLAN_MOD_UP], d.w_out[PLAN_MOD_UP]);
    passes_norm_input_grads(m, a, y, dins, PLAN_MOD_GATE, PLAN_MOD_UP, a->work_c1, a->work_c2);
  }
  m->k->rmsnorm_backward(m->kctx, a->work_c1, sp ? a->gains + C : g->mlp_norm, a->work_c1, la->mid,
                         passes_gain(m, a, w->mlp_norm, wb->mlp_norm), la->ln2_rstd, Nh, C);
  m->k->vec_add(m->kctx, dres, dres, a->work_c1, n_home);

attention:
  /* Attention branch: mid = x + drop(o(atty)). */
  dh = dres;
  if (drop) {
    dh = a->work_c1;
    m->k->dropout_backward(m->kctx, dh, dres, la->attn_mask, n_home);
  }
  want = tp_dual(tp_split_output(s[PLAN_MOD_O]));
  dout = no_conversion(m, y->home, want) ? dh
       : tp_convert(&m->tp, a->pack, a->work_c2, dh, y->home, want, B, T, C, a->work_c3);
  arrival = tp_split_input_grad(s[PLAN_MOD_O]);
  const int att_direct = no_conversion(m, arrival, A); /* attention_backward must not read dq */
  passes_lin_bwd(m, a, att_direct ? a->work_c3 : a->dq, g->wo, dout, la->o_in, w->wo, wb->wo, N,
                 d.w_in[PLAN_MOD_O], d.w_out[PLAN_MOD_O]);
  real *datt = att_direct ? a->work_c3
              : tp_convert(&m->tp, a->pack, a->work_c3, a->dq, arrival, A, B, T, C, NULL);
  struct attention_dropout ad;
  const struct attention_dropout *pd = passes_attn_drop(m, a, &ad, layer, d.NHl, T);
  if (model_qkv_fused(m, layer)) { /* [dq | dk | dv] rows into dq, one product: both gradients */
    (m->bf16 && m->k->attention_backward_qkv_bf16 ? m->k->attention_backward_qkv_bf16
                                                  : m->k->attention_backward_qkv)(
      m->kctx, a->dq, a->attn_scratch, datt, la->q, la->atty, la->lse, pd, B, T, d.NHl, d.NKVl, HS);
    m->k->rope_backward_qkv(m->kctx, a->dq, a->rope_cos, a->rope_sin, B, T, d.NHl, d.NKVl, HS);
    norm_inputs(m, a, y, la->ln1, PLAN_MOD_Q, PLAN_MOD_V, in);
    dins[PLAN_MOD_Q] = a->dk;
    passes_lin_bwd(m, a, a->dk, g->wq, a->dq, in[PLAN_MOD_Q], w->wq, wb->wq, N, C, d.A + 2 * d.NKVl * HS);
    passes_norm_input_grads(m, a, y, dins, PLAN_MOD_Q, PLAN_MOD_Q, a->work_c1, a->work_c2);
  } else {
    if (m->cp.size > 1) /* mesh.cp: the ring (q, k and v are never fused there) */
      model_cp_attention_backward(m, a, la, datt, pd, d.NHl, d.NKVl);
    else
      (m->bf16 && m->k->attention_backward_bf16 ? m->k->attention_backward_bf16 : m->k->attention_backward)(
        m->kctx, a->dq, a->dk, a->dv, a->attn_scratch, datt, la->q, la->k, la->v, la->atty, la->lse, pd,
        B, T, d.NHl, d.NKVl, HS);
    m->k->rope_backward(m->kctx, a->dq, a->dq, a->rope_cos, a->rope_sin, B, T, d.NHl, HS);
    m->k->rope_backward(m->kctx, a->dk, a->dk, a->rope_cos, a->rope_sin, B, T, d.NKVl, HS);
    real *datt_in[3] = { a->dq, a->dk, a->dv }, *dqkv[3] = { a->work_c1, a->work_c2, a->work_c3 };
    for (int j = 0; j < 3; j++) {
      enum tp_layout have = j == 0 ? A : y->kv, to = tp_dual(tp_split_output(s[PLAN_MOD_Q + j]));
      int X = j == 0 ? C : KVD;
      if (have == TP_KV) {
        tp_expand_kv_backward(&m->tp, &m->config, dqkv[j], datt_in[j], N, d.NHl);
        tp_convert(&m->tp, a->pack, dqkv[j], dqkv[j], TP_P, to, B, T, X, NULL);
      } else {
        tp_convert(&m->tp, a->pack, dqkv[j], datt_in[j], have, to, B, T, X, NULL);
      }
    }
    norm_inputs(m, a, y, la->ln1, PLAN_MOD_Q, PLAN_MOD_V, in);
    real *wg[3] = { g->wq, g->wk, g->wv };
    const real *wt[3] = { w->wq, w->wk, w->wv };
    const bf16 *bt[3] = { wb->wq, wb->wk, wb->wv };
    for (int j = 0; j < 3; j++) {
      dins[PLAN_MOD_Q + j] = datt_in[j];
      passes_lin_bwd(m, a, datt_in[j], wg[j], dqkv[j], in[PLAN_MOD_Q + j], wt[j], bt[j], N,
                     d.w_in[PLAN_MOD_Q + j], d.w_out[PLAN_MOD_Q + j]);
    }
    passes_norm_input_grads(m, a, y, dins, PLAN_MOD_Q, PLAN_MOD_V, a->work_c1, a->work_c2);
  }
  m->k->rmsnorm_backward(m->kctx, a->work_c1, sp ? a->gains : g->attn_norm, a->work_c1, x,
                         passes_gain(m, a, w->attn_norm, wb->attn_norm), la->ln1_rstd, Nh, C);
  m->k->vec_add(m->kctx, dres, dres, a->work_c1, n_home);

  if (sp) { /* each rank saw its positions only: the gains' gradients are partial sums */
    tp_all_reduce(&m->tp, a->gains, 2 * (size_t)C, COMM_SUM);
    m->k->vec_add(m->kctx, g->attn_norm, g->attn_norm, a->gains, (size_t)C);
    m->k->vec_add(m->kctx, g->mlp_norm, g->mlp_norm, a->gains + C, (size_t)C);
  }
}

/* ---- head ---- */

static int head_sharded(const struct model *m)
{
  return m->tp.size > 1 && m->tp.io.split[PLAN_MOD_HEAD] == PLAN_SPLIT_VOCAB;
}

/* The head's columns here: Vl, the first v0 of them in the padded vocabulary, Vvalid real. */
static void head_columns(const struct model *m, int *v0, int *Vl, int *Vvalid)
{
  const struct plan_model *c = &m->config;
  *Vl = head_sharded(m) ? c->vocab_padded / m->tp.size : c->vocab_padded;
  *v0 = head_sharded(m) ? m->tp.rank * *Vl : 0;
  int valid = c->vocab - *v0;
  *Vvalid = valid < 0 ? 0 : valid > *Vl ? *Vl : valid;
}

double model_head_forward(const struct model *mc, struct model_acts *a, const int *targets)
{
  struct model *m = (struct model *)mc;
  const struct plan_model *c = &m->config;
  const int B = a->B, T = a->T, N = B * T, Nh = B * model_home_T(m, T), C = c->dim;
  int v0, Vl, Vvalid;
  head_columns(m, &v0, &Vl, &Vvalid);
  if (passes_bf16_direct(m)) {
    m->k->rmsnorm_forward_bf16(m->kctx, a->head_in_b, a->lnf_rstd, passes_residual(a, c->n_layers),
                               passes_gain(m, a, m->final_norm, m->final_norm_bf16), Nh, C, (real)c->norm_eps);
    passes_lin_fwd_b(m, a->logits, a->head_in_b, m->head_bf16, N, C, Vl);
  } else {
    m->k->rmsnorm_forward(m->kctx, a->lnf, a->lnf_rstd, passes_residual(a, c->n_layers),
                          passes_gain(m, a, m->final_norm, m->final_norm_bf16), Nh, C, (real)c->norm_eps);
    tp_convert(&m->tp, a->pack, a->head_in, a->lnf, m->tp.io.home, TP_R, B, T, C, NULL);
    passes_lin_fwd(m, a, a->logits, a->head_in, m->head, m->head_bf16, N, C, Vl);
  }
  if (!targets)
    return 0.0;
  targets = model_cp_rows(m, a, targets); /* mesh.cp: this rank's rows */
  m->k->from_host(m->kctx, a->targets, targets, (size_t)N * sizeof(int));
  targets = a->targets; /* the backend's copy, which backward reads too */
  if (head_sharded(m)) {
    m->k->crossentropy_shard_max(m->kctx, a->ce_stats, a->logits, N, Vvalid, Vl);
    tp_all_reduce(&m->tp, a->ce_stats, (size_t)N, COMM_MAX);
    m->k->crossentropy_shard_sums(m->kctx, a->ce_stats, a->logits, targets, v0, N, Vvalid, Vl);
    tp_all_reduce(&m->tp, a->ce_stats + N, 2 * (size_t)N, COMM_SUM);
    m->k->crossentropy_shard_finish(m->kctx, a->losses, a->logits, a->logits, a->ce_stats, targets,
                                    N, Vvalid, Vl);
  } else {
    m->k->crossentropy_forward(m->kctx, a->losses, a->logits, a->logits, targets, N, c->vocab, Vl);
  }
  /* in token order: the same bits for any thread count */
  return hostview_sum(m->k, m->kctx, a->losses, (size_t)N);
}

void model_head_backward(struct model *m, struct model_acts *a, real loss_scale)
{
  const int *targets = a->targets;
  const struct plan_model *c = &m->config;
  if (passes_split_w(m, a, c->n_layers))
    return;
  if (a->split)
    a->split->layer = c->n_layers;
  const int B = a->B, T = a->T, N = B * T, Nh = B * model_home_T(m, T), C = c->dim;
  const int sp = m->tp.io.home == TP_SEQ;
  int v0, Vl, Vvalid;
  head_columns(m, &v0, &Vl, &Vvalid);
  if (head_sharded(m))
    m->k->crossentropy_shard_backward(m->kctx, a->logits, a->logits, targets, v0, loss_scale, N,
                                      Vvalid, Vl);
  else
    m->k->crossentropy_backward(m->kctx, a->logits, a->logits, targets, loss_scale, N, c->vocab,
                                Vl);
  if (passes_bf16_direct(m))
    passes_lin_bwd_b(m, a, a->work_c1, m->dhead, a->logits, a->head_in_b, m->head_bf16, N, C, Vl);
  else
    passes_lin_bwd(m, a, a->work_c1, m->dhead, a->logits, a->head_in, m->head, m->head_bf16, N, C, Vl);
  enum tp_layout arrival = m->tp.size > 1 ? tp_split_input_grad(m->tp.io.split[PLAN_MOD_HEAD]) : TP_R;
  real *dn = tp_convert(&m->tp, a->pack, a->work_c2, a->work_c1, arrival, m->tp.io.home, B, T, C, NULL);
  if (sp)
    m->k->zero(m->kctx, a->gains, (size_t)C * sizeof(real));
  m->k->rmsnorm_backward(m->kctx, a->dresidual, sp ? a->gains : m->dfinal_norm, dn,
                         passes_residual(a, c->n_layers), passes_gain(m, a, m->final_norm, m->final_norm_bf16),
                         a->lnf_rstd, Nh, C);
  if (sp) {
    tp_all_reduce(&m->tp, a->gains, (size_t)C, COMM_SUM);
    m->k->vec_add(m->kctx, m->dfinal_norm, m->dfinal_norm, a->gains, (size_t)C);
  }
}

static void head_argmax(struct model *m, struct model_acts *a, const int *rows, int n, int *out)
{
  int v0, Vl, Vvalid;
  head_columns(m, &v0, &Vl, &Vvalid);
  /* (value, index) of each row's first maximum here; then the first maximum over the group. On
   * the host: ce_stats and pack serve as the two arrays (host views of them). */
  const int tp = head_sharded(m) ? m->tp.size : 1;
  const size_t n_mine = 2 * (size_t)n * sizeof(real), n_all = (size_t)tp * n_mine;
  real *mine = hostview_open(m->k, m->kctx, a->ce_stats, n_mine, 0);
  real *all = tp > 1 ? hostview_open(m->k, m->kctx, a->pack, n_all, 0) : NULL;
  if (!mine || (tp > 1 && !all)) {
    hostview_close(m->k, m->kctx, a->ce_stats, mine, n_mine, 0);
    tp_failed(&m->tp, "host memory for the argmax");
    for (int i = 0; i < n; i++) out[i] = 0;
    return;
  }
  for (int i = 0; i < n; i++) {
    const real *row = a->logits + (size_t)rows[i] * Vl;
    const int best = Vvalid > 0 ? hostview_argmax(m->k, m->kctx, row, Vvalid) : 0;
    real value = -INFINITY;
    if (Vvalid > 0)
      m->k->to_host(m->kctx, &value, row + best, sizeof value);
    mine[2 * i] = value;
    mine[2 * i + 1] = (real)(v0 + best);
  }
  if (tp == 1) {
    for (int i = 0; i < n; i++) out[i] = (int)mine[2 * i + 1];
  } else {
    if (comm_all_gather(m->tp.group, mine, all, 2 * (size_t)n, COMM_REAL, NULL))
      tp_failed(&m->tp, "all-gather of the argmax");
    for (int i = 0; i < n; i++) {
      int best = 0; /* ranks hold increasing vocabulary columns: ties keep the lowest token */
      for (int r = 1; r < tp; r++)
        if (all[(size_t)r * 2 * n + 2 * i] > all[(size_t)best * 2 * n + 2 * i])
          best = r;
      out[i] = (int)all[(size_t)best * 2 * n + 2 * i + 1];
    }
  }
  hostview_close(m->k, m->kctx, a->pack, all, n_all, 0);
  hostview_close(m->k, m->kctx, a->ce_stats, mine, n_mine, 0);
}

/* ---- all of it ---- */

double model_forward(const struct model *m, struct model_acts *a, const int *tokens,
                     const int *targets, const struct model_dropout *dropout, int B, int T)
{
  model_embed_forward(m, a, tokens, dropout, B, T);
  for (int l = 0; l < m->config.n_layers; l++) model_layer_forward(m, a, l, dropout);
  return model_head_forward(m, a, targets);
}

void model_backward(struct model *m, struct model_acts *a, real loss_scale)
{
  a->loss_scale = loss_scale;
  model_head_backward(m, a, loss_scale);
  for (int l = m->config.n_layers - 1; l >= 0; l--) model_layer_backward(m, a, l);
  model_embed_backward(m, a);
}

void model_head_argmax(struct model *m, struct model_acts *a, const int *rows, int n, int *out)
{
  if (m->cp.size > 1) /* mesh.cp: each row's logits are on the cp rank holding its position */
    model_cp_head_argmax(m, a, rows, n, out, head_argmax);
  else
    head_argmax(m, a, rows, n, out);
}
