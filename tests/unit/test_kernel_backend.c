/* The model and the optimizer compute only through the kernel table (kernels/ops.h): a backend
 * that wraps kernel_ops_cpu and counts every call, selected with kernels_use before a trainer
 * opens, trains a tiny plan (2 layers, dropout 0.1, 2 micro-batches, clipping on) for 2 steps to
 * the very bits of the same plan on the CPU table (losses, norms, parameters), and sees a call
 * of every entry a one-rank run uses. A kernel the runtime called by name would still give the
 * same bits but leave its entry at 0 here. The vocabulary-shard entries (encoder_*_shard,
 * crossentropy_shard_*) and copy_rows run only under tensor parallelism and are left out of the
 * count, and so are mem_alloc and mem_free: the table is host-visible, so its memory is the host
 * allocator's. The trainer keeps the table it opened with after the selection goes back to the CPU's. */
#include <stddef.h>
#include <stdlib.h>

#include "check.h"
#include "ops.h"
#include "bf16.h"
#include "runtime/alloc.h"
#include "runtime/train.h"
#include "runtime_fixture.h"

static char err[512];

enum entry {
  ENTRY_MEM_ALLOC,
  ENTRY_MEM_FREE,
  ENTRY_COPY,
  ENTRY_COPY_ROWS,
  ENTRY_ZERO,
  ENTRY_TO_HOST,
  ENTRY_FROM_HOST,
  ENTRY_ENCODER_FORWARD,
  ENTRY_ENCODER_BACKWARD,
  ENTRY_ENCODER_FORWARD_SHARD,
  ENTRY_ENCODER_BACKWARD_SHARD,
  ENTRY_RMSNORM_FORWARD,
  ENTRY_RMSNORM_BACKWARD,
  ENTRY_LINEAR_FORWARD,
  ENTRY_LINEAR_BACKWARD,
  ENTRY_LINEAR_FORWARD_ACC,
  ENTRY_ROUND_BF16,
  ENTRY_LINEAR_FORWARD_BF16,
  ENTRY_LINEAR_FORWARD_ACC_BF16,
  ENTRY_LINEAR_BACKWARD_BF16,
  ENTRY_RMSNORM_FORWARD_BF16,
  ENTRY_SWIGLU_FORWARD_BF16,
  ENTRY_SWIGLU_FORWARD_ROWS_BF16,
  ENTRY_ADAMW_UPDATE_BF16,
  ENTRY_ROPE_TABLE,
  ENTRY_ROPE_FORWARD,
  ENTRY_ROPE_BACKWARD,
  ENTRY_ROPE_FORWARD_QKV,
  ENTRY_ROPE_BACKWARD_QKV,
  ENTRY_ATTENTION_SCRATCH_N_ELEMS,
  ENTRY_ATTENTION_FORWARD,
  ENTRY_ATTENTION_BACKWARD,
  ENTRY_ATTENTION_FORWARD_QKV,
  ENTRY_ATTENTION_BACKWARD_QKV,
  ENTRY_SWIGLU_FORWARD,
  ENTRY_SWIGLU_BACKWARD,
  ENTRY_SWIGLU_FORWARD_ROWS,
  ENTRY_SWIGLU_BACKWARD_ROWS,
  ENTRY_DROPOUT_MASK,
  ENTRY_DROPOUT_FORWARD,
  ENTRY_DROPOUT_BACKWARD,
  ENTRY_RESIDUAL_FORWARD,
  ENTRY_CROSSENTROPY_FORWARD,
  ENTRY_CROSSENTROPY_BACKWARD,
  ENTRY_CROSSENTROPY_SHARD_MAX,
  ENTRY_CROSSENTROPY_SHARD_SUMS,
  ENTRY_CROSSENTROPY_SHARD_FINISH,
  ENTRY_CROSSENTROPY_SHARD_BACKWARD,
  ENTRY_ADAMW_UPDATE,
  ENTRY_SUMSQ,
  ENTRY_SCALE_INPLACE,
  ENTRY_MOE_ROUTER_FORWARD,
  ENTRY_MOE_ROUTE,
  ENTRY_MOE_DISPATCH,
  ENTRY_MOE_DISPATCH_BACKWARD,
  ENTRY_MOE_COMBINE,
  ENTRY_MOE_COMBINE_BACKWARD,
  ENTRY_MOE_AUX_LOSS,
  ENTRY_MOE_ROUTER_BACKWARD,
  N_ENTRIES
};

static const char *const entry_names[N_ENTRIES] = {
  "mem_alloc",
  "mem_free",
  "copy",
  "copy_rows",
  "zero",
  "to_host",
  "from_host",
  "encoder_forward",
  "encoder_backward",
  "encoder_forward_shard",
  "encoder_backward_shard",
  "rmsnorm_forward",
  "rmsnorm_backward",
  "linear_forward",
  "linear_backward",
  "linear_forward_acc",
  "round_bf16",
  "linear_forward_bf16",
  "linear_forward_acc_bf16",
  "linear_backward_bf16",
  "rmsnorm_forward_bf16",
  "swiglu_forward_bf16",
  "swiglu_forward_rows_bf16",
  "adamw_update_bf16",
  "rope_table",
  "rope_forward",
  "rope_backward",
  "rope_forward_qkv",
  "rope_backward_qkv",
  "attention_scratch_n_elems",
  "attention_forward",
  "attention_backward",
  "attention_forward_qkv",
  "attention_backward_qkv",
  "swiglu_forward",
  "swiglu_backward",
  "swiglu_forward_rows",
  "swiglu_backward_rows",
  "dropout_mask",
  "dropout_forward",
  "dropout_backward",
  "residual_forward",
  "crossentropy_forward",
  "crossentropy_backward",
  "crossentropy_shard_max",
  "crossentropy_shard_sums",
  "crossentropy_shard_finish",
  "crossentropy_shard_backward",
  "adamw_update",
  "sumsq",
  "scale_inplace",
  "moe_router_forward",
  "moe_route",
  "moe_dispatch",
  "moe_dispatch_backward",
  "moe_combine",
  "moe_combine_backward",
  "moe_aux_loss",
  "moe_router_backward",
};

