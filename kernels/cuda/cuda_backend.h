/* The CUDA backend's kernel table (kernels/ops.h is the contract; kernels/cpu/ the reference every
 * entry is tested against, tests/cuda/): its execution context, the check macros and every
 * entry's prototype. Built only where CMake finds the CUDA toolkit, in the fp32 build
 * (`real` is float here; the float64 proof build is the CPU's).
 *
 * The context is the `ctx` of kernels_use: one stream and one cuBLAS handle on one device. Calls
 * on it are ordered by the stream; nothing here synchronises with the host except to_host,
 * from_host (its host buffer may be reused on return), mem_alloc and mem_free, and sumsq (which
 * returns a value).
 *
 * Errors. Kernel entries return nothing (ops.h), so a failed CUDA, cuBLAS or NCCL call records
 * the first failure in the context, with file:line, the call and the library's message, and the
 * entry returns; cuda_ctx_error() hands it to the runtime, which stops the step and reports it.
 * Nothing here exits. */
#ifndef TYCHO_KERNELS_CUDA_BACKEND_H
#define TYCHO_KERNELS_CUDA_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#include "../bf16.h"
#include "../real.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kernel_ops;

/* Devices the driver sees; 0 without a driver or a device (cudaGetDeviceCount's error is "no
 * GPU", never a failure). */
int cuda_device_count(void);
/* A context on device `device`: its stream and cuBLAS handle. NULL with a message in err. */
void *cuda_ctx_create(int device, char *err, size_t err_size);
void cuda_ctx_destroy(void *ctx);
/* The first failure recorded in ctx ("" none): file:line, the call, the library's message. */
const char *cuda_ctx_error(const void *ctx);
/* Waits for everything issued on ctx; 0, or -1 with the failure recorded. */
int cuda_ctx_sync(void *ctx);
/* The table: kernels_use(&kernel_ops_cuda, ctx). */
extern const struct kernel_ops kernel_ops_cuda;

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cublas_v2.h>

struct cuda_ctx {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  int failed;
  char err[512];
};

/* Records "file:line: what: message" as ctx's first failure; returns 1 (failed) so callers
 * can write `if (CUDA_CHECK(c, call)) return;`. */
int cuda_record(struct cuda_ctx *c, const char *file, int line, const char *what, const char *message);
const char *cuda_blas_message(cublasStatus_t s);

