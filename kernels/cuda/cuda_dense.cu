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
 * Attention, flash-style (the CPU's twin, kernels/cpu/attention.c: the same formulas, no (T, T)
 * matrix anywhere). Tiles of BR query rows against BR keys, BR and the head dimensions a thread
 * holds chosen from HS alone (flash_cfg_of: BR 64 up to HS 128, 32 up to 256; a larger HS is
 * refused as the context's failure), ATT_THREADS = 256 threads per block as 16 × 16, each thread
 * owning rows ty + 16 i and columns (keys or dimensions) tx + 16 j of a tile. Forward: one block
 * per (query tile, head, sample) walks the key tiles up to the diagonal in order with an online
 * softmax (running max, Σ exp in double) and keeps O in registers; it writes out and lse.
 * Backward: D_i = dout_i · out_i into scratch (one warp per row); then one block per (key tile,
 * KV head, sample) recomputes P = exp(s − lse) and dS = P (dP · M − D) tile by tile for the
 * group's query heads in order and their query tiles from the diagonal on, accumulating dk and
 * dv in registers; then one block per (query tile, head, sample) recomputes them against the key
 * tiles up to the diagonal for dq. Dropout is drawn where it is used (attention_drop_u,
 * philox.h), the same numbers forward and backward; a launch with dropout covers one sample
 * (its c2 passed by value). Every output element has one writer and one summation order, fixed
 * by HS and T, so the bits of a (sample, head) depend on nothing but its inputs: not on B, on the
 * other heads or on the launch; no atomics. Scratch: B · NH · T reals (D), backward only.
 * fp32 arithmetic (FMAs where nvcc contracts, as the rest of the backend); there is no bf16
 * tensor-core path yet. The tiles' configurations, loads and score products are cuda_flash.h's,
 * shared with context parallelism's blocks (cuda_attention_cp.cu). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cuda_backend.h"
#include "../philox.h"
#include "cuda_flash.h"

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
  if (OC == 0 || !dweight) /* dweight NULL: the input gradient alone (a split backward's B) */
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
  if (OC == 0 || !dweight) /* dweight NULL: the input gradient alone (a split backward's B) */
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

/* ---- attention (flash-style) ---- */

/* Forward: one block per (query tile, query head, sample): blockIdx = (qt, h, b − b0). The key
 * tiles 0 .. qt in order (those above the diagonal skipped); per tile the scores, then per row
 * the new max m, P = exp(s − m), l = l · exp(m_old − m) + Σ P (in double) and, with dropout,
 * P ⊙ M in place; then O = O · exp(m_old − m) + (P ⊙ M) · V in registers. At the end
 * out = O · (1 / l), lse = m + log l. */
template <int BR, int NJ>
__global__ void __launch_bounds__(ATT_THREADS)
flash_forward_kernel(real *out, real *lse, const real *q, const real *k, const real *v, int ldq, int ldkv, int T,
                     int NH, int NKV, int HS, float scale, struct att_drop dr, int b0)
{
  typedef flash_cfg<BR, NJ> C;
  constexpr int W = C::W, LD = C::LD, SL = C::SL, RI = BR / 16, TPR = ATT_THREADS / BR, CPT = BR / TPR;
  extern __shared__ double att_smem[];
  double *row_l = att_smem;                                  /* BR */
  float *Qs = (float *)(row_l + BR), *Ks = Qs + BR * LD;     /* BR × LD each */
  float *Vs = Ks + BR * LD, *Ss = Vs + BR * LD;              /* BR × LD, BR × SL */
  float *row_m = Ss + BR * SL, *row_a = row_m + BR;          /* BR each */
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int qt = blockIdx.x, h = blockIdx.y, b = b0 + (int)blockIdx.z, kvh = h / (NH / NKV), i0 = qt * BR;
  const real *qb = q + (size_t)b * T * ldq + (size_t)h * HS;
  const real *kb = k + (size_t)b * T * ldkv + (size_t)kvh * HS;
  const real *vb = v + (size_t)b * T * ldkv + (size_t)kvh * HS;
  load_tile<BR, W, LD>(Qs, qb, ldq, i0, T, HS);
  if (tid < BR) {
    row_l[tid] = 0.0;
    row_m[tid] = -INFINITY;
  }
  float o[RI][NJ];
#pragma unroll
  for (int i = 0; i < RI; i++)
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) o[i][jj] = 0.0f;
  for (int kt = 0; kt <= qt; kt++) {
    const int j0 = kt * BR;
    __syncthreads(); /* the last tile's Ks, Vs, Ss read by every thread */
    load_tile<BR, W, LD>(Ks, kb, ldkv, j0, T, HS);
    load_tile<BR, W, LD>(Vs, vb, ldkv, j0, T, HS);
    __syncthreads();
    float s[RI][RI];
    tile_dots<BR, LD>(s, Qs, Ks, HS, tx, ty);
#pragma unroll
    for (int i = 0; i < RI; i++)
#pragma unroll
      for (int jj = 0; jj < RI; jj++) {
        const int r = ty + 16 * i, c = tx + 16 * jj, j = j0 + c;
        /* causal; a padding row (≥ T) sees every real key, so no row is empty */
        Ss[r * SL + c] = j <= i0 + r && j < T ? scale * s[i][jj] : -INFINITY;
      }
    __syncthreads();
    { /* the online softmax of this tile: TPR adjacent lanes per row, CPT columns each */
      const int r = tid / TPR, part = tid % TPR, row = i0 + r, lane = tid % 32;
      float *srow = Ss + r * SL;
      float mx = -INFINITY;
#pragma unroll
      for (int x = 0; x < CPT; x++) mx = fmaxf(mx, srow[part + TPR * x]);
#pragma unroll
      for (int o_ = 1; o_ < TPR; o_ <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o_));
      mx = __shfl_sync(0xffffffffu, mx, lane - part); /* one max per row, whatever a NaN did */
      const float m_old = row_m[r], m_new = fmaxf(mx, m_old);
      double sum = 0.0;
#pragma unroll
      for (int x = 0; x < CPT; x++) {
        const int c = part + TPR * x, j = j0 + c;
        const float p = expf(srow[c] - m_new); /* −inf (masked): 0 */
        sum += p;
        srow[c] = dr.on && row < T && j <= row ? p * att_mask(dr, h, row, j, T) : p;
      }
#pragma unroll
      for (int o_ = 1; o_ < TPR; o_ <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o_);
      const float alpha = expf(m_old - m_new); /* the first tile: exp(−inf) = 0 */
      __syncwarp(); /* the row's lanes have read row_m before lane `part 0` writes it */
      if (part == 0) {
        row_l[r] = row_l[r] * alpha + sum;
        row_m[r] = m_new;
        row_a[r] = alpha;
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < RI; i++) {
      const float a = row_a[ty + 16 * i];
#pragma unroll
      for (int jj = 0; jj < NJ; jj++) o[i][jj] *= a;
    }
    for (int c = 0; c < BR; c++) {
      float pv[RI];
#pragma unroll
      for (int i = 0; i < RI; i++) pv[i] = Ss[(ty + 16 * i) * SL + c];
#pragma unroll
      for (int jj = 0; jj < NJ; jj++) {
        const float vv = Vs[c * LD + tx + 16 * jj];
#pragma unroll
        for (int i = 0; i < RI; i++) o[i][jj] += pv[i] * vv;
      }
    }
  }
  /* row_l and row_m were last written before the loop's last __syncthreads */
  const int ldo = NH * HS;
#pragma unroll
  for (int i = 0; i < RI; i++) {
    const int r = ty + 16 * i, row = i0 + r;
    if (row >= T)
      continue;
    const float inv = (float)(1.0 / row_l[r]);
    real *orow = out + ((size_t)b * T + row) * ldo + (size_t)h * HS;
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
      const int d = tx + 16 * jj;
      if (d < HS)
        orow[d] = o[i][jj] * inv;
    }
  }
  if (tid < BR && i0 + tid < T)
    lse[((size_t)b * NH + h) * T + i0 + tid] = (float)((double)row_m[tid] + log(row_l[tid]));
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