/* Every function entry of struct kernel_ops (after name and host_visible) is wrapped here: an
 * entry added to the table without a counter fails to compile. */
_Static_assert(sizeof(struct kernel_ops) ==
                 offsetof(struct kernel_ops, mem_alloc) + N_ENTRIES * sizeof(void (*)(void)),
               "struct kernel_ops has an entry this test does not count");

/* The counting backend's context: the calls per entry and the table and context it wraps. */
struct counter {
  long calls[N_ENTRIES];
  const struct kernel_ops *inner;
  void *inner_ctx;
};

static const struct counter *count(void *ctx, enum entry e)
{
  struct counter *c = ctx;
  c->calls[e]++;
  return c;
}

/* mixture of experts */
static void counted_moe_router_forward(void *ctx, real *probs, int *topi, real *topw, real *lse,
                                       const real *logits, int N, int E, int K)
{
  const struct counter *c = count(ctx, ENTRY_MOE_ROUTER_FORWARD);
  c->inner->moe_router_forward(c->inner_ctx, probs, topi, topw, lse, logits, N, E, K);
}

static void counted_moe_route(void *ctx, int *slot, int *counts, int *routed, const int *topi,
                              int N, int T, int E, int K, int capacity)
{
  const struct counter *c = count(ctx, ENTRY_MOE_ROUTE);
  c->inner->moe_route(c->inner_ctx, slot, counts, routed, topi, N, T, E, K, capacity);
}

static void counted_moe_dispatch(void *ctx, real *xe, const real *x, const int *slot, int N, int K,
                                 int C)
{
  const struct counter *c = count(ctx, ENTRY_MOE_DISPATCH);
  c->inner->moe_dispatch(c->inner_ctx, xe, x, slot, N, K, C);
}

static void counted_moe_dispatch_backward(void *ctx, real *dx, const real *dxe, const int *slot,
                                          int N, int K, int C)
{
  const struct counter *c = count(ctx, ENTRY_MOE_DISPATCH_BACKWARD);
  c->inner->moe_dispatch_backward(c->inner_ctx, dx, dxe, slot, N, K, C);
}

static void counted_moe_combine(void *ctx, real *out, const real *ye, const int *slot,
                                const real *topw, int N, int K, int C)
{
  const struct counter *c = count(ctx, ENTRY_MOE_COMBINE);
  c->inner->moe_combine(c->inner_ctx, out, ye, slot, topw, N, K, C);
}

static void counted_moe_combine_backward(void *ctx, real *dye, real *dtopw, const real *dout,
                                         const real *ye, const int *slot, const real *topw, int N,
                                         int K, int C)
{
  const struct counter *c = count(ctx, ENTRY_MOE_COMBINE_BACKWARD);
  c->inner->moe_combine_backward(c->inner_ctx, dye, dtopw, dout, ye, slot, topw, N, K, C);
}

static void counted_moe_aux_loss(void *ctx, real *aux, const real *probs, const int *topi, int N,
                                 int T, int E, int K)
{
  const struct counter *c = count(ctx, ENTRY_MOE_AUX_LOSS);
  c->inner->moe_aux_loss(c->inner_ctx, aux, probs, topi, N, T, E, K);
}

static void counted_moe_router_backward(void *ctx, real *dlogits, const real *dtopw,
                                        const real *probs, const int *topi, const real *topw,
                                        const real *lse, int N, int T, int E, int K, real aux_scale,
                                        real z_scale)
{
  const struct counter *c = count(ctx, ENTRY_MOE_ROUTER_BACKWARD);
  c->inner->moe_router_backward(c->inner_ctx, dlogits, dtopw, probs, topi, topw, lse, N, T, E, K,
                                aux_scale, z_scale);
}


/* The memory entries pass through to the CPU's. The table is host-visible, so the allocator
 * bills its memory as the host's and takes it from the host allocator: mem_alloc and mem_free
 * are there for completeness and are not expected to be called. */
static void *counted_mem_alloc(void *ctx, size_t n_bytes)
{
  const struct counter *c = count(ctx, ENTRY_MEM_ALLOC);
  return c->inner->mem_alloc(c->inner_ctx, n_bytes);
}

static void counted_mem_free(void *ctx, void *block)
{
  const struct counter *c = count(ctx, ENTRY_MEM_FREE);
  c->inner->mem_free(c->inner_ctx, block);
}

static void counted_copy(void *ctx, void *dst, const void *src, size_t n_bytes)
{
  const struct counter *c = count(ctx, ENTRY_COPY);
  c->inner->copy(c->inner_ctx, dst, src, n_bytes);
}

