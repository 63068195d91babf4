/* The bf16 mode's passes (precision.compute = "bf16", model.h): the linears' products on bf16
 * operands — the weights' bf16 copies and the inputs rounded once — accumulating in fp32, and the
 * attention's on the bf16 entries of the kernel table where the backend has them (ops_list.h).
 *
 * Two forms. On one tensor-parallel rank (passes_bf16_direct) a block runs here: the producers of
 * the linears' inputs (the norms, SwiGLU, the attention's output rounded) write them in bf16 and
 * no fp32 copy is kept. On a tensor-parallel layout, and in a sparse layer (model.moe: its router
 * and experts, model_moe.c) on any, the block runs model_passes.c's pieces, their conversions and
 * collectives in fp32 as they are, and each product rounds its fp32 input into the workspace's
 * in_b right before it (passes_lin_*), in backward again from the same fp32 values: each sees
 * the bf16 rounding of exactly what the fp32 path feeds it, which the rounding producers above
 * write too, so both forms compute the same products. A failed product is the step's error, as a
 * failed collective is. */
#include <stdio.h>

#include "ops.h"
#include "runtime/model/model_passes_int.h"

static void bf16_failed(struct model *m, const char *e)
{
  fault_set(FAULT_OF(&m->tp), FAULT_LEVEL_MODEL, "bf16 product: %.241s", e);
}

void passes_lin_fwd_b(struct model *m, real *out, const bf16 *in, const bf16 *w, int N, int IC, int OC)
{
  char e[200];
  if (m->k->linear_forward_bf16(m->kctx, out, in, w, N, IC, OC, e, sizeof e))
    bf16_failed(m, e);
}

/* out += in · wᵀ (a residual add folded into the product). */
static void lin_fwd_acc_b(struct model *m, real *out, const bf16 *in, const bf16 *w, int N, int IC, int OC)
{
  char e[200];
  if (m->k->linear_forward_acc_bf16(m->kctx, out, in, w, N, IC, OC, e, sizeof e))
    bf16_failed(m, e);
}

void passes_lin_bwd_b(struct model *m, struct model_acts *a, real *dinp, real *dweight, const real *dout,
                      const bf16 *in, const bf16 *w, int N, int IC, int OC)
{
  char e[200];
  m->k->round_bf16(m->kctx, a->dout_b, dout, (size_t)N * OC);
  if (passes_split_keep(m, a, dweight, a->dout_b, 1, in, w, N, IC, OC)) /* B: the input gradient alone */
    dweight = NULL;
  if (m->k->linear_backward_bf16(m->kctx, dinp, dweight, a->dout_b, in, w, N, IC, OC, e, sizeof e))
    bf16_failed(m, e);
}

void passes_lin_fwd(struct model *m, struct model_acts *a, real *out, const real *in, const real *w,
                    const bf16 *wb, int N, int IC, int OC)
{
  if (!m->bf16) {
    m->k->linear_forward(m->kctx, out, in, w, N, IC, OC);
    return;
  }
  m->k->round_bf16(m->kctx, a->in_b, in, (size_t)N * IC);
  passes_lin_fwd_b(m, out, a->in_b, wb, N, IC, OC);
}

void passes_lin_fwd_acc(struct model *m, struct model_acts *a, real *out, const real *in, const real *w,
                        const bf16 *wb, int N, int IC, int OC)
{
  if (!m->bf16) {
    m->k->linear_forward_acc(m->kctx, out, in, w, N, IC, OC);
    return;
  }
  m->k->round_bf16(m->kctx, a->in_b, in, (size_t)N * IC);
  lin_fwd_acc_b(m, out, a->in_b, wb, N, IC, OC);
}

void passes_lin_bwd(struct model *m, struct model_acts *a, real *dinp, real *dweight, const real *dout,
                    const real *in, const real *w, const bf16 *wb, int N, int IC, int OC)
{
  if (!m->bf16) {
    if (passes_split_keep(m, a, dweight, dout, 0, in, w, N, IC, OC)) /* B: the input gradient alone */
      dweight = NULL;
    m->k->linear_backward(m->kctx, dinp, dweight, dout, in, w, N, IC, OC);
    return;
  }
  if (a->split && m->tp.size == 1) /* a sparse layer's (trainer_plan_supported refuses it); at tp > 1
                                    * B holds the rounded input (passes_split_keep) */
    fault_set(FAULT_OF(&m->tp), FAULT_LEVEL_MODEL, "split backward: a bf16 product on a rounded fp32 input "
              "(a sparse layer) is not split");
  /* the forward's rounding again, from the same fp32 input (dinp may be dout: passes_lin_bwd_b
   * rounds dout before the product writes dinp) */
  m->k->round_bf16(m->kctx, a->in_b, in, (size_t)N * IC);
  if (a->split) /* what the held copy of in_b is of (passes_split_keep) */
    a->split->in_src = in;
  passes_lin_bwd_b(m, a, dinp, dweight, dout, a->in_b, wb, N, IC, OC);
  if (a->split)
    a->split->in_src = NULL;
}

