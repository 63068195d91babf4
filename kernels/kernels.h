/* The CPU backend's kernels as free functions: each entry of struct kernel_ops (ops.h) has one
 * here of the same name and arguments, without ctx, and kernel_ops_cpu (kernels/cpu/ops.c)
 * points at them. kernels/cpu/ implements them with OpenBLAS and OpenMP; they are the reference
 * every other backend is compared to, and the kernel tests call them directly. The contract of
 * each (shapes, what is read, written, accumulated, which buffers may alias), the dimension
 * legend and the conventions are in ops.h. The runtime calls them through its model's table
 * (m->k, host/runtime/model/model.h), never by name, so another table takes their place. */
#ifndef TYCHO_KERNELS_H
#define TYCHO_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#include "ops.h"
#include "real.h"

/* Call first thing in main, before any other thread exists. Sets OpenBLAS to 1 thread (for good:
 * the kernels share each product's row tiles among OpenMP's threads, kernels/cpu/blas.h), turns on
 * flush-to-zero and denormals-are-zero (x86 MXCSR) in the calling thread, then sets OpenMP to
 * n_threads, so worker threads created from now on inherit the mode (denormals make sgemm ~100x
 * slower on some CPUs). OpenBLAS (0.3.21) starts its pool when the library loads and never copies
 * MXCSR to it, so the process must start with OPENBLAS_NUM_THREADS=1 for no thread to lack the
 * mode. The OpenMP threads are started here, with the asynchronous signals blocked
 * (kernels_compute_begin). Returns 0, or 1 when OpenBLAS already had more than one thread on entry
 * (its old workers, now idle, were made without flush-to-zero; the caller may warn). */
int kernels_init_cpu(int n_threads);
/* Around the kernels' work on the calling thread (a step, an evaluation): the asynchronous
 * signals (all but SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT and SIGSYS) are blocked in
 * it between begin and end, as they are for good in the OpenMP threads kernels_init_cpu starts;
 * one caught meanwhile runs its handler on a thread that does not compute, or at end. oneDNN's
 * jitted code does not survive a handler running on its thread: a process taking signals during
 * its sgemm had its heap corrupted within seconds (OpenBLAS's did not). Nests; per thread. */
void kernels_compute_begin(void);
void kernels_compute_end(void);
/* 1 when the OpenBLAS linked is its OpenMP build: its threads are the OpenMP pool the kernels'
 * loops use (one pool), 0 when it runs a pthread pool of its own. */
int kernels_blas_shares_openmp_pool(void);
/* What runs the CPU kernels, for headers: "avx512 element-wise kernels, products on oneDNN's sgemm
 * in row tiles, OpenBLAS Haswell (OpenMP build)" (the vector path chosen, kernels/cpu/vec.h; the
 * products' engine, kernels/cpu/blas.h; OpenBLAS's core type and build). */
const char *kernels_cpu_description(char *buf, size_t n);

/* ---- embedding ---------------------------------------------------------------------------- */
void encoder_forward(real *out, const int *tokens, const real *wte, int BT, int C);
void encoder_backward(real *dwte, const real *dout, const int *tokens, int BT, int C);
void encoder_forward_shard(real *out, const int *tokens, const real *wte, int v0, int Vl,
                           int BT, int C);
void encoder_backward_shard(real *dwte, const real *dout, const int *tokens, int v0, int Vl,
                            int BT, int C);

/* ---- RMSNorm ------------------------------------------------------------------------------ */
void rmsnorm_forward(real *out, real *rstd, const real *inp, const real *weight,
                     int BT, int C, real eps);
void rmsnorm_backward(real *dinp, real *dweight, const real *dout, const real *inp,
                      const real *weight, const real *rstd, int BT, int C);

/* ---- linear (no bias) --------------------------------------------------------------------- */
void linear_forward(real *out, const real *inp, const real *weight, int BT, int IC, int OC);
void linear_backward(real *dinp, real *dweight, const real *dout, const real *inp,
                     const real *weight, int BT, int IC, int OC);
void linear_forward_acc(real *out, const real *inp, const real *weight, int BT, int IC, int OC);