static void counted_copy_rows(void *ctx, void *dst, size_t dst_pitch, const void *src,
                              size_t src_pitch, size_t row_bytes, size_t n_rows)
{
  const struct counter *c = count(ctx, ENTRY_COPY_ROWS);
  c->inner->copy_rows(c->inner_ctx, dst, dst_pitch, src, src_pitch, row_bytes, n_rows);
}

static void counted_zero(void *ctx, void *dst, size_t n_bytes)
{
  const struct counter *c = count(ctx, ENTRY_ZERO);
  c->inner->zero(c->inner_ctx, dst, n_bytes);
}

static void counted_to_host(void *ctx, void *host, const void *src, size_t n_bytes)
{
  const struct counter *c = count(ctx, ENTRY_TO_HOST);
  c->inner->to_host(c->inner_ctx, host, src, n_bytes);
}

static void counted_from_host(void *ctx, void *dst, const void *host, size_t n_bytes)
{
  const struct counter *c = count(ctx, ENTRY_FROM_HOST);
  c->inner->from_host(c->inner_ctx, dst, host, n_bytes);
}

static void counted_encoder_forward(void *ctx, real *out, const int *tokens, const real *wte,
                                    int BT, int C)
{
  const struct counter *c = count(ctx, ENTRY_ENCODER_FORWARD);
  c->inner->encoder_forward(c->inner_ctx, out, tokens, wte, BT, C);
}

static void counted_encoder_backward(void *ctx, real *dwte, const real *dout, const int *tokens,
                                     int BT, int C)
{
  const struct counter *c = count(ctx, ENTRY_ENCODER_BACKWARD);
  c->inner->encoder_backward(c->inner_ctx, dwte, dout, tokens, BT, C);
}

static void counted_encoder_forward_shard(void *ctx, real *out, const int *tokens, const real *wte,
                                          int v0, int Vl, int BT, int C)
{
  const struct counter *c = count(ctx, ENTRY_ENCODER_FORWARD_SHARD);
  c->inner->encoder_forward_shard(c->inner_ctx, out, tokens, wte, v0, Vl, BT, C);
}

static void counted_encoder_backward_shard(void *ctx, real *dwte, const real *dout,
                                           const int *tokens, int v0, int Vl, int BT, int C)
{
  const struct counter *c = count(ctx, ENTRY_ENCODER_BACKWARD_SHARD);
  c->inner->encoder_backward_shard(c->inner_ctx, dwte, dout, tokens, v0, Vl, BT, C);
}

static void counted_rmsnorm_forward(void *ctx, real *out, real *rstd, const real *inp,
                                    const real *weight, int BT, int C, real eps)
{
  const struct counter *c = count(ctx, ENTRY_RMSNORM_FORWARD);
  c->inner->rmsnorm_forward(c->inner_ctx, out, rstd, inp, weight, BT, C, eps);
}

static void counted_rmsnorm_backward(void *ctx, real *dinp, real *dweight, const real *dout,
                                     const real *inp, const real *weight, const real *rstd, int BT,
                                     int C)
{
  const struct counter *c = count(ctx, ENTRY_RMSNORM_BACKWARD);
  c->inner->rmsnorm_backward(c->inner_ctx, dinp, dweight, dout, inp, weight, rstd, BT, C);
}

static void counted_linear_forward(void *ctx, real *out, const real *inp, const real *weight,
                                   int BT, int IC, int OC)
{
  const struct counter *c = count(ctx, ENTRY_LINEAR_FORWARD);
  c->inner->linear_forward(c->inner_ctx, out, inp, weight, BT, IC, OC);
}

static void counted_linear_backward(void *ctx, real *dinp, real *dweight, const real *dout,
                                    const real *inp, const real *weight, int BT, int IC, int OC)
{
  const struct counter *c = count(ctx, ENTRY_LINEAR_BACKWARD);
  c->inner->linear_backward(c->inner_ctx, dinp, dweight, dout, inp, weight, BT, IC, OC);
}

static void counted_round_bf16(void *ctx, bf16 *dst, const real *src, size_t n_elems)
{
  const struct counter *c = count(ctx, ENTRY_ROUND_BF16);
  c->inner->round_bf16(c->inner_ctx, dst, src, n_elems);
}

static int counted_linear_forward_bf16(void *ctx, real *out, const bf16 *inp, const bf16 *weight,
                                       int BT, int IC, int OC, char *emsg, size_t emsg_size)
{
  const struct counter *c = count(ctx, ENTRY_LINEAR_FORWARD_BF16);
  return c->inner->linear_forward_bf16(c->inner_ctx, out, inp, weight, BT, IC, OC, emsg, emsg_size);
}

static int counted_linear_backward_bf16(void *ctx, real *dinp, real *dweight, const bf16 *dout,
                                        const bf16 *inp, const bf16 *weight, int BT, int IC,
                                        int OC, char *emsg, size_t emsg_size)
{
  const struct counter *c = count(ctx, ENTRY_LINEAR_BACKWARD_BF16);
  return c->inner->linear_backward_bf16(c->inner_ctx, dinp, dweight, dout, inp, weight, BT, IC, OC,
                                        emsg, emsg_size);
}

static void counted_rmsnorm_forward_bf16(void *ctx, bf16 *out, real *rstd, const real *inp,
                                         const real *weight, int BT, int C, real eps)
{
  const struct counter *c = count(ctx, ENTRY_RMSNORM_FORWARD_BF16);
  c->inner->rmsnorm_forward_bf16(c->inner_ctx, out, rstd, inp, weight, BT, C, eps);
}