/* Backward, first: D_i = dout_i · out_i of every row, one warp per row (b, h, t) =
 * ((b · NH + h) · T + t), into scratch (B, NH, T). */
__global__ void __launch_bounds__(ATT_THREADS)
attention_rowdot_kernel(real *Dv, const real *dout, const real *out, int T, int NH, int HS, size_t rows)
{
  const size_t row = (size_t)blockIdx.x * ATT_WARPS + threadIdx.x / 32;
  if (row >= rows)
    return; /* a whole warp: the shuffles below see every lane */
  const int t = (int)(row % T), bh = (int)(row / T), b = bh / NH, h = bh % NH, lane = threadIdx.x % 32;
  const size_t at = ((size_t)b * T + t) * NH * HS + (size_t)h * HS;
  const float s = warp_dot(dout + at, out + at, HS, lane);
  if (lane == 0)
    Dv[row] = s;
}

/* The recomputed tile of one query tile against one key tile, in the thread's elements
 * (r = ty + 16 i, c = tx + 16 jj): P = exp(s − lse), dS = P (dP · M − D), and A = P · M; 0 where
 * masked (causal, or a row ≥ T). Qs, dOs, Ks, Vs, lse_s and D_s are the tiles in shared
 * memory. */
template <int BR, int LD>
__device__ static inline void flash_ds(float (&a)[BR / 16][BR / 16], float (&ds)[BR / 16][BR / 16],
                                       const float *Qs, const float *dOs, const float *Ks, const float *Vs,
                                       const float *lse_s, const float *D_s, int i0, int j0, int h, int T,
                                       int HS, float scale, const struct att_drop &dr, int tx, int ty)
{
  constexpr int RI = BR / 16;
  float s[RI][RI], dp[RI][RI];
  tile_dots<BR, LD>(s, Qs, Ks, HS, tx, ty);
  tile_dots<BR, LD>(dp, dOs, Vs, HS, tx, ty);
#pragma unroll
  for (int i = 0; i < RI; i++)
#pragma unroll
    for (int jj = 0; jj < RI; jj++) {
      const int r = ty + 16 * i, row = i0 + r, j = j0 + tx + 16 * jj;
      a[i][jj] = 0.0f, ds[i][jj] = 0.0f;
      if (row < T && j <= row) {
        const float p = expf(scale * s[i][jj] - lse_s[r]);
        const float m = dr.on ? att_mask(dr, h, row, j, T) : 1.0f;
        a[i][jj] = p * m;
        ds[i][jj] = p * (dp[i][jj] * m - D_s[r]);
      }
    }
}