/* ---- bf16 compute (ops.h; the fp32 build only) --------------------------------------------- */
#if !REAL_IS_DOUBLE
void round_bf16(bf16 *dst, const real *src, size_t n_elems);
void widen_bf16(real *dst, const bf16 *src, size_t n_elems);
void accumulate_bf16(bf16 *acc, const bf16 *x, size_t n_elems);
void encoder_forward_bf16(real *out, const int *tokens, const bf16 *wte, int v0, int Vl, int BT, int C);
int linear_forward_bf16(real *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                        char *err, size_t err_size);
int linear_forward_acc_bf16(real *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                            char *err, size_t err_size);
int linear_backward_bf16(real *dinp, real *dweight, const bf16 *dout, const bf16 *inp,
                         const bf16 *weight, int BT, int IC, int OC, char *err, size_t err_size);
void rmsnorm_forward_bf16(bf16 *out, real *rstd, const real *inp, const real *weight, int BT,
                          int C, real eps);
void swiglu_forward_bf16(bf16 *out, const real *gate, const real *up, size_t n_elems);
void swiglu_forward_rows_bf16(bf16 *out, const real *gu, int rows, int F);
void adamw_update_bf16(real *param, bf16 *param_bf16, const real *grad, real *m, real *v,
                       size_t n_elems, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int t, real grad_scale);
#endif

/* ---- rotary position embedding (rotate-half form, as Hugging Face Llama) ------------------ */
void rope_table(real *cos_table, real *sin_table, int T, int HS, double theta, int pos0);
void rope_forward(real *out, const real *inp, const real *cos_table, const real *sin_table,
                  int B, int T, int NHx, int HS);
void rope_backward(real *dinp, const real *dout, const real *cos_table,
                   const real *sin_table, int B, int T, int NHx, int HS);
void rope_forward_qkv(real *qkv, const real *cos_table, const real *sin_table, int B, int T, int NH,
                      int NKV, int HS);
void rope_backward_qkv(real *dqkv, const real *cos_table, const real *sin_table, int B, int T,
                       int NH, int NKV, int HS);

/* ---- causal self-attention with grouped KV heads ------------------------------------------ */
size_t attention_scratch_n_elems(int B, int T, int NH, int NKV, int HS);
void attention_forward(real *out, real *lse, real *scratch, const real *q, const real *k,
                       const real *v, const struct attention_dropout *drop, int B, int T, int NH,
                       int NKV, int HS);
void attention_backward(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                        const real *q, const real *k, const real *v, const real *out,
                        const real *lse, const struct attention_dropout *drop, int B, int T, int NH,
                        int NKV, int HS);
void attention_forward_qkv(real *out, real *lse, real *scratch, const real *qkv,
                           const struct attention_dropout *drop, int B, int T, int NH, int NKV,
                           int HS);
void attention_backward_qkv(real *dqkv, real *scratch, const real *dout, const real *qkv,
                            const real *out, const real *lse, const struct attention_dropout *drop,
                            int B, int T, int NH, int NKV, int HS);
/* The same with the products on bf16 operands (kernels/cpu/gemm_bf16.h), for the bf16 mode; their
 * scratch is attention_scratch_n_elems_bf16. */
size_t attention_scratch_n_elems_bf16(int B, int T, int NH, int NKV, int HS);
/* What computes their products: "avx512_bf16" (vdpbf16ps) or "scalar" (gemm_bf16_path). */
const char *attention_bf16_path(void);
void attention_forward_bf16(real *out, real *lse, real *scratch, const real *q, const real *k,
                            const real *v, const struct attention_dropout *drop, int B, int T, int NH,
                            int NKV, int HS);
void attention_backward_bf16(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                             const real *q, const real *k, const real *v, const real *out,
                             const real *lse, const struct attention_dropout *drop, int B, int T,
                             int NH, int NKV, int HS);
void attention_forward_qkv_bf16(real *out, real *lse, real *scratch, const real *qkv,
                                const struct attention_dropout *drop, int B, int T, int NH, int NKV,
                                int HS);
void attention_backward_qkv_bf16(real *dqkv, real *scratch, const real *dout, const real *qkv,
                                 const real *out, const real *lse,
                                 const struct attention_dropout *drop, int B, int T, int NH, int NKV,
                                 int HS);

/* ---- context parallelism's attention blocks (kernels/cpu/attention_cp.c) ------------------
 * The entries attention_cp_* (ops_list.h: their contracts; struct attention_block, ops.h) and
 * the chunks of the load-balanced layout (not entries: arithmetic on sizes). A cp rank holds 2
 * of the sequence's 2·cp chunks. */
/* Chunk c (0 .. 2·cp − 1) of a T-long sequence: [*start, *start + *len); T % (2·cp) chunks,
 * the first, hold one token more than T / (2·cp). cp rank i holds chunks i and 2·cp − 1 − i
 * (attention_cp_rank_tokens of them, in that order), so each rank has as much of the causal
 * square's work as another. */
