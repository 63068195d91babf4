/* The CUDA backend's products and attention (kernels/ops.h; reference kernels/cpu/dense.c,
 * attention.c, bf16_ops.c): the linears through cuBLAS, RoPE and causal grouped-query attention
 * as plain kernels.
 *
 * Linears. Row-major y (BT, OC) = x (BT, IC) · Wᵀ, W (OC, IC), is column-major
 * yᵀ (OC, BT) = op_T(W as (IC, OC), ld IC) · (x as (IC, BT), ld IC), and likewise for the two
 * backward products (comments at each call). fp32 through cublasSgemm on the context's handle,
 * which is in CUBLAS_PEDANTIC_MATH (no TF32); bf16 through cublasGemmEx with CUDA_R_16BF operands,
 * CUDA_R_32F output and CUBLAS_COMPUTE_32F, each call in CUBLAS_DEFAULT_MATH (tensor cores) and the
 * handle put back in the pedantic mode after it (cuda_backend.h, "Math modes"). cuBLAS gives the
 * same bits for the same problem on the same device and library (no atomics in gemm).
 *
 * RoPE. One thread per rotated pair; the products and sums with __fmul_rn / __fadd_rn so that
 * nvcc does not contract them into FMAs (the CPU builds with -ffp-contract=off); the table is
 * computed in double, as on the CPU.
 *
 * Attention (correctness over speed; nothing here is flash-style). Forward: one block of
 * ATT_THREADS threads per query row (b, h, t). Its scores s_j = scale · (q_t · k_j), j ≤ t, are
 * computed one key per warp (lanes over the head dimension, then a fixed xor-shuffle tree), and
 * written into the row of probs, which is the row's buffer; the max and Σ exp(s − max) (in
 * double, as the CPU) are block reductions with a fixed tree over a fixed thread count; probs =
 * exp(s − max) · (real)(1 / Σ), zero above the diagonal, exactly the CPU's formula. After a
 * __syncthreads the same block computes out_t = Σ_j (P ⊙ M)_tj v_j, one thread per output
 * element summing j in order. Backward: (1) one block per row (b, h, t) writes dS into scratch
 * (B, NH, T, T): dP_j = (dout_t · v_j) · M_tj, dot = Σ_j P_j dP_j in double (block tree),
 * dS_j = P_j (dP_j − (real)dot), 0 above the diagonal; (2) dq_t = scale · Σ_{j ≤ t} dS_tj k_j,
 * one thread per element; (3) per (b, KV head, key j): dv_j = Σ_{h in group} Σ_{t ≥ j} A_tj dout_t
 * and dk_j = Σ_h scale · Σ_{t ≥ j} dS_tj q_t, one thread per element, heads then rows in order.
 * Every output element is written by one thread with a fixed summation order, and every block
 * reduction has a fixed shape, so the bits do not depend on anything but the inputs; no atomics.
 * Scratch: B · NH · T · T reals (dS), only in backward; the forward takes none (it may be NULL). */
#include <math.h>
#include <stdio.h>

#include "cuda_backend.h"
#include "cuda_reduce.cuh"

enum { ATT_THREADS = 256, ATT_WARPS = ATT_THREADS / 32 };

/* ---- linears ---- */

extern "C" void cuda_linear_forward(void *ctx, real *out, const real *inp, const real *weight, int BT,
                                    int IC, int OC)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT == 0 || OC == 0)
    return;
  if (IC == 0) { /* an empty sum: 0, as the CPU's sgemm */
    CUDA_CHECK(c, cudaMemsetAsync(out, 0, sizeof(real) * (size_t)BT * OC, c->stream));
    return;
  }
  const float one = 1.0f, zero = 0.0f;
  /* yᵀ (OC, BT), ld OC = op_T(W as (IC, OC), ld IC) · (x as (IC, BT), ld IC) */
  CUBLAS_CHECK(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, BT, IC, &one, weight, IC, inp, IC,
                              &zero, out, OC));
}

extern "C" void cuda_linear_forward_acc(void *ctx, real *out, const real *inp, const real *weight,
                                        int BT, int IC, int OC)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT == 0 || OC == 0 || IC == 0)
    return;
  const float one = 1.0f;
  CUBLAS_CHECK(c, cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, BT, IC, &one, weight, IC, inp, IC,
                              &one, out, OC));
}