static void counted_swiglu_forward_bf16(void *ctx, bf16 *out, const real *gate, const real *up,
                                        size_t n_elems)
{
  const struct counter *c = count(ctx, ENTRY_SWIGLU_FORWARD_BF16);
  c->inner->swiglu_forward_bf16(c->inner_ctx, out, gate, up, n_elems);
}

static void counted_swiglu_forward_rows_bf16(void *ctx, bf16 *out, const real *gu, int rows, int F)
{
  const struct counter *c = count(ctx, ENTRY_SWIGLU_FORWARD_ROWS_BF16);
  c->inner->swiglu_forward_rows_bf16(c->inner_ctx, out, gu, rows, F);
}

static void counted_swiglu_forward_rows(void *ctx, real *out, const real *gu, int rows, int F)
{
  const struct counter *c = count(ctx, ENTRY_SWIGLU_FORWARD_ROWS);
  c->inner->swiglu_forward_rows(c->inner_ctx, out, gu, rows, F);
}

static void counted_swiglu_backward_rows(void *ctx, real *dgu, const real *dout, const real *gu,
                                         int rows, int F)
{
  const struct counter *c = count(ctx, ENTRY_SWIGLU_BACKWARD_ROWS);
  c->inner->swiglu_backward_rows(c->inner_ctx, dgu, dout, gu, rows, F);
}

static void counted_adamw_update_bf16(void *ctx, real *param, bf16 *param_bf16, const real *grad,
                                      real *m, real *v, size_t n_elems, double lr, double beta1,
                                      double beta2, double eps, double weight_decay, int t,
                                      real grad_scale)
{
  const struct counter *c = count(ctx, ENTRY_ADAMW_UPDATE_BF16);
  c->inner->adamw_update_bf16(c->inner_ctx, param, param_bf16, grad, m, v, n_elems, lr, beta1,
                              beta2, eps, weight_decay, t, grad_scale);
}

static void counted_rope_forward_qkv(void *ctx, real *qkv, const real *cos_table,
                                     const real *sin_table, int B, int T, int NH, int NKV, int HS)
{
  const struct counter *c = count(ctx, ENTRY_ROPE_FORWARD_QKV);
  c->inner->rope_forward_qkv(c->inner_ctx, qkv, cos_table, sin_table, B, T, NH, NKV, HS);
}

static void counted_rope_backward_qkv(void *ctx, real *dqkv, const real *cos_table,
                                      const real *sin_table, int B, int T, int NH, int NKV, int HS)
{
  const struct counter *c = count(ctx, ENTRY_ROPE_BACKWARD_QKV);
  c->inner->rope_backward_qkv(c->inner_ctx, dqkv, cos_table, sin_table, B, T, NH, NKV, HS);
}

static void counted_attention_forward_qkv(void *ctx, real *out, real *probs, real *scratch,
                                          const real *qkv, const real *dropmask, int B, int T,
                                          int NH, int NKV, int HS)
{
  const struct counter *c = count(ctx, ENTRY_ATTENTION_FORWARD_QKV);
  c->inner->attention_forward_qkv(c->inner_ctx, out, probs, scratch, qkv, dropmask, B, T, NH, NKV, HS);
}

static void counted_attention_backward_qkv(void *ctx, real *dqkv, real *scratch, const real *dout,
                                           const real *qkv, const real *probs, const real *dropmask,
                                           int B, int T, int NH, int NKV, int HS)
{
  const struct counter *c = count(ctx, ENTRY_ATTENTION_BACKWARD_QKV);
  c->inner->attention_backward_qkv(c->inner_ctx, dqkv, scratch, dout, qkv, probs, dropmask, B, T, NH,
                                   NKV, HS);
}

static void counted_linear_forward_acc(void *ctx, real *out, const real *inp, const real *weight,
                                       int BT, int IC, int OC)
{
  const struct counter *c = count(ctx, ENTRY_LINEAR_FORWARD_ACC);
  c->inner->linear_forward_acc(c->inner_ctx, out, inp, weight, BT, IC, OC);
}

static int counted_linear_forward_acc_bf16(void *ctx, real *out, const bf16 *inp, const bf16 *weight,
                                           int BT, int IC, int OC, char *emsg, size_t emsg_size)
{
  const struct counter *c = count(ctx, ENTRY_LINEAR_FORWARD_ACC_BF16);
  return c->inner->linear_forward_acc_bf16(c->inner_ctx, out, inp, weight, BT, IC, OC, emsg, emsg_size);
}

static void counted_rope_table(void *ctx, real *cos_table, real *sin_table, int T, int HS,
                               double theta, int pos0)
{
  const struct counter *c = count(ctx, ENTRY_ROPE_TABLE);
  c->inner->rope_table(c->inner_ctx, cos_table, sin_table, T, HS, theta, pos0);
}

static void counted_rope_forward(void *ctx, real *out, const real *inp, const real *cos_table,
                                 const real *sin_table, int B, int T, int NHx, int HS)
{
  const struct counter *c = count(ctx, ENTRY_ROPE_FORWARD);
  c->inner->rope_forward(c->inner_ctx, out, inp, cos_table, sin_table, B, T, NHx, HS);
}

static void counted_rope_backward(void *ctx, real *dinp, const real *dout, const real *cos_table,
                                  const real *sin_table, int B, int T, int NHx, int HS)
{
  const struct counter *c = count(ctx, ENTRY_ROPE_BACKWARD);
  c->inner->rope_backward(c->inner_ctx, dinp, dout, cos_table, sin_table, B, T, NHx, HS);
}