/* layer_forward_pieces for bf16 models (one TP rank): the same pieces and masks, with the linears'
 * inputs written in bf16 by their producers. */
void passes_layer_forward_bf16(struct model *m, struct model_acts *a, int layer,
                               const struct model_dropout *dropout, int pieces)
{
  const struct plan_model *c = &m->config;
  struct model_layer_dims d;
  model_layer_dims(m, layer, &d);
  const int B = a->B, T = a->T, N = B * T, C = c->dim, HS = c->head_dim;
  const size_t n_home = (size_t)N * C;
  const struct model_layer_weights *w = &m->layers[layer];
  const struct model_layer_weights_bf16 *wb = &m->layers_bf16[layer];
  struct model_layer_acts *la = &a->layers[layer];
  const real *x = passes_residual(a, layer);
  real *out = passes_residual(a, layer + 1);
  const real eps = (real)c->norm_eps;
  const int drop = a->dropout_on;
  real *branch = a->work_c2;

  if (pieces & F_ATTN_NORM)
    m->k->rmsnorm_forward_bf16(m->kctx, la->ln1_b, la->ln1_rstd, x, passes_gain(m, a, w->attn_norm, wb->attn_norm),
                               N, C, eps);
  const int qkv_fused = model_qkv_fused(m, layer);
  if ((pieces & F_QKV) && qkv_fused) {
    passes_lin_fwd_b(m, la->q, la->ln1_b, wb->wq, N, C, d.A + 2 * d.NKVl * HS);
    m->k->rope_forward_qkv(m->kctx, la->q, a->rope_cos, a->rope_sin, B, T, d.NHl, d.NKVl, HS);
  } else if (pieces & F_QKV) {
    passes_lin_fwd_b(m, la->q, la->ln1_b, wb->wq, N, d.w_in[PLAN_MOD_Q], d.w_out[PLAN_MOD_Q]);
    passes_lin_fwd_b(m, la->k, la->ln1_b, wb->wk, N, d.w_in[PLAN_MOD_K], d.w_out[PLAN_MOD_K]);
    passes_lin_fwd_b(m, la->v, la->ln1_b, wb->wv, N, d.w_in[PLAN_MOD_V], d.w_out[PLAN_MOD_V]);
    m->k->rope_forward(m->kctx, la->q, la->q, a->rope_cos, a->rope_sin, B, T, d.NHl, HS);
    m->k->rope_forward(m->kctx, la->k, la->k, a->rope_cos, a->rope_sin, B, T, d.NKVl, HS);
  }
  if (pieces & F_CORE) {
    struct attention_dropout ad;
    const struct attention_dropout *pd = passes_attn_drop(m, a, &ad, layer, d.NHl, T);
    /* the attention's products on bf16 operands where the backend has them (its sums, softmax
     * and output in fp32, kept for its backward); o_proj's input is rounded once from it */
    if (qkv_fused)
      (m->k->attention_forward_qkv_bf16 ? m->k->attention_forward_qkv_bf16 : m->k->attention_forward_qkv)(
        m->kctx, la->atty, la->lse, a->attn_scratch, la->q, pd, B, T, d.NHl, d.NKVl, HS);
    else
      (m->k->attention_forward_bf16 ? m->k->attention_forward_bf16 : m->k->attention_forward)(
        m->kctx, la->atty, la->lse, a->attn_scratch, la->q, la->k, la->v, pd, B, T, d.NHl, d.NKVl, HS);
    m->k->round_bf16(m->kctx, la->o_in_b, la->atty, (size_t)N * d.A);
  }
  if ((pieces & F_ATTN_OUT) && !drop) { /* mid = x + o(atty), the add in the product */
    m->k->copy(m->kctx, la->mid, x, n_home * sizeof(real));
    lin_fwd_acc_b(m, la->mid, la->o_in_b, wb->wo, N, d.w_in[PLAN_MOD_O], d.w_out[PLAN_MOD_O]);
  } else if (pieces & F_ATTN_OUT) {
    passes_lin_fwd_b(m, branch, la->o_in_b, wb->wo, N, d.w_in[PLAN_MOD_O], d.w_out[PLAN_MOD_O]);
    if (drop) {
      passes_draw_masks(m, la->attn_mask, (size_t)T * C, 0, dropout, B, layer, MODEL_DROP_ATTN_OUT);
      m->k->dropout_forward(m->kctx, branch, branch, la->attn_mask, n_home);
    }
    m->k->vec_add(m->kctx, la->mid, x, branch, n_home);
  }
  if (pieces & F_MLP_NORM)
    m->k->rmsnorm_forward_bf16(m->kctx, la->ln2_b, la->ln2_rstd, la->mid,
                               passes_gain(m, a, w->mlp_norm, wb->mlp_norm), N, C, eps);
  const int fused = model_gate_up_fused(m, layer);
  if ((pieces & F_MLP_IN) && fused) {
    passes_lin_fwd_b(m, la->gate, la->ln2_b, wb->wgate, N, d.w_in[PLAN_MOD_GATE], 2 * d.w_out[PLAN_MOD_GATE]);
  } else if (pieces & F_MLP_IN) {
    passes_lin_fwd_b(m, la->gate, la->ln2_b, wb->wgate, N, d.w_in[PLAN_MOD_GATE], d.w_out[PLAN_MOD_GATE]);
    passes_lin_fwd_b(m, la->up, la->ln2_b, wb->wup, N, d.w_in[PLAN_MOD_UP], d.w_out[PLAN_MOD_UP]);
  }
  if ((pieces & F_MLP_ACT) && fused)
    m->k->swiglu_forward_rows_bf16(m->kctx, la->down_in_b, la->gate, N, d.Fl);
  else if (pieces & F_MLP_ACT)
    m->k->swiglu_forward_bf16(m->kctx, la->down_in_b, la->gate, la->up, (size_t)N * d.Fl);
  if ((pieces & F_MLP_MASK) && drop)
    passes_draw_masks(m, la->mlp_mask, (size_t)T * C, 0, dropout, B, layer, MODEL_DROP_MLP_OUT);
  if ((pieces & F_MLP_OUT) && !drop) {
    m->k->copy(m->kctx, out, la->mid, n_home * sizeof(real));
    lin_fwd_acc_b(m, out, la->down_in_b, wb->wdown, N, d.w_in[PLAN_MOD_DOWN], d.w_out[PLAN_MOD_DOWN]);
  } else if (pieces & F_MLP_OUT) {
    passes_lin_fwd_b(m, branch, la->down_in_b, wb->wdown, N, d.w_in[PLAN_MOD_DOWN], d.w_out[PLAN_MOD_DOWN]);
    if (drop)
      m->k->dropout_forward(m->kctx, branch, branch, la->mlp_mask, n_home);
    m->k->vec_add(m->kctx, out, la->mid, branch, n_home);
  }
}