extern "C" void cuda_linear_backward(void *ctx, real *dinp, real *dweight, const real *dout,
                                     const real *inp, const real *weight, int BT, int IC, int OC)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT == 0 || IC == 0)
    return;
  const float one = 1.0f, zero = 0.0f;
  if (dinp) {
    if (OC == 0) {
      if (CUDA_CHECK(c, cudaMemsetAsync(dinp, 0, sizeof(real) * (size_t)BT * IC, c->stream)))
        return;
    } else if (CUBLAS_CHECK(c, /* dinpᵀ (IC, BT), ld IC = (W as (IC, OC), ld IC) · (dout as (OC, BT), ld OC) */
                            cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, IC, BT, OC, &one, weight, IC,
                                        dout, OC, &zero, dinp, IC))) {
      return;
    }
  }
  if (OC == 0)
    return;
  /* dWᵀ (IC, OC), ld IC += (x as (IC, BT), ld IC) · op_T(dout as (OC, BT), ld OC) */
  CUBLAS_CHECK(c, cublasSgemm(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, BT, &one, inp, IC, dout, OC,
                              &one, dweight, IC));
}

/* ---- bf16 linears: bf16 operands, fp32 accumulate and output ---- */

/* One column-major product C (m, n) = op(A) · op(B) + beta · C through cublasGemmEx; 0, or 1
 * with the failure recorded in the context and copied into err. */
static int gemm_bf16(struct cuda_ctx *c, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                     const bf16 *A, int lda, const bf16 *B, int ldb, float beta, float *C, int ldc, char *err,
                     size_t err_size)
{
  const float one = 1.0f;
  /* tensor cores for this product only: the fp32 products stay pedantic (the mode is the handle's,
   * a host-side setting: no synchronisation) */
  cublasStatus_t s = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
  if (s == CUBLAS_STATUS_SUCCESS) {
    s = cublasGemmEx(c->blas, ta, tb, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, C,
                     CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    const cublasStatus_t back = cublasSetMathMode(c->blas, CUBLAS_PEDANTIC_MATH);
    s = s == CUBLAS_STATUS_SUCCESS ? back : s;
  }
  if (s == CUBLAS_STATUS_SUCCESS)
    return 0;
  /* this call's message in err (the context keeps its first failure, which may be older) */
  const char *msg = cuda_blas_message(s);
  if (err && err_size)
    snprintf(err, err_size, "cuda_dense.cu: cublasGemmEx (bf16, %d x %d x %d): %s", m, n, k, msg);
  cuda_record(c, __FILE__, __LINE__, "cublasGemmEx", msg);
  return 1;
}

static int zero_fill(struct cuda_ctx *c, float *p, size_t n, char *err, size_t err_size)
{
  if (CUDA_CHECK(c, cudaMemsetAsync(p, 0, sizeof(float) * n, c->stream))) {
    if (err && err_size)
      snprintf(err, err_size, "%s", c->err);
    return 1;
  }
  return 0;
}

extern "C" int cuda_linear_forward_bf16(void *ctx, real *out, const bf16 *inp, const bf16 *weight, int BT,
                                        int IC, int OC, char *err, size_t err_size)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT == 0 || OC == 0)
    return 0;
  if (IC == 0)
    return zero_fill(c, out, (size_t)BT * OC, err, err_size);
  return gemm_bf16(c, CUBLAS_OP_T, CUBLAS_OP_N, OC, BT, IC, weight, IC, inp, IC, 0.0f, out, OC, err, err_size);
}

extern "C" int cuda_linear_forward_acc_bf16(void *ctx, real *out, const bf16 *inp, const bf16 *weight,
                                            int BT, int IC, int OC, char *err, size_t err_size)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT == 0 || OC == 0 || IC == 0)
    return 0;
  return gemm_bf16(c, CUBLAS_OP_T, CUBLAS_OP_N, OC, BT, IC, weight, IC, inp, IC, 1.0f, out, OC, err, err_size);
}

