/* kernel_ops_cpu: the CPU backend's table (ops.h). Each entry drops the execution context,
 * which the CPU has no use for, and calls the free function of the same name (kernels.h), so
 * the kernels themselves exist once and their unit tests call them directly. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"

/* ---- memory: host memory, worked on in place ---- */

static void *cpu_mem_alloc(void *ctx, size_t n_bytes)
{
  (void)ctx;
  size_t rounded = (n_bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  if (p)
    memset(p, 0, rounded);
  return p;
}

static void cpu_mem_free(void *ctx, void *block)
{
  (void)ctx;
  free(block);
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t n_bytes)
{
  (void)ctx;
  if (n_bytes)
    memmove(dst, src, n_bytes);
}

static void cpu_copy_rows(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                          size_t row_bytes, size_t n_rows)
{
  (void)ctx;
  for (size_t r = 0; r < n_rows; r++)
    memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes);
}

static void cpu_zero(void *ctx, void *dst, size_t n_bytes)
{
  (void)ctx;
  if (n_bytes)
    memset(dst, 0, n_bytes);
}

static void cpu_to_host(void *ctx, void *host, const void *src, size_t n_bytes)
{
  (void)ctx;
  if (n_bytes)
    memcpy(host, src, n_bytes);
}

static void cpu_from_host(void *ctx, void *dst, const void *host, size_t n_bytes)
{
  (void)ctx;
  if (n_bytes)
    memcpy(dst, host, n_bytes);
}

static void cpu_encoder_forward(void *ctx, real *out, const int *tokens, const real *wte, int BT,
                                int C)
{
  (void)ctx;
  encoder_forward(out, tokens, wte, BT, C);
}

static void cpu_encoder_backward(void *ctx, real *dwte, const real *dout, const int *tokens, int BT,
                                 int C)
{
  (void)ctx;
  encoder_backward(dwte, dout, tokens, BT, C);
}

static void cpu_encoder_forward_shard(void *ctx, real *out, const int *tokens, const real *wte,
                                      int v0, int Vl, int BT, int C)
{
  (void)ctx;
  encoder_forward_shard(out, tokens, wte, v0, Vl, BT, C);
}

static void cpu_encoder_backward_shard(void *ctx, real *dwte, const real *dout, const int *tokens,
                                       int v0, int Vl, int BT, int C)
{
  (void)ctx;
  encoder_backward_shard(dwte, dout, tokens, v0, Vl, BT, C);
}

static void cpu_rmsnorm_forward(void *ctx, real *out, real *rstd, const real *inp,
                                const real *weight, int BT, int C, real eps)
{
  (void)ctx;
  rmsnorm_forward(out, rstd, inp, weight, BT, C, eps);
}

static void cpu_rmsnorm_backward(void *ctx, real *dinp, real *dweight, const real *dout,
                                 const real *inp, const real *weight, const real *rstd, int BT,
                                 int C)
{
  (void)ctx;
  rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, BT, C);
}

static void cpu_linear_forward(void *ctx, real *out, const real *inp, const real *weight, int BT,
                               int IC, int OC)
{
  (void)ctx;
  linear_forward(out, inp, weight, BT, IC, OC);
}

static void cpu_linear_backward(void *ctx, real *dinp, real *dweight, const real *dout,
                                const real *inp, const real *weight, int BT, int IC, int OC)
{
  (void)ctx;
  linear_backward(dinp, dweight, dout, inp, weight, BT, IC, OC);
}

static void cpu_linear_forward_acc(void *ctx, real *out, const real *inp, const real *weight,
                                   int BT, int IC, int OC)
{
  (void)ctx;
  linear_forward_acc(out, inp, weight, BT, IC, OC);
}

static void cpu_rope_table(void *ctx, real *cos_table, real *sin_table, int T, int HS, double theta,
                           int pos0)
{
  (void)ctx;
  rope_table(cos_table, sin_table, T, HS, theta, pos0);
}