/* model_layer_backward for bf16 models (one TP rank), after the recompute. */
void passes_layer_backward_bf16(struct model *m, struct model_acts *a, int layer)
{
  const struct plan_model *c = &m->config;
  const struct tp_layer_layout *y = &m->tp.layers[layer];
  struct model_layer_dims d;
  model_layer_dims(m, layer, &d);
  const int B = a->B, T = a->T, N = B * T, C = c->dim, HS = c->head_dim;
  const size_t n_home = (size_t)N * C;
  const struct model_layer_weights *w = &m->layers[layer];
  const struct model_layer_weights_bf16 *wb = &m->layers_bf16[layer];
  struct model_layer_weights *g = &m->layer_grads[layer];
  const struct model_layer_acts *la = &a->layers[layer];
  const real *x = passes_residual(a, layer);
  real *dres = a->dresidual;
  const int drop = a->dropout_on;
  real *dins[PLAN_N_MODULES];

  /* MLP branch */
  real *dh = dres;
  if (drop) {
    dh = a->work_c1;
    m->k->dropout_backward(m->kctx, dh, dres, la->mlp_mask, n_home);
  }
  passes_lin_bwd_b(m, a, a->dhidden, g->wdown, dh, la->down_in_b, wb->wdown, N, d.w_in[PLAN_MOD_DOWN],
            d.w_out[PLAN_MOD_DOWN]);
  dins[PLAN_MOD_GATE] = a->dq;
  dins[PLAN_MOD_UP] = a->dk;
  if (model_gate_up_fused(m, layer)) { /* one product over [gate; up]: both input gradients summed */
    m->k->swiglu_backward_rows(m->kctx, a->dgate, a->dhidden, la->gate, N, d.Fl);
    passes_lin_bwd_b(m, a, a->dq, g->wgate, a->dgate, la->ln2_b, wb->wgate, N, d.w_in[PLAN_MOD_GATE],
              2 * d.w_out[PLAN_MOD_GATE]);
    passes_norm_input_grads(m, a, y, dins, PLAN_MOD_GATE, PLAN_MOD_GATE, a->work_c1, a->work_c2);
  } else {
    m->k->swiglu_backward(m->kctx, a->dgate, a->dup, a->dhidden, la->gate, la->up, (size_t)N * d.Fl);
    passes_lin_bwd_b(m, a, a->dq, g->wgate, a->dgate, la->ln2_b, wb->wgate, N, d.w_in[PLAN_MOD_GATE],
              d.w_out[PLAN_MOD_GATE]);
    passes_lin_bwd_b(m, a, a->dk, g->wup, a->dup, la->ln2_b, wb->wup, N, d.w_in[PLAN_MOD_UP],
              d.w_out[PLAN_MOD_UP]);
    passes_norm_input_grads(m, a, y, dins, PLAN_MOD_GATE, PLAN_MOD_UP, a->work_c1, a->work_c2);
  }
  m->k->rmsnorm_backward(m->kctx, a->work_c1, g->mlp_norm, a->work_c1, la->mid,
                         passes_gain(m, a, w->mlp_norm, wb->mlp_norm), la->ln2_rstd, N, C);
  m->k->vec_add(m->kctx, dres, dres, a->work_c1, n_home);

  /* attention branch */
  dh = dres;
  if (drop) {
    dh = a->work_c1;
    m->k->dropout_backward(m->kctx, dh, dres, la->attn_mask, n_home);
  }
  passes_lin_bwd_b(m, a, a->work_c3, g->wo, dh, la->o_in_b, wb->wo, N, d.w_in[PLAN_MOD_O], d.w_out[PLAN_MOD_O]);
  struct attention_dropout ad;
  const struct attention_dropout *pd = passes_attn_drop(m, a, &ad, layer, d.NHl, T);
  if (model_qkv_fused(m, layer)) { /* [dq | dk | dv] rows into dq, one product: both gradients */
    (m->k->attention_backward_qkv_bf16 ? m->k->attention_backward_qkv_bf16 : m->k->attention_backward_qkv)(
      m->kctx, a->dq, a->attn_scratch, a->work_c3, la->q, la->atty, la->lse, pd, B, T, d.NHl, d.NKVl, HS);
    m->k->rope_backward_qkv(m->kctx, a->dq, a->rope_cos, a->rope_sin, B, T, d.NHl, d.NKVl, HS);
    dins[PLAN_MOD_Q] = a->dk;
    passes_lin_bwd_b(m, a, a->dk, g->wq, a->dq, la->ln1_b, wb->wq, N, C, d.A + 2 * d.NKVl * HS);
    passes_norm_input_grads(m, a, y, dins, PLAN_MOD_Q, PLAN_MOD_Q, a->work_c1, a->work_c2);
  } else {
    (m->k->attention_backward_bf16 ? m->k->attention_backward_bf16 : m->k->attention_backward)(
      m->kctx, a->dq, a->dk, a->dv, a->attn_scratch, a->work_c3, la->q, la->k, la->v, la->atty,
      la->lse, pd, B, T, d.NHl, d.NKVl, HS);
    m->k->rope_backward(m->kctx, a->dq, a->dq, a->rope_cos, a->rope_sin, B, T, d.NHl, HS);
    m->k->rope_backward(m->kctx, a->dk, a->dk, a->rope_cos, a->rope_sin, B, T, d.NKVl, HS);
    real *datt_in[3] = { a->dq, a->dk, a->dv }, *wg[3] = { g->wq, g->wk, g->wv };
    const bf16 *wt[3] = { wb->wq, wb->wk, wb->wv };
    for (int j = 0; j < 3; j++) {
      dins[PLAN_MOD_Q + j] = datt_in[j];
      /* the output gradient is rounded (passes_lin_bwd_b) before the input gradient overwrites it */
      passes_lin_bwd_b(m, a, datt_in[j], wg[j], datt_in[j], la->ln1_b, wt[j], N, d.w_in[PLAN_MOD_Q + j],
                d.w_out[PLAN_MOD_Q + j]);
    }
    passes_norm_input_grads(m, a, y, dins, PLAN_MOD_Q, PLAN_MOD_V, a->work_c1, a->work_c2);
  }
  m->k->rmsnorm_backward(m->kctx, a->work_c1, g->attn_norm, a->work_c1, x,
                         passes_gain(m, a, w->attn_norm, wb->attn_norm), la->ln1_rstd, N, C);
  m->k->vec_add(m->kctx, dres, dres, a->work_c1, n_home);
}