extern "C" int cuda_linear_backward_bf16(void *ctx, real *dinp, real *dweight, const bf16 *dout,
                                         const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                                         char *err, size_t err_size)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT == 0 || IC == 0)
    return 0;
  if (dinp) {
    if (OC == 0) {
      if (zero_fill(c, dinp, (size_t)BT * IC, err, err_size))
        return 1;
    } else if (gemm_bf16(c, CUBLAS_OP_N, CUBLAS_OP_N, IC, BT, OC, weight, IC, dout, OC, 0.0f, dinp, IC, err,
                         err_size)) {
      return 1;
    }
  }
  if (OC == 0)
    return 0;
  return gemm_bf16(c, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, BT, inp, IC, dout, OC, 1.0f, dweight, IC, err,
                   err_size);
}

/* ---- rotary position embedding ---- */

__global__ void rope_table_kernel(real *cos_table, real *sin_table, int T, int HS, double theta, int pos0)
{
  const int half = HS / 2;
  const size_t n = (size_t)T * half;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const int t = (int)(e / half), i = (int)(e % half);
    const double inv_freq = pow(theta, -2.0 * i / HS);
    const double angle = (double)(pos0 + t) * inv_freq;
    cos_table[e] = (real)cos(angle);
    sin_table[e] = (real)sin(angle);
  }
}

extern "C" void cuda_rope_table(void *ctx, real *cos_table, real *sin_table, int T, int HS, double theta,
                                int pos0)
{
  struct cuda_ctx *c = cuda_of(ctx);
  const size_t n = (size_t)T * (HS / 2);
  if (n == 0)
    return;
  rope_table_kernel<<<cuda_blocks(n, 256), 256, 0, c->stream>>>(cos_table, sin_table, T, HS, theta, pos0);
  CUDA_LAUNCHED(c);
}

/* One thread per pair (row, i): token rows ld apart in inp and out; sign +1 forward, −1 the
 * transpose. Each thread reads its pair before writing it, so out may equal inp. */
__global__ void rope_kernel(real *out, const real *inp, size_t ld, const real *cos_tab, const real *sin_tab,
                            int T, int NHx, int HS, size_t n_pairs, float sign)
{
  const int half = HS / 2;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n_pairs;
       e += (size_t)gridDim.x * blockDim.x) {
    const size_t row = e / half;
    const int i = (int)(e % half);
    const size_t token = row / NHx, at = token * ld + (row % NHx) * (size_t)HS;
    const int t = (int)(token % (size_t)T);
    const float x1 = inp[at + i], x2 = inp[at + i + half];
    const float cs = cos_tab[(size_t)t * half + i], si = sign * sin_tab[(size_t)t * half + i];
    out[at + i] = __fsub_rn(__fmul_rn(x1, cs), __fmul_rn(x2, si));
    out[at + i + half] = __fadd_rn(__fmul_rn(x2, cs), __fmul_rn(x1, si));
  }
}

static void rope_launch(struct cuda_ctx *c, real *out, const real *inp, size_t ld, const real *cos_tab,
                        const real *sin_tab, int B, int T, int NHx, int HS, float sign)
{
  const size_t n = (size_t)B * T * NHx * (HS / 2);
  if (n == 0)
    return;
  rope_kernel<<<cuda_blocks(n, 256), 256, 0, c->stream>>>(out, inp, ld, cos_tab, sin_tab, T, NHx, HS, n, sign);
  CUDA_LAUNCHED(c);
}

extern "C" void cuda_rope_forward(void *ctx, real *out, const real *inp, const real *cos_table,
                                  const real *sin_table, int B, int T, int NHx, int HS)
{
  rope_launch(cuda_of(ctx), out, inp, (size_t)NHx * HS, cos_table, sin_table, B, T, NHx, HS, 1.0f);
}

extern "C" void cuda_rope_backward(void *ctx, real *dinp, const real *dout, const real *cos_table,
                                   const real *sin_table, int B, int T, int NHx, int HS)
{
  rope_launch(cuda_of(ctx), dinp, dout, (size_t)NHx * HS, cos_table, sin_table, B, T, NHx, HS, -1.0f);
}