static void cpu_rope_forward(void *ctx, real *out, const real *inp, const real *cos_table,
                             const real *sin_table, int B, int T, int NHx, int HS)
{
  (void)ctx;
  rope_forward(out, inp, cos_table, sin_table, B, T, NHx, HS);
}

static void cpu_rope_backward(void *ctx, real *dinp, const real *dout, const real *cos_table,
                              const real *sin_table, int B, int T, int NHx, int HS)
{
  (void)ctx;
  rope_backward(dinp, dout, cos_table, sin_table, B, T, NHx, HS);
}

static void cpu_rope_forward_qkv(void *ctx, real *qkv, const real *cos_table, const real *sin_table,
                                 int B, int T, int NH, int NKV, int HS)
{
  (void)ctx;
  rope_forward_qkv(qkv, cos_table, sin_table, B, T, NH, NKV, HS);
}

static void cpu_rope_backward_qkv(void *ctx, real *dqkv, const real *cos_table,
                                  const real *sin_table, int B, int T, int NH, int NKV, int HS)
{
  (void)ctx;
  rope_backward_qkv(dqkv, cos_table, sin_table, B, T, NH, NKV, HS);
}

static void cpu_attention_forward_qkv(void *ctx, real *out, real *probs, real *scratch,
                                      const real *qkv, const real *dropmask, int B, int T, int NH,
                                      int NKV, int HS)
{
  (void)ctx;
  attention_forward_qkv(out, probs, scratch, qkv, dropmask, B, T, NH, NKV, HS);
}

static void cpu_attention_backward_qkv(void *ctx, real *dqkv, real *scratch, const real *dout,
                                       const real *qkv, const real *probs, const real *dropmask,
                                       int B, int T, int NH, int NKV, int HS)
{
  (void)ctx;
  attention_backward_qkv(dqkv, scratch, dout, qkv, probs, dropmask, B, T, NH, NKV, HS);
}

static size_t cpu_attention_scratch_n_elems(void *ctx, int B, int T, int NH, int NKV)
{
  (void)ctx;
  return attention_scratch_n_elems(B, T, NH, NKV);
}

static void cpu_attention_forward(void *ctx, real *out, real *probs, real *scratch, const real *q,
                                  const real *k, const real *v, const real *dropmask, int B, int T,
                                  int NH, int NKV, int HS)
{
  (void)ctx;
  attention_forward(out, probs, scratch, q, k, v, dropmask, B, T, NH, NKV, HS);
}

static void cpu_attention_backward(void *ctx, real *dq, real *dk, real *dv, real *scratch,
                                   const real *dout, const real *q, const real *k, const real *v,
                                   const real *probs, const real *dropmask, int B, int T, int NH,
                                   int NKV, int HS)
{
  (void)ctx;
  attention_backward(dq, dk, dv, scratch, dout, q, k, v, probs, dropmask, B, T, NH, NKV, HS);
}

static void cpu_swiglu_forward(void *ctx, real *out, const real *gate, const real *up,
                               size_t n_elems)
{
  (void)ctx;
  swiglu_forward(out, gate, up, n_elems);
}

static void cpu_swiglu_backward(void *ctx, real *dgate, real *dup, const real *dout,
                                const real *gate, const real *up, size_t n_elems)
{
  (void)ctx;
  swiglu_backward(dgate, dup, dout, gate, up, n_elems);
}

static void cpu_swiglu_forward_rows(void *ctx, real *out, const real *gu, int rows, int F)
{
  (void)ctx;
  swiglu_forward_rows(out, gu, rows, F);
}

static void cpu_swiglu_backward_rows(void *ctx, real *dgu, const real *dout, const real *gu,
                                     int rows, int F)
{
  (void)ctx;
  swiglu_backward_rows(dgu, dout, gu, rows, F);
}