#define CUDA_CHECK(c, call) ([&]() -> int { cudaError_t e_ = (call); \
  return e_ == cudaSuccess ? 0 : cuda_record((c), __FILE__, __LINE__, #call, cudaGetErrorString(e_)); }())
#define CUBLAS_CHECK(c, call) ([&]() -> int { cublasStatus_t s_ = (call); \
  return s_ == CUBLAS_STATUS_SUCCESS ? 0 : cuda_record((c), __FILE__, __LINE__, #call, cuda_blas_message(s_)); }())
/* After a kernel launch: the launch's own error (bad configuration), not the kernel's result. */
#define CUDA_LAUNCHED(c) CUDA_CHECK((c), cudaGetLastError())

static inline struct cuda_ctx *cuda_of(void *ctx) { return (struct cuda_ctx *)ctx; }
/* Blocks of `threads` covering n items (at least 1). */
static inline unsigned cuda_blocks(size_t n, unsigned threads)
{
  size_t b = (n + threads - 1) / threads;
  return b == 0 ? 1u : b > 0x7fffffffu ? 0x7fffffffu : (unsigned)b;
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
/* ---- the entries (ops.h's, in its order), defined across the .cu files here ---- */
void *cuda_mem_alloc(void *ctx, size_t n_bytes);
void cuda_mem_free(void *ctx, void *block);
void cuda_copy(void *ctx, void *dst, const void *src, size_t n_bytes);
void cuda_copy_rows(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t row_bytes, size_t n_rows);
void cuda_zero(void *ctx, void *dst, size_t n_bytes);
void cuda_to_host(void *ctx, void *host, const void *src, size_t n_bytes);
void cuda_from_host(void *ctx, void *dst, const void *host, size_t n_bytes);
void cuda_encoder_forward(void *ctx, real *out, const int *tokens, const real *wte, int BT, int C);
void cuda_encoder_backward(void *ctx, real *dwte, const real *dout, const int *tokens, int BT, int C);
void cuda_encoder_forward_shard(void *ctx, real *out, const int *tokens, const real *wte, int v0, int Vl, int BT, int C);
void cuda_encoder_backward_shard(void *ctx, real *dwte, const real *dout, const int *tokens, int v0, int Vl, int BT, int C);
void cuda_rmsnorm_forward(void *ctx, real *out, real *rstd, const real *inp, const real *weight, int BT, int C, real eps);
void cuda_rmsnorm_backward(void *ctx, real *dinp, real *dweight, const real *dout, const real *inp, const real *weight, const real *rstd, int BT, int C);
void cuda_linear_forward(void *ctx, real *out, const real *inp, const real *weight, int BT, int IC, int OC);
void cuda_linear_backward(void *ctx, real *dinp, real *dweight, const real *dout, const real *inp, const real *weight, int BT, int IC, int OC);
void cuda_linear_forward_acc(void *ctx, real *out, const real *inp, const real *weight, int BT, int IC, int OC);
void cuda_round_bf16(void *ctx, bf16 *dst, const real *src, size_t n_elems);
int cuda_linear_forward_bf16(void *ctx, real *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC, char *err, size_t err_size);
int cuda_linear_forward_acc_bf16(void *ctx, real *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC, char *err, size_t err_size);
int cuda_linear_backward_bf16(void *ctx, real *dinp, real *dweight, const bf16 *dout, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC, char *err, size_t err_size);
void cuda_rmsnorm_forward_bf16(void *ctx, bf16 *out, real *rstd, const real *inp, const real *weight, int BT, int C, real eps);
void cuda_swiglu_forward_bf16(void *ctx, bf16 *out, const real *gate, const real *up, size_t n_elems);
void cuda_swiglu_forward_rows_bf16(void *ctx, bf16 *out, const real *gu, int rows, int F);
void cuda_adamw_update_bf16(void *ctx, real *param, bf16 *param_bf16, const real *grad, real *m, real *v, size_t n_elems, double lr, double beta1, double beta2, double eps, double weight_decay, int t, real grad_scale);
void cuda_rope_table(void *ctx, real *cos_table, real *sin_table, int T, int HS, double theta, int pos0);
void cuda_rope_forward(void *ctx, real *out, const real *inp, const real *cos_table, const real *sin_table, int B, int T, int NHx, int HS);
void cuda_rope_backward(void *ctx, real *dinp, const real *dout, const real *cos_table, const real *sin_table, int B, int T, int NHx, int HS);
void cuda_rope_forward_qkv(void *ctx, real *qkv, const real *cos_table, const real *sin_table, int B, int T, int NH, int NKV, int HS);
void cuda_rope_backward_qkv(void *ctx, real *dqkv, const real *cos_table, const real *sin_table, int B, int T, int NH, int NKV, int HS);
size_t cuda_attention_scratch_n_elems(void *ctx, int B, int T, int NH, int NKV);
void cuda_attention_forward(void *ctx, real *out, real *probs, real *scratch, const real *q, const real *k, const real *v, const real *dropmask, int B, int T, int NH, int NKV, int HS);
void cuda_attention_backward(void *ctx, real *dq, real *dk, real *dv, real *scratch, const real *dout, const real *q, const real *k, const real *v, const real *probs, const real *dropmask, int B, int T, int NH, int NKV, int HS);
void cuda_attention_forward_qkv(void *ctx, real *out, real *probs, real *scratch, const real *qkv, const real *dropmask, int B, int T, int NH, int NKV, int HS);
void cuda_attention_backward_qkv(void *ctx, real *dqkv, real *scratch, const real *dout, const real *qkv, const real *probs, const real *dropmask, int B, int T, int NH, int NKV, int HS);
void cuda_swiglu_forward(void *ctx, real *out, const real *gate, const real *up, size_t n_elems);
void cuda_swiglu_backward(void *ctx, real *dgate, real *dup, const real *dout, const real *gate, const real *up, size_t n_elems);
void cuda_swiglu_forward_rows(void *ctx, real *out, const real *gu, int rows, int F);
void cuda_swiglu_backward_rows(void *ctx, real *dgu, const real *dout, const real *gu, int rows, int F);
void cuda_moe_router_forward(void *ctx, real *probs, int *topi, real *topw, real *lse, const real *logits, int N, int E, int K);
void cuda_moe_route(void *ctx, int *slot, int *counts, int *routed, const int *topi, int N, int T, int E, int K, int capacity);
void cuda_moe_dispatch(void *ctx, real *xe, const real *x, const int *slot, int N, int K, int C);
void cuda_moe_dispatch_backward(void *ctx, real *dx, const real *dxe, const int *slot, int N, int K, int C);
void cuda_moe_combine(void *ctx, real *out, const real *ye, const int *slot, const real *topw, int N, int K, int C);
void cuda_moe_combine_backward(void *ctx, real *dye, real *dtopw, const real *dout, const real *ye, const int *slot, const real *topw, int N, int K, int C);
void cuda_moe_aux_loss(void *ctx, real *aux, const real *probs, const int *topi, int N, int T, int E, int K);
void cuda_moe_router_backward(void *ctx, real *dlogits, const real *dtopw, const real *probs, const int *topi, const real *topw, const real *lse, int N, int T, int E, int K, real aux_scale, real z_scale);
void cuda_dropout_mask(void *ctx, real *mask, size_t n_elems, float p, uint64_t seed, uint32_t c1, uint32_t c2, uint32_t c3, uint64_t first_elem);
void cuda_dropout_forward(void *ctx, real *out, const real *inp, const real *mask, size_t n_elems);
void cuda_dropout_backward(void *ctx, real *dinp, const real *dout, const real *mask, size_t n_elems);
void cuda_residual_forward(void *ctx, real *out, const real *a, const real *b, size_t n_elems);
void cuda_crossentropy_forward(void *ctx, real *losses, real *probs, const real *logits, const int *targets, int BT, int V, int Vp);
void cuda_crossentropy_backward(void *ctx, real *dlogits, const real *probs, const int *targets, real dloss_scale, int BT, int V, int Vp);
void cuda_crossentropy_shard_max(void *ctx, real *stats, const real *logits, int BT, int Vvalid, int Vl);
void cuda_crossentropy_shard_sums(void *ctx, real *stats, const real *logits, const int *targets, int v0, int BT, int Vvalid, int Vl);
void cuda_crossentropy_shard_finish(void *ctx, real *losses, real *probs, const real *logits, const real *stats, const int *targets, int BT, int Vvalid, int Vl);
void cuda_crossentropy_shard_backward(void *ctx, real *dlogits, const real *probs, const int *targets, int v0, real dloss_scale, int BT, int Vvalid, int Vl);
void cuda_adamw_update(void *ctx, real *param, const real *grad, real *m, real *v, size_t n_elems, double lr, double beta1, double beta2, double eps, double weight_decay, int t, real grad_scale);
double cuda_sumsq(void *ctx, const real *x, size_t n_elems);
void cuda_scale_inplace(void *ctx, real *x, size_t n_elems, real s);

#ifdef __cplusplus
}
#endif
#endif