static size_t counted_attention_scratch_n_elems(void *ctx, int B, int T, int NH, int NKV)
{
  const struct counter *c = count(ctx, ENTRY_ATTENTION_SCRATCH_N_ELEMS);
  return c->inner->attention_scratch_n_elems(c->inner_ctx, B, T, NH, NKV);
}

static void counted_attention_forward(void *ctx, real *out, real *probs, real *scratch,
                                      const real *q, const real *k, const real *v,
                                      const real *dropmask, int B, int T, int NH, int NKV, int HS)
{
  const struct counter *c = count(ctx, ENTRY_ATTENTION_FORWARD);
  c->inner->attention_forward(c->inner_ctx, out, probs, scratch, q, k, v, dropmask, B, T, NH, NKV,
                              HS);
}

static void counted_attention_backward(void *ctx, real *dq, real *dk, real *dv, real *scratch,
                                       const real *dout, const real *q, const real *k,
                                       const real *v, const real *probs, const real *dropmask,
                                       int B, int T, int NH, int NKV, int HS)
{
  const struct counter *c = count(ctx, ENTRY_ATTENTION_BACKWARD);
  c->inner->attention_backward(c->inner_ctx, dq, dk, dv, scratch, dout, q, k, v, probs, dropmask, B,
                               T, NH, NKV, HS);
}

static void counted_swiglu_forward(void *ctx, real *out, const real *gate, const real *up,
                                   size_t n_elems)
{
  const struct counter *c = count(ctx, ENTRY_SWIGLU_FORWARD);
  c->inner->swiglu_forward(c->inner_ctx, out, gate, up, n_elems);
}

static void counted_swiglu_backward(void *ctx, real *dgate, real *dup, const real *dout,
                                    const real *gate, const real *up, size_t n_elems)
{
  const struct counter *c = count(ctx, ENTRY_SWIGLU_BACKWARD);
  c->inner->swiglu_backward(c->inner_ctx, dgate, dup, dout, gate, up, n_elems);
}

static void counted_dropout_mask(void *ctx, real *mask, size_t n_elems, float p, uint64_t seed,
                                 uint32_t c1, uint32_t c2, uint32_t c3, uint64_t first_elem)
{
  const struct counter *c = count(ctx, ENTRY_DROPOUT_MASK);
  c->inner->dropout_mask(c->inner_ctx, mask, n_elems, p, seed, c1, c2, c3, first_elem);
}

static void counted_dropout_forward(void *ctx, real *out, const real *inp, const real *mask,
                                    size_t n_elems)
{
  const struct counter *c = count(ctx, ENTRY_DROPOUT_FORWARD);
  c->inner->dropout_forward(c->inner_ctx, out, inp, mask, n_elems);
}

static void counted_dropout_backward(void *ctx, real *dinp, const real *dout, const real *mask,
                                     size_t n_elems)
{
  const struct counter *c = count(ctx, ENTRY_DROPOUT_BACKWARD);
  c->inner->dropout_backward(c->inner_ctx, dinp, dout, mask, n_elems);
}

static void counted_residual_forward(void *ctx, real *out, const real *a, const real *b,
                                     size_t n_elems)
{
  const struct counter *c = count(ctx, ENTRY_RESIDUAL_FORWARD);
  c->inner->residual_forward(c->inner_ctx, out, a, b, n_elems);
}

static void counted_crossentropy_forward(void *ctx, real *losses, real *probs, const real *logits,
                                         const int *targets, int BT, int V, int Vp)
{
  const struct counter *c = count(ctx, ENTRY_CROSSENTROPY_FORWARD);
  c->inner->crossentropy_forward(c->inner_ctx, losses, probs, logits, targets, BT, V, Vp);
}

static void counted_crossentropy_backward(void *ctx, real *dlogits, const real *probs,
                                          const int *targets, real dloss_scale, int BT, int V,
                                          int Vp)
{
  const struct counter *c = count(ctx, ENTRY_CROSSENTROPY_BACKWARD);
  c->inner->crossentropy_backward(c->inner_ctx, dlogits, probs, targets, dloss_scale, BT, V, Vp);
}

static void counted_crossentropy_shard_max(void *ctx, real *stats, const real *logits, int BT,
                                           int Vvalid, int Vl)
{
  const struct counter *c = count(ctx, ENTRY_CROSSENTROPY_SHARD_MAX);
  c->inner->crossentropy_shard_max(c->inner_ctx, stats, logits, BT, Vvalid, Vl);
}

static void counted_crossentropy_shard_sums(void *ctx, real *stats, const real *logits,
                                            const int *targets, int v0, int BT, int Vvalid, int Vl)
{
  const struct counter *c = count(ctx, ENTRY_CROSSENTROPY_SHARD_SUMS);
  c->inner->crossentropy_shard_sums(c->inner_ctx, stats, logits, targets, v0, BT, Vvalid, Vl);
}

static void counted_crossentropy_shard_finish(void *ctx, real *losses, real *probs,
                                              const real *logits, const real *stats,
                                              const int *targets, int BT, int Vvalid, int Vl)
{
  const struct counter *c = count(ctx, ENTRY_CROSSENTROPY_SHARD_FINISH);
  c->inner->crossentropy_shard_finish(c->inner_ctx, losses, probs, logits, stats, targets, BT,
                                      Vvalid, Vl);
}

