/* What the model's passes share between model_passes.c (the pieces, tensor parallelism, the fp32
 * products) and model_passes_bf16.c (precision.compute = "bf16": the products on bf16 operands,
 * and a block's forward and backward on one tensor-parallel rank): the pieces of a block's
 * forward, the dropout draws, the norms' input gradients. Internal to those two files. */
#ifndef TYCHO_RUNTIME_MODEL_PASSES_INT_H
#define TYCHO_RUNTIME_MODEL_PASSES_INT_H
#include "runtime/model/model.h"

/* The pieces of a block's forward, so a recompute can rerun some of them. */
/* The pieces of a block's forward, so a recompute can rerun some of them. */
enum {
  F_ATTN_NORM = 1 << 0, /* ln1 */
  F_QKV = 1 << 1,       /* q, k, v brought to the attention, RoPE */
  F_CORE = 1 << 2,      /* probability mask, attention, o's input */
  F_ATTN_OUT = 1 << 3,  /* o, its branch, dropout, mid */
  F_MLP_NORM = 1 << 4,  /* ln2 */
  F_MLP_IN = 1 << 5,    /* gate and up brought to SwiGLU */
  F_MLP_ACT = 1 << 6,   /* SwiGLU, down's input */
  F_MLP_MASK = 1 << 7,  /* the MLP branch's dropout mask */
  F_MLP_OUT = 1 << 8,   /* down, its branch, dropout, the block's output */
  F_ALL = (1 << 9) - 1
};
static inline real *passes_residual(const struct model_acts *a, int index)
{
  return a->residual[index];
}

/* One mask per sample: the rank holds elements [first, first + per_sample) of the sample's
 * logical tensor. */
void passes_draw_masks(const struct model *m, real *mask, size_t per_sample, uint64_t first,
                       const struct model_dropout *d, int B, int layer, enum model_dropout_site site);
/* The attention's dropout of layer `layer` for the kernels, in ad; NULL when the forward has none. */
const struct attention_dropout *passes_attn_drop(const struct model *m, const struct model_acts *a,
                                                 struct attention_dropout *ad, int layer, int NHl, int T);
/* The input gradients of linears first..last (dins[k]) summed, brought to the home layout: out. */
void passes_norm_input_grads(struct model *m, struct model_acts *a, const struct tp_layer_layout *y,
                             real *dins[PLAN_N_MODULES], int first, int last, real *out, real *tmp);

/* Rebuilds what layer `layer`'s recompute policy discarded (before its backward, and before a
 * split backward's W). */
void passes_layer_recompute(struct model *m, struct model_acts *a, int layer);

/* ---- model_passes_w.c: the split backward (struct model_split) ---- */

/* Under a->split's B: dout (N · OC reals, or bf16 for a bf16 product) copied into the held
 * memory, at tp > 1 with `in` (N · IC) after it, and the weight-gradient product dweight +=
 * doutᵀ · in noted for W; 1 (the caller runs the input gradient alone), else 0 (no B in
 * progress, or the held memory is full, a fault: the whole product). */
int passes_split_keep(struct model *m, struct model_acts *a, real *dweight, const void *dout, int bf16_product,
                      const void *in, const void *w, int N, int IC, int OC);
/* Under a->split's W: the products B noted for `layer` (L: the head; −1: the embedding's),
 * after the layer's recompute; 1, else 0 (no W in progress: the caller runs its backward). */
int passes_split_w(struct model *m, struct model_acts *a, int layer);
/* The embedding's backward under a->split: 1 where the caller skips it — B of a tied embedding
 * whose head is on this model (dresidual kept for W, which adds it after the head's product),
 * or any W (which runs what B kept) — else 0 (no split, or B of an untied one: run it now). */
int passes_split_embed(struct model *m, struct model_acts *a);

/* ---- model_passes_bf16.c ---- */

/* 1: the bf16 mode on one tensor-parallel rank, where the producers of the linears' inputs write
 * them in bf16 (ln1_b, o_in_b, ln2_b, down_in_b, head_in_b) and the passes below run. A bf16
 * model at tp > 1 runs the fp32 pieces with each product's input rounded (passes_lin_*), and so
 * does a sparse layer (model.moe) at any tp: its router and experts read fp32 inputs. */
static inline int passes_bf16_direct(const struct model *m)
{
  return m->bf16 && m->tp.size == 1;
}
static inline int passes_bf16_direct_layer(const struct model *m, int layer)
{
  return passes_bf16_direct(m) && !(m->moe && m->moe[layer]);
}
/* The gain a norm reads: on a bf16 model, its bf16 copy wb widened into the workspace's gain_w
 * (exact), so a step computes on the copies alone, the master's bits below bf16 unseen; else the
 * fp32 weight w (an fp32 model). */
static inline const real *passes_gain(struct model *m, struct model_acts *a, const real *w, const bf16 *wb)
{
  if (!m->bf16 || !wb || !a->gain_w || !m->k->widen_bf16)
    return w;
  m->k->widen_bf16(m->kctx, a->gain_w, wb, (size_t)m->config.dim);
  return a->gain_w;
}
void passes_layer_forward_bf16(struct model *m, struct model_acts *a, int layer,
                               const struct model_dropout *dropout, int pieces);
/* After the layer's recompute. */
void passes_layer_backward_bf16(struct model *m, struct model_acts *a, int layer);
/* out = in · wᵀ on a bf16 input and weight copy; dinp (may be NULL), dweight += from dout
 * (rounded once into dout_b). */
void passes_lin_fwd_b(struct model *m, real *out, const bf16 *in, const bf16 *w, int N, int IC, int OC);
void passes_lin_bwd_b(struct model *m, struct model_acts *a, real *dinp, real *dweight, const real *dout,
                      const bf16 *in, const bf16 *w, int N, int IC, int OC);
/* The products of the fp32 pieces: fp32 on an fp32 model; on a bf16 one, in rounded into the
 * workspace's in_b and the product on it and wb (w's bf16 copy). _acc: out += in · wᵀ. */
void passes_lin_fwd(struct model *m, struct model_acts *a, real *out, const real *in, const real *w,
                    const bf16 *wb, int N, int IC, int OC);
void passes_lin_fwd_acc(struct model *m, struct model_acts *a, real *out, const real *in, const real *w,
                        const bf16 *wb, int N, int IC, int OC);
void passes_lin_bwd(struct model *m, struct model_acts *a, real *dinp, real *dweight, const real *dout,
                    const real *in, const real *w, const bf16 *wb, int N, int IC, int OC);

#endif