static void cpu_moe_router_forward(void *ctx, real *probs, int *topi, real *topw, real *lse,
                                   const real *logits, int N, int E, int K)
{
  (void)ctx;
  moe_router_forward(probs, topi, topw, lse, logits, N, E, K);
}

static void cpu_moe_route(void *ctx, int *slot, int *counts, int *routed, const int *topi, int N,
                          int T, int E, int K, int capacity)
{
  (void)ctx;
  moe_route(slot, counts, routed, topi, N, T, E, K, capacity);
}

static void cpu_moe_dispatch(void *ctx, real *xe, const real *x, const int *slot, int N, int K,
                             int C)
{
  (void)ctx;
  moe_dispatch(xe, x, slot, N, K, C);
}

static void cpu_moe_dispatch_backward(void *ctx, real *dx, const real *dxe, const int *slot, int N,
                                      int K, int C)
{
  (void)ctx;
  moe_dispatch_backward(dx, dxe, slot, N, K, C);
}

static void cpu_moe_combine(void *ctx, real *out, const real *ye, const int *slot,
                            const real *topw, int N, int K, int C)
{
  (void)ctx;
  moe_combine(out, ye, slot, topw, N, K, C);
}

static void cpu_moe_combine_backward(void *ctx, real *dye, real *dtopw, const real *dout,
                                     const real *ye, const int *slot, const real *topw, int N,
                                     int K, int C)
{
  (void)ctx;
  moe_combine_backward(dye, dtopw, dout, ye, slot, topw, N, K, C);
}

static void cpu_moe_aux_loss(void *ctx, real *aux, const real *probs, const int *topi, int N, int T,
                             int E, int K)
{
  (void)ctx;
  moe_aux_loss(aux, probs, topi, N, T, E, K);
}

static void cpu_moe_router_backward(void *ctx, real *dlogits, const real *dtopw, const real *probs,
                                    const int *topi, const real *topw, const real *lse, int N,
                                    int T, int E, int K, real aux_scale, real z_scale)
{
  (void)ctx;
  moe_router_backward(dlogits, dtopw, probs, topi, topw, lse, N, T, E, K, aux_scale, z_scale);
}

static void cpu_dropout_mask(void *ctx, real *mask, size_t n_elems, float p, uint64_t seed,
                             uint32_t c1, uint32_t c2, uint32_t c3, uint64_t first_elem)
{
  (void)ctx;
  dropout_mask(mask, n_elems, p, seed, c1, c2, c3, first_elem);
}

static void cpu_dropout_forward(void *ctx, real *out, const real *inp, const real *mask,
                                size_t n_elems)
{
  (void)ctx;
  dropout_forward(out, inp, mask, n_elems);
}

static void cpu_dropout_backward(void *ctx, real *dinp, const real *dout, const real *mask,
                                 size_t n_elems)
{
  (void)ctx;
  dropout_backward(dinp, dout, mask, n_elems);
}

static void cpu_residual_forward(void *ctx, real *out, const real *a, const real *b, size_t n_elems)
{
  (void)ctx;
  residual_forward(out, a, b, n_elems);
}

static void cpu_crossentropy_forward(void *ctx, real *losses, real *probs, const real *logits,
                                     const int *targets, int BT, int V, int Vp)
{
  (void)ctx;
  crossentropy_forward(losses, probs, logits, targets, BT, V, Vp);
}

static void cpu_crossentropy_backward(void *ctx, real *dlogits, const real *probs,
                                      const int *targets, real dloss_scale, int BT, int V, int Vp)
{
  (void)ctx;
  crossentropy_backward(dlogits, probs, targets, dloss_scale, BT, V, Vp);
}

static void cpu_crossentropy_shard_max(void *ctx, real *stats, const real *logits, int BT,
                                       int Vvalid, int Vl)
{
  (void)ctx;
  crossentropy_shard_max(stats, logits, BT, Vvalid, Vl);
}