void attention_cp_chunk(int T, int cp, int c, int *start, int *len);
int attention_cp_rank_tokens(int T, int cp, int rank);
size_t attention_cp_scratch_n_elems(int B, int Tq, int Tk, int NH, int NKV, int HS);
void attention_cp_forward(real *out, real *lse, real *scratch, const real *q, const real *k,
                          const real *v, const struct attention_dropout *drop,
                          const struct attention_block *blk, int B, int NH, int NKV, int HS);
void attention_cp_merge(real *out, real *lse, const real *out_b, const real *lse_b, int B, int Tq,
                        int q_rows, int NH, int HS);
void attention_cp_row_dots(real *D, const real *dout, const real *out, int B, int Tq, int q_rows,
                           int NH, int HS);
void attention_cp_backward(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                           const real *q, const real *k, const real *v, const real *lse,
                           const real *D, const struct attention_dropout *drop,
                           const struct attention_block *blk, int B, int NH, int NKV, int HS);

/* ---- SwiGLU ------------------------------------------------------------------------------- */
void swiglu_forward(real *out, const real *gate, const real *up, size_t n_elems);
void swiglu_backward(real *dgate, real *dup, const real *dout, const real *gate,
                     const real *up, size_t n_elems);
void swiglu_forward_rows(real *out, const real *gu, int rows, int F);
void swiglu_backward_rows(real *dgu, const real *dout, const real *gu, int rows, int F);

/* ---- mixture of experts (kernels/cpu/moe.c) ----------------------------------------------- */
void moe_router_forward(real *probs, int *topi, real *topw, real *lse, const real *logits, int N,
                        int E, int K);
void moe_route(int *slot, int *counts, int *routed, const int *topi, int N, int T, int E, int K,
               int capacity);
void moe_dispatch(real *xe, const real *x, const int *slot, int N, int K, int C);
void moe_dispatch_backward(real *dx, const real *dxe, const int *slot, int N, int K, int C);
void moe_combine(real *out, const real *ye, const int *slot, const real *topw, int N, int K, int C);
void moe_combine_backward(real *dye, real *dtopw, const real *dout, const real *ye,
                          const int *slot, const real *topw, int N, int K, int C);
void moe_aux_loss(real *aux, const real *probs, const int *topi, int N, int T, int E, int K);
void moe_router_backward(real *dlogits, const real *dtopw, const real *probs, const int *topi,
                         const real *topw, const real *lse, int N, int T, int E, int K,
                         real aux_scale, real z_scale);

/* ---- dropout ------------------------------------------------------------------------------ */
void dropout_mask(real *mask, size_t n_elems, float p, uint64_t seed, uint32_t c1,
                  uint32_t c2, uint32_t c3, uint64_t first_elem);
void dropout_forward(real *out, const real *inp, const real *mask, size_t n_elems);
void dropout_backward(real *dinp, const real *dout, const real *mask, size_t n_elems);

/* ---- element-wise sum --------------------------------------------------------------------- */
void vec_add(real *out, const real *a, const real *b, size_t n_elems);

/* ---- cross-entropy over the vocabulary ---------------------------------------------------- */
void crossentropy_forward(real *losses, real *probs, const real *logits, const int *targets,
                          int BT, int V, int Vp);
void crossentropy_backward(real *dlogits, const real *probs, const int *targets,
                           real dloss_scale, int BT, int V, int Vp);

void crossentropy_shard_max(real *stats, const real *logits, int BT, int Vvalid, int Vl);
void crossentropy_shard_sums(real *stats, const real *logits, const int *targets, int v0,
                             int BT, int Vvalid, int Vl);
void crossentropy_shard_finish(real *losses, real *probs, const real *logits,
                               const real *stats, const int *targets, int BT, int Vvalid, int Vl);
void crossentropy_shard_backward(real *dlogits, const real *probs, const int *targets, int v0,
                                 real dloss_scale, int BT, int Vvalid, int Vl);

/* ---- optimizer and gradient utilities ----------------------------------------------------- */
void adamw_update(real *param, const real *grad, real *m, real *v, size_t n_elems,
                  double lr, double beta1, double beta2, double eps, double weight_decay, int t,
                  real grad_scale);
double sumsq(const real *x, size_t n_elems);
/* x ← x · s over n_elems. Not an entry of the table (clipping is adamw_update's grad_scale): the
 * reference the folded scale is tested against. */
void scale_inplace(real *x, size_t n_elems, real s);

#endif