extern "C" void cuda_rope_forward_qkv(void *ctx, real *qkv, const real *cos_table, const real *sin_table,
                                      int B, int T, int NH, int NKV, int HS)
{
  struct cuda_ctx *c = cuda_of(ctx);
  const size_t ld = (size_t)(NH + 2 * NKV) * HS;
  rope_launch(c, qkv, qkv, ld, cos_table, sin_table, B, T, NH, HS, 1.0f);
  rope_launch(c, qkv + (size_t)NH * HS, qkv + (size_t)NH * HS, ld, cos_table, sin_table, B, T, NKV, HS, 1.0f);
}

extern "C" void cuda_rope_backward_qkv(void *ctx, real *dqkv, const real *cos_table, const real *sin_table,
                                       int B, int T, int NH, int NKV, int HS)
{
  struct cuda_ctx *c = cuda_of(ctx);
  const size_t ld = (size_t)(NH + 2 * NKV) * HS;
  rope_launch(c, dqkv, dqkv, ld, cos_table, sin_table, B, T, NH, HS, -1.0f);
  rope_launch(c, dqkv + (size_t)NH * HS, dqkv + (size_t)NH * HS, ld, cos_table, sin_table, B, T, NKV, HS,
              -1.0f);
}

/* ---- attention ---- */

extern "C" size_t cuda_attention_scratch_n_elems(void *ctx, int B, int T, int NH, int NKV)
{
  (void)ctx, (void)NKV; /* dS of every head, backward only (ctx may be NULL: a size only) */
  return (size_t)B * NH * T * T;
}

/* x · y over HS elements by one warp: lanes over d in order, then a fixed xor tree (every lane
 * ends with the same value). */