static void counted_crossentropy_shard_backward(void *ctx, real *dlogits, const real *probs,
                                                const int *targets, int v0, real dloss_scale,
                                                int BT, int Vvalid, int Vl)
{
  const struct counter *c = count(ctx, ENTRY_CROSSENTROPY_SHARD_BACKWARD);
  c->inner->crossentropy_shard_backward(c->inner_ctx, dlogits, probs, targets, v0, dloss_scale, BT,
                                        Vvalid, Vl);
}

static void counted_adamw_update(void *ctx, real *param, const real *grad, real *m, real *v,
                                 size_t n_elems, double lr, double beta1, double beta2, double eps,
                                 double weight_decay, int t, real grad_scale)
{
  const struct counter *c = count(ctx, ENTRY_ADAMW_UPDATE);
  c->inner->adamw_update(c->inner_ctx, param, grad, m, v, n_elems, lr, beta1, beta2, eps,
                         weight_decay, t, grad_scale);
}

static double counted_sumsq(void *ctx, const real *x, size_t n_elems)
{
  const struct counter *c = count(ctx, ENTRY_SUMSQ);
  return c->inner->sumsq(c->inner_ctx, x, n_elems);
}

static void counted_scale_inplace(void *ctx, real *x, size_t n_elems, real s)
{
  const struct counter *c = count(ctx, ENTRY_SCALE_INPLACE);
  c->inner->scale_inplace(c->inner_ctx, x, n_elems, s);
}

static const struct kernel_ops counting_ops = {
  .name = "counting",
  .compute_dtype = REAL_TENSOR_DTYPE,
  .host_visible = 1,
  .mem_alloc = counted_mem_alloc,
  .mem_free = counted_mem_free,
  .copy = counted_copy,
  .copy_rows = counted_copy_rows,
  .zero = counted_zero,
  .to_host = counted_to_host,
  .from_host = counted_from_host,
  .encoder_forward = counted_encoder_forward,
  .encoder_backward = counted_encoder_backward,
  .encoder_forward_shard = counted_encoder_forward_shard,
  .encoder_backward_shard = counted_encoder_backward_shard,
  .rmsnorm_forward = counted_rmsnorm_forward,
  .rmsnorm_backward = counted_rmsnorm_backward,
  .linear_forward = counted_linear_forward,
  .linear_backward = counted_linear_backward,
  .linear_forward_acc = counted_linear_forward_acc,
  .round_bf16 = counted_round_bf16,
  .linear_forward_bf16 = counted_linear_forward_bf16,
  .linear_forward_acc_bf16 = counted_linear_forward_acc_bf16,
  .linear_backward_bf16 = counted_linear_backward_bf16,
  .rmsnorm_forward_bf16 = counted_rmsnorm_forward_bf16,
  .swiglu_forward_bf16 = counted_swiglu_forward_bf16,
  .swiglu_forward_rows_bf16 = counted_swiglu_forward_rows_bf16,
  .adamw_update_bf16 = counted_adamw_update_bf16,
  .rope_table = counted_rope_table,
  .rope_forward = counted_rope_forward,
  .rope_backward = counted_rope_backward,
  .rope_forward_qkv = counted_rope_forward_qkv,
  .rope_backward_qkv = counted_rope_backward_qkv,
  .attention_scratch_n_elems = counted_attention_scratch_n_elems,
  .attention_forward = counted_attention_forward,
  .attention_backward = counted_attention_backward,
  .attention_forward_qkv = counted_attention_forward_qkv,
  .attention_backward_qkv = counted_attention_backward_qkv,
  .swiglu_forward = counted_swiglu_forward,
  .swiglu_backward = counted_swiglu_backward,
  .swiglu_forward_rows = counted_swiglu_forward_rows,
  .swiglu_backward_rows = counted_swiglu_backward_rows,
  .moe_router_forward = counted_moe_router_forward,
  .moe_route = counted_moe_route,
  .moe_dispatch = counted_moe_dispatch,
  .moe_dispatch_backward = counted_moe_dispatch_backward,
  .moe_combine = counted_moe_combine,
  .moe_combine_backward = counted_moe_combine_backward,
  .moe_aux_loss = counted_moe_aux_loss,
  .moe_router_backward = counted_moe_router_backward,
  .dropout_mask = counted_dropout_mask,
  .dropout_forward = counted_dropout_forward,
  .dropout_backward = counted_dropout_backward,
  .residual_forward = counted_residual_forward,
  .crossentropy_forward = counted_crossentropy_forward,
  .crossentropy_backward = counted_crossentropy_backward,
  .crossentropy_shard_max = counted_crossentropy_shard_max,
  .crossentropy_shard_sums = counted_crossentropy_shard_sums,
  .crossentropy_shard_finish = counted_crossentropy_shard_finish,
  .crossentropy_shard_backward = counted_crossentropy_shard_backward,
  .adamw_update = counted_adamw_update,
  .sumsq = counted_sumsq,
  .scale_inplace = counted_scale_inplace,
};

/* Entries a one-rank run on a host-visible table need not call: the vocabulary-shard ones and
 * copy_rows (tensor parallelism's splits and gathers only), mem_alloc/mem_free (a
 * host-visible backend's memory is the host allocator's) and scale_inplace (clipping is
 * adamw_update's grad_scale; optimizer_clip alone still scales the memory). */
/* Entries a step does not call: those of the other precision, the TP shard entries, and the
 * SwiGLU, RoPE and attention of separate gate, up, q, k and v (this plan runs them as one
 * product each: model_gate_up_fused, model_qkv_fused; the tensor-parallel and ZeRO-3
 * equivalence runs take the other path). */