/* Backward, dk and dv: one block per (key tile, KV head, sample): blockIdx = (kt, kvh, b − b0).
 * The group's query heads in order, each over the query tiles kt .. last in order (those below
 * the diagonal see no key of the tile), each tile's rows in order: dv_j = Σ A_ij dout_i,
 * dk_j = scale · Σ dS_ij q_i, accumulated in registers, one thread per element. */
template <int BR, int NJ>
__global__ void __launch_bounds__(ATT_THREADS)
flash_backward_dkv_kernel(real *dk, real *dv, const real *dout, const real *q, const real *k, const real *v,
                          int ldq, int ldkv, const real *lse, const real *Dv, int T, int NH, int NKV, int HS,
                          float scale, struct att_drop dr, int b0)
{
  typedef flash_cfg<BR, NJ> C;
  constexpr int W = C::W, LD = C::LD, SL = C::SL, RI = BR / 16;
  extern __shared__ double att_smem[];
  float *Ks = (float *)att_smem, *Vs = Ks + BR * LD, *Qs = Vs + BR * LD, *dOs = Qs + BR * LD; /* BR × LD */
  float *As = dOs + BR * LD, *dSs = As + BR * SL;                                           /* BR × SL */
  float *lse_s = dSs + BR * SL, *D_s = lse_s + BR;                                          /* BR */
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int kt = blockIdx.x, kvh = blockIdx.y, b = b0 + (int)blockIdx.z, group = NH / NKV, j0 = kt * BR;
  const int nq = (T + BR - 1) / BR, ldo = NH * HS;
  load_tile<BR, W, LD>(Ks, k + (size_t)b * T * ldkv + (size_t)kvh * HS, ldkv, j0, T, HS);
  load_tile<BR, W, LD>(Vs, v + (size_t)b * T * ldkv + (size_t)kvh * HS, ldkv, j0, T, HS);
  float dka[RI][NJ], dva[RI][NJ];
#pragma unroll
  for (int i = 0; i < RI; i++)
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) dka[i][jj] = 0.0f, dva[i][jj] = 0.0f;
  for (int h = kvh * group; h < (kvh + 1) * group; h++) {
    const real *qb = q + (size_t)b * T * ldq + (size_t)h * HS, *ob = dout + (size_t)b * T * ldo + (size_t)h * HS;
    const real *lh = lse + ((size_t)b * NH + h) * T, *Dh = Dv + ((size_t)b * NH + h) * T;
    for (int qt = kt; qt < nq; qt++) {
      const int i0 = qt * BR;
      __syncthreads(); /* the last tile's Qs, dOs, As, dSs read by every thread */
      load_tile<BR, W, LD>(Qs, qb, ldq, i0, T, HS);
      load_tile<BR, W, LD>(dOs, ob, ldo, i0, T, HS);
      if (tid < BR) {
        const int row = i0 + tid;
        lse_s[tid] = row < T ? lh[row] : 0.0f;
        D_s[tid] = row < T ? Dh[row] : 0.0f;
      }
      __syncthreads();
      float a[RI][RI], ds[RI][RI];
      flash_ds<BR, LD>(a, ds, Qs, dOs, Ks, Vs, lse_s, D_s, i0, j0, h, T, HS, scale, dr, tx, ty);
#pragma unroll
      for (int i = 0; i < RI; i++)
#pragma unroll
        for (int jj = 0; jj < RI; jj++) {
          const int at = (ty + 16 * i) * SL + tx + 16 * jj;
          As[at] = a[i][jj];
          dSs[at] = ds[i][jj];
        }
      __syncthreads();
      /* the thread's keys c = ty + 16 i, dimensions d = tx + 16 jj, over the tile's rows r */
      for (int r = 0; r < BR; r++) {
        float pa[RI], pd[RI];
#pragma unroll
        for (int i = 0; i < RI; i++) {
          pa[i] = As[r * SL + ty + 16 * i];
          pd[i] = dSs[r * SL + ty + 16 * i];
        }
#pragma unroll
        for (int jj = 0; jj < NJ; jj++) {
          const float od = dOs[r * LD + tx + 16 * jj], qd = Qs[r * LD + tx + 16 * jj];
#pragma unroll
          for (int i = 0; i < RI; i++) {
            dva[i][jj] += pa[i] * od;
            dka[i][jj] += pd[i] * qd;
          }
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RI; i++) {
    const int j = j0 + ty + 16 * i;
    if (j >= T)
      continue;
    real *dkj = dk + ((size_t)b * T + j) * ldkv + (size_t)kvh * HS;
    real *dvj = dv + ((size_t)b * T + j) * ldkv + (size_t)kvh * HS;
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
      const int d = tx + 16 * jj;
      if (d < HS) {
        dkj[d] = scale * dka[i][jj];
        dvj[d] = dva[i][jj];
      }
    }
  }
}

/* Backward, dq: one block per (query tile, query head, sample), the key tiles 0 .. qt in order,
 * each tile's keys in order: dq_i = scale · Σ_j dS_ij k_j in registers. */
template <int BR, int NJ>
__global__ void __launch_bounds__(ATT_THREADS)
flash_backward_dq_kernel(real *dq, const real *dout, const real *q, const real *k, const real *v, int ldq,
                         int ldkv, const real *lse, const real *Dv, int T, int NH, int NKV, int HS, float scale,
                         struct att_drop dr, int b0)
{
  typedef flash_cfg<BR, NJ> C;
  constexpr int W = C::W, LD = C::LD, SL = C::SL, RI = BR / 16;
  extern __shared__ double att_smem[];
  float *Qs = (float *)att_smem, *dOs = Qs + BR * LD, *Ks = dOs + BR * LD, *Vs = Ks + BR * LD; /* BR × LD */
  float *dSs = Vs + BR * LD, *lse_s = dSs + BR * SL, *D_s = lse_s + BR;                     /* BR × SL, BR, BR */
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int qt = blockIdx.x, h = blockIdx.y, b = b0 + (int)blockIdx.z, kvh = h / (NH / NKV), i0 = qt * BR;
  const int ldo = NH * HS;
  const real *kb = k + (size_t)b * T * ldkv + (size_t)kvh * HS, *vb = v + (size_t)b * T * ldkv + (size_t)kvh * HS;
  load_tile<BR, W, LD>(Qs, q + (size_t)b * T * ldq + (size_t)h * HS, ldq, i0, T, HS);
  load_tile<BR, W, LD>(dOs, dout + (size_t)b * T * ldo + (size_t)h * HS, ldo, i0, T, HS);
  if (tid < BR) {
    const int row = i0 + tid;
    lse_s[tid] = row < T ? lse[((size_t)b * NH + h) * T + row] : 0.0f;
    D_s[tid] = row < T ? Dv[((size_t)b * NH + h) * T + row] : 0.0f;
  }
  float dqa[RI][NJ];
#pragma unroll
  for (int i = 0; i < RI; i++)
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) dqa[i][jj] = 0.0f;
  for (int kt = 0; kt <= qt; kt++) {
    const int j0 = kt * BR;
    __syncthreads(); /* the last tile's Ks, dSs read by every thread */
    load_tile<BR, W, LD>(Ks, kb, ldkv, j0, T, HS);
    load_tile<BR, W, LD>(Vs, vb, ldkv, j0, T, HS);
    __syncthreads();
    float a[RI][RI], ds[RI][RI];
    flash_ds<BR, LD>(a, ds, Qs, dOs, Ks, Vs, lse_s, D_s, i0, j0, h, T, HS, scale, dr, tx, ty);
#pragma unroll
    for (int i = 0; i < RI; i++)
#pragma unroll
      for (int jj = 0; jj < RI; jj++) dSs[(ty + 16 * i) * SL + tx + 16 * jj] = ds[i][jj];
    __syncthreads();
    for (int c = 0; c < BR; c++) {
      float pd[RI];
#pragma unroll
      for (int i = 0; i < RI; i++) pd[i] = dSs[(ty + 16 * i) * SL + c];
#pragma unroll
      for (int jj = 0; jj < NJ; jj++) {
        const float kd = Ks[c * LD + tx + 16 * jj];
#pragma unroll
        for (int i = 0; i < RI; i++) dqa[i][jj] += pd[i] * kd;
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RI; i++) {
    const int row = i0 + ty + 16 * i;
    if (row >= T)
      continue;
    real *dqi = dq + ((size_t)b * T + row) * ldq + (size_t)h * HS;
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
      const int d = tx + 16 * jj;
      if (d < HS)
        dqi[d] = scale * dqa[i][jj];
    }
  }
}

extern "C" size_t cuda_attention_scratch_n_elems(void *ctx, int B, int T, int NH, int NKV, int HS)
{
  (void)ctx, (void)NKV, (void)HS; /* D of every row, backward only (ctx may be NULL: a size only) */
  return (size_t)B * NH * T;
}

template <int BR, int NJ>
static void flash_forward(struct cuda_ctx *c, real *out, real *lse, const real *q, const real *k, const real *v,
                          int ldq, int ldkv, const struct attention_dropout *drop, int B, int T, int NH, int NKV,
                          int HS)
{
  typedef flash_cfg<BR, NJ> C;
  if (CUDA_CHECK(c, cudaFuncSetAttribute(flash_forward_kernel<BR, NJ>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)C::fwd_bytes)))
    return;
  const float scale = 1.0f / sqrtf((float)HS);
  const unsigned tiles = (unsigned)((T + BR - 1) / BR);
  per_sample(c, drop, B, [&](const struct att_drop &dr, int b0, int nb) {
    flash_forward_kernel<BR, NJ><<<dim3(tiles, (unsigned)NH, (unsigned)nb), ATT_THREADS, C::fwd_bytes, c->stream>>>(
        out, lse, q, k, v, ldq, ldkv, T, NH, NKV, HS, scale, dr, b0);
  });
}