__device__ static float warp_dot(const real *x, const real *y, int HS, int lane)
{
  float acc = 0.0f;
  for (int d = lane; d < HS; d += 32) acc += x[d] * y[d];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

/* One block per query row: blockIdx.x = (b · NH + h) · T + t. */
__global__ void __launch_bounds__(ATT_THREADS)
attention_forward_kernel(real *out, real *probs, const real *q, const real *k, const real *v, int ldq, int ldkv,
                         const real *dropmask, int T, int NH, int NKV, int HS, float scale)
{
  __shared__ double shd[ATT_THREADS];
  __shared__ float shf[ATT_THREADS];
  const size_t row = blockIdx.x;
  const int t = (int)(row % T), bh = (int)(row / T), b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
  const real *qt = q + ((size_t)b * T + t) * ldq + (size_t)h * HS;
  const real *kb = k + (size_t)b * T * ldkv + (size_t)kvh * HS;
  const real *vb = v + (size_t)b * T * ldkv + (size_t)kvh * HS;
  real *P = probs + row * T;
  const real *M = dropmask ? dropmask + row * T : NULL;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  /* scores, one key per warp, into the row of probs */
  for (int j = warp; j <= t; j += ATT_WARPS) {
    const float s = warp_dot(qt, kb + (size_t)j * ldkv, HS, lane);
    if (lane == 0)
      P[j] = scale * s;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= t; j += ATT_THREADS) m = P[j] > m ? P[j] : m;
  m = block_max<ATT_THREADS>(m, shf);
  double sum = 0.0;
  for (int j = threadIdx.x; j <= t; j += ATT_THREADS) {
    const float e = expf(P[j] - m);
    P[j] = e;
    sum += e;
  }
  sum = block_sum<ATT_THREADS>(sum, shd);
  const float inv = (float)(1.0 / sum);
  for (int j = threadIdx.x; j < T; j += ATT_THREADS) P[j] = j <= t ? P[j] * inv : 0.0f;
  __syncthreads(); /* the row of probs, written by the block, read by the block below */
  real *o = out + ((size_t)b * T + t) * NH * HS + (size_t)h * HS;
  for (int d = threadIdx.x; d < HS; d += ATT_THREADS) {
    float acc = 0.0f;
    if (M)
      for (int j = 0; j <= t; j++) acc += (P[j] * M[j]) * vb[(size_t)j * ldkv + d];
    else
      for (int j = 0; j <= t; j++) acc += P[j] * vb[(size_t)j * ldkv + d];
    o[d] = acc;
  }
}

static void forward_ld(struct cuda_ctx *c, real *out, real *probs, const real *q, const real *k, const real *v,
                       int ldq, int ldkv, const real *dropmask, int B, int T, int NH, int NKV, int HS)
{
  const size_t rows = (size_t)B * NH * T;
  if (rows == 0 || HS == 0)
    return;
  const float scale = 1.0f / sqrtf((float)HS);
  attention_forward_kernel<<<(unsigned)rows, ATT_THREADS, 0, c->stream>>>(out, probs, q, k, v, ldq, ldkv, dropmask,
                                                                          T, NH, NKV, HS, scale);
  CUDA_LAUNCHED(c);
}

extern "C" void cuda_attention_forward(void *ctx, real *out, real *probs, real *scratch, const real *q,
                                       const real *k, const real *v, const real *dropmask, int B, int T, int NH,
                                       int NKV, int HS)
{
  (void)scratch;
  forward_ld(cuda_of(ctx), out, probs, q, k, v, NH * HS, NKV * HS, dropmask, B, T, NH, NKV, HS);
}

extern "C" void cuda_attention_forward_qkv(void *ctx, real *out, real *probs, real *scratch, const real *qkv,
                                           const real *dropmask, int B, int T, int NH, int NKV, int HS)
{
  (void)scratch;
  const int ld = (NH + 2 * NKV) * HS;
  forward_ld(cuda_of(ctx), out, probs, qkv, qkv + (size_t)NH * HS, qkv + (size_t)(NH + NKV) * HS, ld, ld,
             dropmask, B, T, NH, NKV, HS);
}

/* Backward (1): dS of one row (b, h, t) into scratch, blockIdx.x = (b · NH + h) · T + t. */
__global__ void __launch_bounds__(ATT_THREADS)
attention_ds_kernel(real *dS, const real *dout, const real *v, int ldkv, const real *probs, const real *dropmask,
                    int T, int NH, int NKV, int HS)
{
  __shared__ double shd[ATT_THREADS];
  const size_t row = blockIdx.x;
  const int t = (int)(row % T), bh = (int)(row / T), b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
  const real *dot_ = dout + ((size_t)b * T + t) * NH * HS + (size_t)h * HS;
  const real *vb = v + (size_t)b * T * ldkv + (size_t)kvh * HS;
  const real *P = probs + row * T;
  const real *M = dropmask ? dropmask + row * T : NULL;
  real *D = dS + row * T;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int j = warp; j <= t; j += ATT_WARPS) {
    const float a = warp_dot(dot_, vb + (size_t)j * ldkv, HS, lane);
    if (lane == 0)
      D[j] = M ? a * M[j] : a;
  }
  __syncthreads();
  double dot = 0.0;
  for (int j = threadIdx.x; j <= t; j += ATT_THREADS) dot += (double)P[j] * D[j];
  const float fdot = (float)block_sum<ATT_THREADS>(dot, shd);
  for (int j = threadIdx.x; j < T; j += ATT_THREADS) D[j] = j <= t ? P[j] * (D[j] - fdot) : 0.0f;
}

/* Backward (2): dq_t = scale · Σ_{j ≤ t} dS_tj k_j; one block per row, threads over d. */
__global__ void attention_dq_kernel(real *dq, int ldq, const real *dS, const real *k, int ldkv, int T, int NH,
                                    int NKV, int HS, float scale)
{
  const size_t row = blockIdx.x;
  const int t = (int)(row % T), bh = (int)(row / T), b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
  const real *kb = k + (size_t)b * T * ldkv + (size_t)kvh * HS;
  const real *D = dS + row * T;
  real *o = dq + ((size_t)b * T + t) * ldq + (size_t)h * HS;
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j <= t; j++) acc += D[j] * kb[(size_t)j * ldkv + d];
    o[d] = scale * acc;
  }
}

/* Backward (3): dk_j and dv_j of KV head kvh, blockIdx.x = (b · NKV + kvh) · T + j; the group's
 * query heads in order, each over rows t ≥ j in order. */