static int uncounted_entry(enum entry e, int lowp, int moe)
{
  if (e >= ENTRY_MOE_ROUTER_FORWARD && e <= ENTRY_MOE_ROUTER_BACKWARD)
    return !moe; /* a dense model has no router */
  const int bf16_entry = e == ENTRY_ROUND_BF16 || e == ENTRY_LINEAR_FORWARD_BF16 ||
                         e == ENTRY_LINEAR_BACKWARD_BF16 || e == ENTRY_RMSNORM_FORWARD_BF16 ||
                         e == ENTRY_SWIGLU_FORWARD_ROWS_BF16 || e == ENTRY_ADAMW_UPDATE_BF16;
  const int fp32_only = e == ENTRY_LINEAR_FORWARD || e == ENTRY_LINEAR_BACKWARD ||
                        e == ENTRY_RMSNORM_FORWARD || e == ENTRY_SWIGLU_FORWARD_ROWS;
  if (lowp ? fp32_only : bf16_entry)
    return 1;
  if (e == ENTRY_LINEAR_FORWARD_ACC || e == ENTRY_LINEAR_FORWARD_ACC_BF16)
    return 1; /* the residual folded into o's and down's products runs without dropout only */
  if (e == ENTRY_SWIGLU_FORWARD || e == ENTRY_SWIGLU_BACKWARD || e == ENTRY_SWIGLU_FORWARD_BF16 ||
      e == ENTRY_ROPE_FORWARD || e == ENTRY_ROPE_BACKWARD || e == ENTRY_ATTENTION_FORWARD ||
      e == ENTRY_ATTENTION_BACKWARD)
    return 1;
  if (e == ENTRY_MEM_ALLOC || e == ENTRY_MEM_FREE || e == ENTRY_COPY_ROWS ||
      e == ENTRY_SCALE_INPLACE)
    return 1;
  return e == ENTRY_ENCODER_FORWARD_SHARD || e == ENTRY_ENCODER_BACKWARD_SHARD ||
         e == ENTRY_CROSSENTROPY_SHARD_MAX || e == ENTRY_CROSSENTROPY_SHARD_SUMS ||
         e == ENTRY_CROSSENTROPY_SHARD_FINISH || e == ENTRY_CROSSENTROPY_SHARD_BACKWARD;
}

static void tiny_plan(struct plan *p)
{
  struct fixture_shape s = { 2, 32, 4, 2, 64, 64, 16, 4, 2 };
  fixture_plan(p, s);
  p->model.dropout = 0.1;
  p->optimizer.grad_clip = 1e-3; /* below any gradient norm here: clipping scales */
}

static void counted_steps(int lowp, int moe)
{
  struct plan p;
  tiny_plan(&p);
  if (moe) { /* layer 1 sparse: 4 experts, top 2, at capacity (some assignments drop) */
    p.model.moe = (struct plan_moe){ .experts = 4, .top_k = 2, .ffn_dim = 24, .aux_loss = 0.01,
                                     .z_loss = 1e-3, .capacity_factor = 1.0, .n_layers = 1 };
    if (!p.layers) /* the fixture's plan has no layer table: all zero is every default */
      p.layers = calloc((size_t)p.model.n_layers, sizeof *p.layers);
    p.layers[1].moe = 1;
  }
  if (lowp)
    p.precision.compute = PLAN_BF16;
  const enum entry linear = lowp ? ENTRY_LINEAR_FORWARD_BF16 : ENTRY_LINEAR_FORWARD;
  struct train_step_stats cpu[2], counted[2];
  struct trainer a, b;

  CHECK(kernels_active() == &kernel_ops_cpu && kernels_active_context() == NULL);
  CHECK_MSG(trainer_open(&a, &p, NULL, err, sizeof err) == TRAIN_OK, "%s", err);
  CHECK(a.model.k == &kernel_ops_cpu);
  for (int s = 0; s < 2; s++) CHECK_MSG(trainer_step(&a, &cpu[s], err, sizeof err) == 0, "%s", err);

  struct counter c = { { 0 }, &kernel_ops_cpu, NULL };
  kernels_use(&counting_ops, &c);
  CHECK(kernels_active() == &counting_ops && kernels_active_context() == &c);
  CHECK_MSG(trainer_open(&b, &p, NULL, err, sizeof err) == TRAIN_OK, "%s", err);
  CHECK(b.model.k == &counting_ops && b.model.kctx == &c);
  CHECK_MSG(trainer_step(&b, &counted[0], err, sizeof err) == 0, "%s", err);
  /* Back to the CPU table: the trainer already open keeps the table it captured. */
  kernels_use(NULL, NULL);
  CHECK(kernels_active() == &kernel_ops_cpu && kernels_active_context() == NULL);
  const long after_one = c.calls[linear];
  CHECK_MSG(trainer_step(&b, &counted[1], err, sizeof err) == 0, "%s", err);
  CHECK(after_one > 0 && c.calls[linear] == 2 * after_one);

  /* The same kernels on the same buffers in the same order: equal bits, not merely close. */
  for (int s = 0; s < 2; s++) {
    CHECK_MSG(memcmp(&cpu[s].loss, &counted[s].loss, sizeof(double)) == 0,
              "step %d: loss %.17g on the CPU table, %.17g counted", s, cpu[s].loss,
              counted[s].loss);
    CHECK_MSG(memcmp(&cpu[s].grad_norm, &counted[s].grad_norm, sizeof(double)) == 0,
              "step %d: norm %.17g vs %.17g", s, cpu[s].grad_norm, counted[s].grad_norm);
    CHECK(cpu[s].grad_norm > p.optimizer.grad_clip); /* clipping had work to do */
  }
  CHECK(fixture_params_equal(&a.model, &b.model));
  CHECK(cpu[0].loss > 3.0 && cpu[0].loss < 5.0); /* near ln 64: a real forward ran */

  for (int e = 0; e < N_ENTRIES; e++) {
    printf("%-28s %ld\n", entry_names[e], c.calls[e]);
    if (!uncounted_entry((enum entry)e, lowp, moe))
      CHECK_MSG(c.calls[e] > 0, "%s: no call through the table", entry_names[e]);
  }
  trainer_close(&a);
  trainer_close(&b);
}