static void cpu_crossentropy_shard_sums(void *ctx, real *stats, const real *logits,
                                        const int *targets, int v0, int BT, int Vvalid, int Vl)
{
  (void)ctx;
  crossentropy_shard_sums(stats, logits, targets, v0, BT, Vvalid, Vl);
}

static void cpu_crossentropy_shard_finish(void *ctx, real *losses, real *probs, const real *logits,
                                          const real *stats, const int *targets, int BT, int Vvalid,
                                          int Vl)
{
  (void)ctx;
  crossentropy_shard_finish(losses, probs, logits, stats, targets, BT, Vvalid, Vl);
}

static void cpu_crossentropy_shard_backward(void *ctx, real *dlogits, const real *probs,
                                            const int *targets, int v0, real dloss_scale, int BT,
                                            int Vvalid, int Vl)
{
  (void)ctx;
  crossentropy_shard_backward(dlogits, probs, targets, v0, dloss_scale, BT, Vvalid, Vl);
}

static void cpu_adamw_update(void *ctx, real *param, const real *grad, real *m, real *v,
                             size_t n_elems, double lr, double beta1, double beta2, double eps,
                             double weight_decay, int t, real grad_scale)
{
  (void)ctx;
  adamw_update(param, grad, m, v, n_elems, lr, beta1, beta2, eps, weight_decay, t, grad_scale);
}

static double cpu_sumsq(void *ctx, const real *x, size_t n_elems)
{
  (void)ctx;
  return sumsq(x, n_elems);
}

static void cpu_scale_inplace(void *ctx, real *x, size_t n_elems, real s)
{
  (void)ctx;
  scale_inplace(x, n_elems, s);
}

#if !REAL_IS_DOUBLE
static void cpu_round_bf16(void *ctx, bf16 *dst, const real *src, size_t n_elems)
{
  (void)ctx;
  round_bf16(dst, src, n_elems);
}

static int cpu_linear_forward_bf16(void *ctx, real *out, const bf16 *inp, const bf16 *weight,
                                   int BT, int IC, int OC, char *err, size_t err_size)
{
  (void)ctx;
  return linear_forward_bf16(out, inp, weight, BT, IC, OC, err, err_size);
}

static int cpu_linear_forward_acc_bf16(void *ctx, real *out, const bf16 *inp, const bf16 *weight,
                                       int BT, int IC, int OC, char *err, size_t err_size)
{
  (void)ctx;
  return linear_forward_acc_bf16(out, inp, weight, BT, IC, OC, err, err_size);
}

static int cpu_linear_backward_bf16(void *ctx, real *dinp, real *dweight, const bf16 *dout,
                                    const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                                    char *err, size_t err_size)
{
  (void)ctx;
  return linear_backward_bf16(dinp, dweight, dout, inp, weight, BT, IC, OC, err, err_size);
}

static void cpu_rmsnorm_forward_bf16(void *ctx, bf16 *out, real *rstd, const real *inp,
                                     const real *weight, int BT, int C, real eps)
{
  (void)ctx;
  rmsnorm_forward_bf16(out, rstd, inp, weight, BT, C, eps);
}

static void cpu_swiglu_forward_bf16(void *ctx, bf16 *out, const real *gate, const real *up,
                                    size_t n_elems)
{
  (void)ctx;
  swiglu_forward_bf16(out, gate, up, n_elems);
}

static void cpu_swiglu_forward_rows_bf16(void *ctx, bf16 *out, const real *gu, int rows, int F)
{
  (void)ctx;
  swiglu_forward_rows_bf16(out, gu, rows, F);
}

static void cpu_adamw_update_bf16(void *ctx, real *param, bf16 *param_bf16, const real *grad,
                                  real *m, real *v, size_t n_elems, double lr, double beta1,
                                  double beta2, double eps, double weight_decay, int t,
                                  real grad_scale)
{
  (void)ctx;
  adamw_update_bf16(param, param_bf16, grad, m, v, n_elems, lr, beta1, beta2, eps, weight_decay, t,
                    grad_scale);
}
#endif