static void forward_ld(struct cuda_ctx *c, real *out, real *lse, const real *q, const real *k, const real *v,
                       int ldq, int ldkv, const struct attention_dropout *drop, int B, int T, int NH, int NKV, int HS)
{
  if (B == 0 || T == 0 || NH == 0 || HS == 0)
    return;
  switch (flash_cfg_of(c, HS)) {
  case 32: flash_forward<64, 2>(c, out, lse, q, k, v, ldq, ldkv, drop, B, T, NH, NKV, HS); break;
  case 64: flash_forward<64, 4>(c, out, lse, q, k, v, ldq, ldkv, drop, B, T, NH, NKV, HS); break;
  case 128: flash_forward<64, 8>(c, out, lse, q, k, v, ldq, ldkv, drop, B, T, NH, NKV, HS); break;
  case 256: flash_forward<32, 16>(c, out, lse, q, k, v, ldq, ldkv, drop, B, T, NH, NKV, HS); break;
  default: break;
  }
}

extern "C" void cuda_attention_forward(void *ctx, real *out, real *lse, real *scratch, const real *q, const real *k,
                                       const real *v, const struct attention_dropout *drop, int B, int T, int NH,
                                       int NKV, int HS)
{
  (void)scratch;
  forward_ld(cuda_of(ctx), out, lse, q, k, v, NH * HS, NKV * HS, drop, B, T, NH, NKV, HS);
}