__global__ void attention_dkv_kernel(real *dk, real *dv, int ldkv, const real *dS, const real *dout,
                                     const real *q, int ldq, const real *probs, const real *dropmask, int T,
                                     int NH, int NKV, int HS, float scale)
{
  const size_t blk = blockIdx.x;
  const int j = (int)(blk % T), bkv = (int)(blk / T), b = bkv / NKV, kvh = bkv % NKV, group = NH / NKV;
  const size_t TT = (size_t)T * T;
  real *dkj = dk + ((size_t)b * T + j) * ldkv + (size_t)kvh * HS;
  real *dvj = dv + ((size_t)b * T + j) * ldkv + (size_t)kvh * HS;
  for (int d = threadIdx.x; d < HS; d += blockDim.x) {
    float ak = 0.0f, av = 0.0f;
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
      const size_t bh = (size_t)b * NH + h;
      const real *D = dS + bh * TT, *P = probs + bh * TT;
      const real *M = dropmask ? dropmask + bh * TT : NULL;
      const real *qh = q + (size_t)b * T * ldq + (size_t)h * HS + d;
      const real *dh = dout + (size_t)b * T * NH * HS + (size_t)h * HS + d;
      float hk = 0.0f;
      for (int t = j; t < T; t++) {
        const size_t tj = (size_t)t * T + j;
        const float a = M ? P[tj] * M[tj] : P[tj];
        av += a * dh[(size_t)t * NH * HS];
        hk += D[tj] * qh[(size_t)t * ldq];
      }
      ak += scale * hk;
    }
    dkj[d] = ak;
    dvj[d] = av;
  }
}

static unsigned head_threads(int HS)
{
  const int t = (HS + 31) / 32 * 32;
  return (unsigned)(t > 256 ? 256 : t < 32 ? 32 : t);
}

static void backward_ld(struct cuda_ctx *c, real *dq, real *dk, real *dv, real *scratch, const real *dout,
                        const real *q, const real *k, const real *v, int ldq, int ldkv, const real *probs,
                        const real *dropmask, int B, int T, int NH, int NKV, int HS)
{
  const size_t rows = (size_t)B * NH * T, kv_rows = (size_t)B * NKV * T;
  if (rows == 0 || HS == 0)
    return;
  const float scale = 1.0f / sqrtf((float)HS);
  attention_ds_kernel<<<(unsigned)rows, ATT_THREADS, 0, c->stream>>>(scratch, dout, v, ldkv, probs, dropmask, T,
                                                                     NH, NKV, HS);
  if (CUDA_LAUNCHED(c))
    return;
  const unsigned th = head_threads(HS);
  /* dq before dk, dv: in the fused layout all three are rows of one buffer, and no kernel reads
   * what another writes (q, k, v are inputs; dS is scratch), so the order is free */
  attention_dq_kernel<<<(unsigned)rows, th, 0, c->stream>>>(dq, ldq, scratch, k, ldkv, T, NH, NKV, HS, scale);
  if (CUDA_LAUNCHED(c))
    return;
  attention_dkv_kernel<<<(unsigned)kv_rows, th, 0, c->stream>>>(dk, dv, ldkv, scratch, dout, q, ldq, probs,
                                                                dropmask, T, NH, NKV, HS, scale);
  CUDA_LAUNCHED(c);
}

extern "C" void cuda_attention_backward(void *ctx, real *dq, real *dk, real *dv, real *scratch,
                                        const real *dout, const real *q, const real *k, const real *v,
                                        const real *probs, const real *dropmask, int B, int T, int NH, int NKV,
                                        int HS)
{
  backward_ld(cuda_of(ctx), dq, dk, dv, scratch, dout, q, k, v, NH * HS, NKV * HS, probs, dropmask, B, T, NH,
              NKV, HS);
}

extern "C" void cuda_attention_backward_qkv(void *ctx, real *dqkv, real *scratch, const real *dout,
                                            const real *qkv, const real *probs, const real *dropmask, int B,
                                            int T, int NH, int NKV, int HS)
{
  const int ld = (NH + 2 * NKV) * HS;
  const size_t k0 = (size_t)NH * HS, v0 = (size_t)(NH + NKV) * HS;
  backward_ld(cuda_of(ctx), dqkv, dqkv + k0, dqkv + v0, scratch, dout, qkv, qkv + k0, qkv + v0, ld, ld, probs,
              dropmask, B, T, NH, NKV, HS);
}