static void a_counting_table_sees_every_kernel_call_and_the_same_bits(void)
{
  counted_steps(0, 0);
}

/* A model with a sparse layer: the router, routing, dispatch and combine go through the table. */
static void a_sparse_layer_computes_through_the_table_too(void)
{
  counted_steps(0, 1);
}

/* The same in bf16 compute: every bf16 entry goes through the table, none of the fp32 products. */
static void bf16_steps_go_through_the_table_too(void)
{
  char why[256];
  if (REAL_IS_DOUBLE || bf16_matmul_available(NULL, why, sizeof why)) {
    /* no bf16 compute here: the table has no bf16 entries (float64), or the products say why */
    CHECK(REAL_IS_DOUBLE ? kernel_ops_cpu.linear_forward_bf16 == NULL : strstr(why, "oneDNN") != NULL);
    printf("no bf16 compute in this build\n");
    return;
  }
  counted_steps(1, 0);
}

static void kernels_use_null_goes_back_to_the_cpu_table(void)
{
  const struct kernel_ops *t = &kernel_ops_cpu;
  CHECK(strcmp(t->name, "cpu") == 0);
  CHECK(t->host_visible == 1 && t->mem_alloc && t->mem_free && t->copy && t->copy_rows &&
        t->zero && t->to_host && t->from_host);
  CHECK(t->encoder_forward && t->encoder_backward && t->encoder_forward_shard &&
        t->encoder_backward_shard && t->rmsnorm_forward && t->rmsnorm_backward &&
        t->linear_forward && t->linear_backward && t->rope_table && t->rope_forward &&
        t->rope_backward && t->attention_scratch_n_elems && t->attention_forward &&
        t->attention_backward && t->swiglu_forward && t->swiglu_backward && t->dropout_mask &&
        t->dropout_forward && t->dropout_backward && t->residual_forward &&
        t->crossentropy_forward && t->crossentropy_backward && t->crossentropy_shard_max &&
        t->crossentropy_shard_sums && t->crossentropy_shard_finish &&
        t->crossentropy_shard_backward && t->adamw_update && t->sumsq && t->scale_inplace);
  struct counter c = { { 0 }, &kernel_ops_cpu, NULL };
  kernels_use(&counting_ops, &c);
  CHECK(kernels_active() == &counting_ops);
  kernels_use(NULL, &c); /* the default's context is NULL, whatever was passed */
  CHECK(kernels_active() == &kernel_ops_cpu && kernels_active_context() == NULL);
  kernels_use(&kernel_ops_cpu, NULL);
  CHECK(kernels_active() == &kernel_ops_cpu && kernels_active_context() == NULL);

  /* A model made now captures the CPU table. */
  struct plan p;
  tiny_plan(&p);
  struct model m;
  CHECK_MSG(model_create(&m, &p.model, err, sizeof err) == 0, "%s", err);
  CHECK(m.k == &kernel_ops_cpu && m.kctx == NULL);
  model_free(&m);
}

/* A table whose buffers are of another element type than this build's tensors is refused when a
 * model is made from it, naming both types, instead of computing on misread memory. */
static void a_table_of_another_element_type_is_refused(void)
{
  struct kernel_ops other = kernel_ops_cpu;
  other.name = "bf16-test";
  other.compute_dtype = TENSOR_BF16;
  struct plan p;
  tiny_plan(&p);
  struct trainer t;
  kernels_use(&other, NULL);
  const int rc = trainer_open(&t, &p, NULL, err, sizeof err);
  kernels_use(NULL, NULL);
  CHECK(rc == TRAIN_RUNTIME_ERROR);
  CHECK_STR_CONTAINS(err, "the bf16-test kernel table computes in BF16; this build's tensors are ");
  CHECK_STR_CONTAINS(err, tensor_dtype_name(REAL_TENSOR_DTYPE));
  /* and the tensors of a model say what they hold and where */
  struct model m;
  CHECK_MSG(model_create(&m, &p.model, err, sizeof err) == 0, "%s", err);
  for (int i = 0; i < m.n_params; i++)
    CHECK(m.params[i].dtype == REAL_TENSOR_DTYPE && m.params[i].device == ALLOC_HOST);
  model_free(&m);
}

TEST_MAIN(TEST(a_counting_table_sees_every_kernel_call_and_the_same_bits),
          TEST(a_sparse_layer_computes_through_the_table_too), TEST(bf16_steps_go_through_the_table_too),
          TEST(a_table_of_another_element_type_is_refused),
          TEST(kernels_use_null_goes_back_to_the_cpu_table))