extern "C" void cuda_attention_forward_qkv(void *ctx, real *out, real *lse, real *scratch, const real *qkv,
                                           const struct attention_dropout *drop, int B, int T, int NH, int NKV,
                                           int HS)
{
  (void)scratch;
  const int ld = (NH + 2 * NKV) * HS;
  forward_ld(cuda_of(ctx), out, lse, qkv, qkv + (size_t)NH * HS, qkv + (size_t)(NH + NKV) * HS, ld, ld, drop, B, T,
             NH, NKV, HS);
}

template <int BR, int NJ>
static void flash_backward(struct cuda_ctx *c, real *dq, real *dk, real *dv, const real *Dv, const real *dout,
                           const real *q, const real *k, const real *v, int ldq, int ldkv, const real *lse,
                           const struct attention_dropout *drop, int B, int T, int NH, int NKV, int HS)
{
  typedef flash_cfg<BR, NJ> C;
  if (CUDA_CHECK(c, cudaFuncSetAttribute(flash_backward_dkv_kernel<BR, NJ>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::dkv_bytes)) ||
      CUDA_CHECK(c, cudaFuncSetAttribute(flash_backward_dq_kernel<BR, NJ>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::dq_bytes)))
    return;
  const float scale = 1.0f / sqrtf((float)HS);
  const unsigned tiles = (unsigned)((T + BR - 1) / BR);
  /* dk, dv then dq: each output has one writer, and in the fused layout they are disjoint parts
   * of dqkv's rows while q, k, v are read from qkv, so the order is free */
  if (per_sample(c, drop, B, [&](const struct att_drop &dr, int b0, int nb) {
        flash_backward_dkv_kernel<BR, NJ><<<dim3(tiles, (unsigned)NKV, (unsigned)nb), ATT_THREADS, C::dkv_bytes,
                                            c->stream>>>(dk, dv, dout, q, k, v, ldq, ldkv, lse, Dv, T, NH, NKV, HS,
                                                         scale, dr, b0);
      }))
    return;
  per_sample(c, drop, B, [&](const struct att_drop &dr, int b0, int nb) {
    flash_backward_dq_kernel<BR, NJ><<<dim3(tiles, (unsigned)NH, (unsigned)nb), ATT_THREADS, C::dq_bytes, c->stream>>>(
        dq, dout, q, k, v, ldq, ldkv, lse, Dv, T, NH, NKV, HS, scale, dr, b0);
  });
}