const struct kernel_ops kernel_ops_cpu = {
  .name = "cpu",
  .compute_dtype = REAL_TENSOR_DTYPE,
  .host_visible = 1,
  .mem_alloc = cpu_mem_alloc,
  .mem_free = cpu_mem_free,
  .copy = cpu_copy,
  .copy_rows = cpu_copy_rows,
  .zero = cpu_zero,
  .to_host = cpu_to_host,
  .from_host = cpu_from_host,
  .encoder_forward = cpu_encoder_forward,
  .encoder_backward = cpu_encoder_backward,
  .encoder_forward_shard = cpu_encoder_forward_shard,
  .encoder_backward_shard = cpu_encoder_backward_shard,
  .rmsnorm_forward = cpu_rmsnorm_forward,
  .rmsnorm_backward = cpu_rmsnorm_backward,
  .linear_forward = cpu_linear_forward,
  .linear_backward = cpu_linear_backward,
  .linear_forward_acc = cpu_linear_forward_acc,
#if !REAL_IS_DOUBLE
  .round_bf16 = cpu_round_bf16,
  .linear_forward_bf16 = cpu_linear_forward_bf16,
  .linear_forward_acc_bf16 = cpu_linear_forward_acc_bf16,
  .linear_backward_bf16 = cpu_linear_backward_bf16,
  .rmsnorm_forward_bf16 = cpu_rmsnorm_forward_bf16,
  .swiglu_forward_bf16 = cpu_swiglu_forward_bf16,
  .swiglu_forward_rows_bf16 = cpu_swiglu_forward_rows_bf16,
  .adamw_update_bf16 = cpu_adamw_update_bf16,
#endif
  .rope_table = cpu_rope_table,
  .rope_forward = cpu_rope_forward,
  .rope_backward = cpu_rope_backward,
  .rope_forward_qkv = cpu_rope_forward_qkv,
  .rope_backward_qkv = cpu_rope_backward_qkv,
  .attention_scratch_n_elems = cpu_attention_scratch_n_elems,
  .attention_forward = cpu_attention_forward,
  .attention_backward = cpu_attention_backward,
  .attention_forward_qkv = cpu_attention_forward_qkv,
  .attention_backward_qkv = cpu_attention_backward_qkv,
  .swiglu_forward = cpu_swiglu_forward,
  .swiglu_backward = cpu_swiglu_backward,
  .swiglu_forward_rows = cpu_swiglu_forward_rows,
  .swiglu_backward_rows = cpu_swiglu_backward_rows,
  .moe_router_forward = cpu_moe_router_forward,
  .moe_route = cpu_moe_route,
  .moe_dispatch = cpu_moe_dispatch,
  .moe_dispatch_backward = cpu_moe_dispatch_backward,
  .moe_combine = cpu_moe_combine,
  .moe_combine_backward = cpu_moe_combine_backward,
  .moe_aux_loss = cpu_moe_aux_loss,
  .moe_router_backward = cpu_moe_router_backward,
  .dropout_mask = cpu_dropout_mask,
  .dropout_forward = cpu_dropout_forward,
  .dropout_backward = cpu_dropout_backward,
  .residual_forward = cpu_residual_forward,
  .crossentropy_forward = cpu_crossentropy_forward,
  .crossentropy_backward = cpu_crossentropy_backward,
  .crossentropy_shard_max = cpu_crossentropy_shard_max,
  .crossentropy_shard_sums = cpu_crossentropy_shard_sums,
  .crossentropy_shard_finish = cpu_crossentropy_shard_finish,
  .crossentropy_shard_backward = cpu_crossentropy_shard_backward,
  .adamw_update = cpu_adamw_update,
  .sumsq = cpu_sumsq,
  .scale_inplace = cpu_scale_inplace,
};