static void backward_ld(struct cuda_ctx *c, real *dq, real *dk, real *dv, real *scratch, const real *dout,
                        const real *q, const real *k, const real *v, int ldq, int ldkv, const real *out,
                        const real *lse, const struct attention_dropout *drop, int B, int T, int NH, int NKV, int HS)
{
  if (B == 0 || T == 0 || NH == 0 || HS == 0)
    return;
  const int cfg = flash_cfg_of(c, HS);
  if (!cfg)
    return;
  const size_t rows = (size_t)B * NH * T;
  attention_rowdot_kernel<<<cuda_blocks(rows, ATT_WARPS), ATT_THREADS, 0, c->stream>>>(scratch, dout, out, T, NH, HS,
                                                                                     rows);
  if (CUDA_LAUNCHED(c))
    return;
  switch (cfg) {
  case 32: flash_backward<64, 2>(c, dq, dk, dv, scratch, dout, q, k, v, ldq, ldkv, lse, drop, B, T, NH, NKV, HS); break;
  case 64: flash_backward<64, 4>(c, dq, dk, dv, scratch, dout, q, k, v, ldq, ldkv, lse, drop, B, T, NH, NKV, HS); break;
  case 128: flash_backward<64, 8>(c, dq, dk, dv, scratch, dout, q, k, v, ldq, ldkv, lse, drop, B, T, NH, NKV, HS); break;
  default: flash_backward<32, 16>(c, dq, dk, dv, scratch, dout, q, k, v, ldq, ldkv, lse, drop, B, T, NH, NKV, HS); break;
  }
}

extern "C" void cuda_attention_backward(void *ctx, real *dq, real *dk, real *dv, real *scratch, const real *dout,
                                        const real *q, const real *k, const real *v, const real *out,
                                        const real *lse, const struct attention_dropout *drop, int B, int T, int NH,
                                        int NKV, int HS)
{
  backward_ld(cuda_of(ctx), dq, dk, dv, scratch, dout, q, k, v, NH * HS, NKV * HS, out, lse, drop, B, T, NH, NKV,
              HS);
}

extern "C" void cuda_attention_backward_qkv(void *ctx, real *dqkv, real *scratch, const real *dout, const real *qkv,
                                            const real *out, const real *lse, const struct attention_dropout *drop,
                                            int B, int T, int NH, int NKV, int HS)
{
  const int ld = (NH + 2 * NKV) * HS;
  const size_t k0 = (size_t)NH * HS, v0 = (size_t)(NH + NKV) * HS;
  backward_ld(cuda_of(ctx), dqkv, dqkv + k0, dqkv + v0, scratch, dout, qkv, qkv + k0, qkv + v0, ld, ld, out, lse,
              drop, B, T, NH, NKV, HS);
}
