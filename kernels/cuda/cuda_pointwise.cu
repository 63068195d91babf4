/* The CUDA backend's element-wise, RMSNorm, embedding and optimizer entries (ops.h; the CPU
 * reference is kernels/cpu/pointwise.c, dense.c, optim.c, bf16_ops.c).
 *
 * - Element-wise entries: a grid-stride loop over the logical index i (size_t), 256 threads a
 *   block. Every element's result depends on its inputs alone, never on the launch shape.
 * - Arithmetic that the CPU writes as separate multiplies and adds is written with __fmul_rn,
 *   __fadd_rn, __fsub_rn, __fdiv_rn, __fsqrt_rn: nvcc may not contract those into an FMA, so
 *   AdamW, scale, residual, dropout and RMSNorm's products give the CPU's bits (up to denormals:
 *   the CPU runs with FTZ/DAZ after kernels_init_cpu, the GPU flushes only under -ftz=true).
 *   SwiGLU uses expf (CUDA: within 2 ulp), so it differs from the CPU by exp's rounding.
 * - Reductions never use floating-point atomics: RMSNorm's row sums are one block per row, each
 *   thread summing a fixed strided set of columns in double, then a fixed shared-memory tree;
 *   RMSNorm's dweight is a blocked sum over rows in double (blocks of kDwRows rows, each a
 *   fixed lane order, then the blocks in order: its bits depend on BT and C only, not the
 *   CPU's, whose one sequential sum per column would leave a 4096-column weight 16 blocks of
 *   work); dwte (embedding) is one thread per (column, token class) running over the tokens in
 *   order, the CPU's order, so bit-identical to the CPU's; sumsq is a fixed two-pass reduction
 *   in double (kSumsqParts parts, a fixed tree in each).
 * - Row-form kernels (SwiGLU's [gate | up] rows, the embedding's rows) index by (row, column)
 *   on a 2-D grid (cuda_reduce.cuh's ROW_LOOP), never by dividing a 64-bit element index.
 * - The dropout mask is philox_uniform of the element's logical index (philox.h, the same code
 *   on host and device): the CPU's mask bit for bit. */
#include "cuda_backend.h"
#include "cuda_reduce.cuh"

#include <math.h>

#include "../philox.h"

/* Double sums are written with __dadd_rn / __dmul_rn too: nvcc would contract `acc += a * b`
 * into a DFMA, and the CPU (built without FMA for these files) rounds the product first. */

namespace {

constexpr unsigned kThreads = 256;     /* element-wise blocks */
constexpr unsigned kRowThreads = 256;  /* one block per row (RMSNorm); a power of two */
constexpr unsigned kSumsqParts = 1024; /* sumsq's first pass: parts, each one block */
constexpr unsigned kSumsqThreads = 256;
constexpr int kEncClasses = 32; /* encoder_backward: token classes (row % 32), one thread each */
constexpr int kDwRows = 128;    /* RMSNorm dweight: rows per partial sum (fixes the order) */
constexpr int kDwCols = 32;     /* its block: 32 columns (a warp reads 128 contiguous bytes) ... */
constexpr int kDwLanes = 8;     /* ... by 8 lanes, lane k taking the block's rows ≡ k mod 8 */

/* Blocks for a grid-stride loop over n elements: enough to fill the device, never more than
 * needed (the loop covers any n). */
inline unsigned stride_blocks(size_t n)
{
  const unsigned b = cuda_blocks(n, kThreads);
  return b > 65535u * 4u ? 65535u * 4u : b;
}

#define GRID_STRIDE(i, n) \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (size_t)gridDim.x * blockDim.x)

/* bf16_from_float (bf16.h) on the device: nearest, ties to even; NaN quiet with its sign. */
__device__ inline bf16 to_bf16(float f)
{
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (bf16)((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16)(u >> 16);
}

__device__ inline void store(real *p, float x) { *p = x; }
__device__ inline void store(bf16 *p, float x) { *p = to_bf16(x); }

/* ---- element-wise ---- */

__global__ void add_kernel(real *out, const real *a, const real *b, size_t n)
{
  GRID_STRIDE(i, n) out[i] = __fadd_rn(a[i], b[i]);
}

__global__ void mul_kernel(real *out, const real *a, const real *b, size_t n)
{
  GRID_STRIDE(i, n) out[i] = __fmul_rn(a[i], b[i]);
}

__global__ void round_bf16_kernel(bf16 *dst, const real *src, size_t n)
{
  GRID_STRIDE(i, n) dst[i] = to_bf16(src[i]);
}

/* bf16_to_float (bf16.h): the 16 bits as the high half of an fp32, exact. */
__device__ inline float from_bf16(bf16 b) { return __uint_as_float((uint32_t)b << 16); }

__global__ void widen_bf16_kernel(real *dst, const bf16 *src, size_t n)
{
  GRID_STRIDE(i, n) dst[i] = from_bf16(src[i]);
}

__global__ void accumulate_bf16_kernel(bf16 *acc, const bf16 *x, size_t n)
{
  GRID_STRIDE(i, n) acc[i] = to_bf16(from_bf16(acc[i]) + from_bf16(x[i]));
}

__global__ void dropout_mask_kernel(real *mask, size_t n, float p, real keep_scale, uint64_t seed,
                                    uint32_t c1, uint32_t c2, uint32_t c3, uint64_t first_elem)
{
  GRID_STRIDE(i, n)
    mask[i] = philox_uniform(seed, c1, c2, c3, first_elem + i) < p ? 0.0f : keep_scale;
}

/* silu(g) · u as the CPU's scalar loop: g / (1 + exp(−g)) · u. */
__device__ inline float swiglu_value(float g, float u)
{
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

/* s = sigmoid(g); dgate = d · u · s · (1 + g (1 − s)), dup = d · g · s (left to right). */
__device__ inline void swiglu_grad(float d, float g, float u, float *dg, float *du)
{
  const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g)));
  const float t = __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s)));
  *dg = __fmul_rn(__fmul_rn(__fmul_rn(d, u), s), t);
  *du = __fmul_rn(__fmul_rn(d, g), s);
}

template <typename O>
__global__ void swiglu_forward_kernel(O *out, const real *gate, const real *up, size_t n)
{
  GRID_STRIDE(i, n) store(out + i, swiglu_value(gate[i], up[i]));
}

__global__ void swiglu_backward_kernel(real *dgate, real *dup, const real *dout, const real *gate,
                                       const real *up, size_t n)
{
  GRID_STRIDE(i, n)
  {
    float dg, du;
    swiglu_grad(dout[i], gate[i], up[i], &dg, &du);
    dup[i] = du;
    dgate[i] = dg;
  }
}

/* gu (rows, 2F) = [gate | up] per row; element (r, c) of the (rows, F) output. */
template <typename O>
__global__ void swiglu_forward_rows_kernel(O *out, const real *gu, int rows, int F)
{
  ROW_LOOP(r, c, rows, F)
  {
    const real *g = gu + (size_t)r * 2 * F;
    store(out + (size_t)r * F + c, swiglu_value(g[c], g[F + c]));
  }
}

__global__ void swiglu_backward_rows_kernel(real *dgu, const real *dout, const real *gu, int rows,
                                            int F)
{
  ROW_LOOP(r, c, rows, F)
  {
    const real *g = gu + (size_t)r * 2 * F;
    float dg, du;
    swiglu_grad(dout[(size_t)r * F + c], g[c], g[F + c], &dg, &du);
    real *d = dgu + (size_t)r * 2 * F;
    d[c] = dg;
    d[F + c] = du;
  }
}

/* ---- AdamW: optim.c's scalar loop operation by operation ---- */

struct adamw_consts {
  float grad_scale, decay, m_weight, v_decay, v_weight, step_size, bias_correction2_sqrt, eps;
};

__global__ void adamw_kernel(real *param, bf16 *param_bf16, const real *grad, real *m, real *v,
                             size_t n, adamw_consts k)
{
  GRID_STRIDE(i, n)
  {
    const float g = __fmul_rn(grad[i], k.grad_scale);
    const float p = __fmul_rn(param[i], k.decay);
    const float m0 = m[i], v0 = v[i];
    const float mi = __fadd_rn(m0, __fmul_rn(k.m_weight, __fsub_rn(g, m0)));
    const float vi = __fadd_rn(__fmul_rn(v0, k.v_decay), __fmul_rn(__fmul_rn(k.v_weight, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bias_correction2_sqrt), k.eps);
    const float np = __fsub_rn(p, __fdiv_rn(__fmul_rn(k.step_size, mi), denom));
    param[i] = np;
    m[i] = mi;
    v[i] = vi;
    if (param_bf16)
      param_bf16[i] = to_bf16(np);
  }
}

/* ---- sums ---- */

/* Sums sh[0 .. kN) into sh[0] by a fixed tree (the same pairs for every launch); all threads of
 * the block call it. */
template <unsigned kN>
__device__ inline void tree_sum(double *sh)
{
  __syncthreads();
  for (unsigned w = kN / 2; w > 0; w /= 2) {
    if (threadIdx.x < w)
      sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
}

/* Part b: elements [b·chunk, min((b + 1)·chunk, n)), thread t the ones ≡ t mod kSumsqThreads. */
__global__ void sumsq_parts_kernel(double *parts, const real *x, size_t n, size_t chunk)
{
  __shared__ double sh[kSumsqThreads];
  const size_t lo = (size_t)blockIdx.x * chunk;
  const size_t hi = lo + chunk < n ? lo + chunk : n;
  double s = 0.0;
  for (size_t i = lo + threadIdx.x; i < hi; i += kSumsqThreads) {
    const double xi = x[i];
    s = __dadd_rn(s, __dmul_rn(xi, xi));
  }
  sh[threadIdx.x] = s;
  tree_sum<kSumsqThreads>(sh);
  if (threadIdx.x == 0)
    parts[blockIdx.x] = sh[0];
}

/* One block of kSumsqThreads: the parts, each thread a fixed strided set, then the tree. */
__global__ void sumsq_total_kernel(double *total, const double *parts)
{
  __shared__ double sh[kSumsqThreads];
  double s = 0.0;
  for (unsigned j = threadIdx.x; j < kSumsqParts; j += kSumsqThreads) s += parts[j];
  sh[threadIdx.x] = s;
  tree_sum<kSumsqThreads>(sh);
  if (threadIdx.x == 0)
    *total = sh[0];
}

/* ---- RMSNorm ---- */

/* One block per row: rstd = 1 / sqrt(Σx²/C + eps), Σ in double (dense.c's row_rstd);
 * out = x · rstd · weight. out may equal inp: the sum reads the row before the barrier, then
 * each thread reads and writes only its own columns. */
template <typename O>
__global__ void rmsnorm_forward_kernel(O *out, real *rstd, const real *inp, const real *weight,
                                       int C, real eps)
{
  __shared__ double sh[kRowThreads];
  const size_t row = blockIdx.x;
  const real *x = inp + row * (size_t)C;
  double s = 0.0;
  for (int c = (int)threadIdx.x; c < C; c += kRowThreads) {
    const double xc = x[c];
    s = __dadd_rn(s, __dmul_rn(xc, xc));
  }
  sh[threadIdx.x] = s;
  tree_sum<kRowThreads>(sh);
  const real r = (real)(1.0 / sqrt(sh[0] / C + (double)eps));
  O *o = out + row * (size_t)C;
  for (int c = (int)threadIdx.x; c < C; c += kRowThreads)
    store(o + c, __fmul_rn(__fmul_rn(x[c], r), weight[c]));
  if (threadIdx.x == 0)
    rstd[row] = r;
}

/* dweight[c] += (real) Σ_bt (double) dout · x · rstd (each term as the CPU rounds it), in two
 * passes. First: block (x, y) sums rows [y·kDwRows, (y + 1)·kDwRows) of columns
 * [x·kDwCols, (x + 1)·kDwCols): lane k its rows ≡ k mod kDwLanes in row order, then the lanes
 * 0, 1, ... in order, into parts[y·C + c]. Second: parts[0..n_parts) of column c in order, then
 * one float add. rmsnorm_dweight_model in tests/cuda/test_cuda_pointwise.c is this order on the
 * host. */
__global__ void rmsnorm_dweight_parts_kernel(double *parts, const real *dout, const real *inp,
                                             const real *rstd, int BT, int C)
{
  __shared__ double sh[kDwLanes][kDwCols];
  const int c = (int)(blockIdx.x * kDwCols + threadIdx.x);
  const int r0 = (int)blockIdx.y * kDwRows;
  const int r1 = r0 + kDwRows < BT ? r0 + kDwRows : BT;
  double acc = 0.0;
  if (c < C)
    for (int bt = r0 + (int)threadIdx.y; bt < r1; bt += kDwLanes) {
      const size_t i = (size_t)bt * C + c;
      acc = __dadd_rn(acc, __dmul_rn(__dmul_rn((double)dout[i], (double)inp[i]), (double)rstd[bt]));
    }
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double s = sh[0][threadIdx.x];
    for (int k = 1; k < kDwLanes; k++) s = __dadd_rn(s, sh[k][threadIdx.x]);
    parts[(size_t)blockIdx.y * C + c] = s;
  }
}

__global__ void rmsnorm_dweight_total_kernel(real *dweight, const double *parts, int n_parts, int C)
{
  const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= C)
    return;
  double s = parts[c];
  for (int p = 1; p < n_parts; p++) s = __dadd_rn(s, parts[(size_t)p * C + c]);
  dweight[c] = __fadd_rn(dweight[c], (real)s);
}

/* dx = r · w · dy − (r³ / C) x Σ_c dy g x (dense.c). dinp may equal dout: the dot reads the
 * row before the barrier, then each thread reads and writes only its own columns. */
__global__ void rmsnorm_dinp_kernel(real *dinp, const real *dout, const real *inp,
                                    const real *weight, const real *rstd, int C)
{
  __shared__ double sh[kRowThreads];
  const size_t row = blockIdx.x;
  const real *x = inp + row * (size_t)C, *d = dout + row * (size_t)C;
  double s = 0.0;
  for (int c = (int)threadIdx.x; c < C; c += kRowThreads)
    s = __dadd_rn(s, __dmul_rn(__dmul_rn((double)d[c], (double)weight[c]), (double)x[c]));
  sh[threadIdx.x] = s;
  tree_sum<kRowThreads>(sh);
  const double r = rstd[row];
  const real k = (real)(r * r * r * sh[0] / C);
  const real rf = (real)r;
  real *dx = dinp + row * (size_t)C;
  for (int c = (int)threadIdx.x; c < C; c += kRowThreads)
    dx[c] = __fsub_rn(__fmul_rn(__fmul_rn(rf, weight[c]), d[c]), __fmul_rn(k, x[c]));
}

/* ---- embedding ---- */

/* out[bt, c] = wte[tokens[bt] − v0, c] when that row is in [0, Vl), else 0 (v0 0, Vl INT_MAX:
 * the whole table). */
__global__ void encoder_forward_kernel(real *out, const int *tokens, const real *wte, int v0, int Vl,
                                       int BT, int C)
{
  ROW_LOOP(bt, c, BT, C)
  {
    const int row = tokens[bt] - v0;
    out[(size_t)bt * C + c] = row >= 0 && row < Vl ? wte[(size_t)row * C + c] : 0.0f;
  }
}

/* encoder_forward_kernel on the bf16 copy of the table, each element widened (exact). */
__global__ void encoder_forward_bf16_kernel(real *out, const int *tokens, const bf16 *wte, int v0, int Vl,
                                            int BT, int C)
{
  ROW_LOOP(bt, c, BT, C)
  {
    const int row = tokens[bt] - v0;
    out[(size_t)bt * C + c] = row >= 0 && row < Vl ? from_bf16(wte[(size_t)row * C + c]) : 0.0f;
  }
}

/* dwte[row, c] += dout[bt, c] for row = tokens[bt] − v0 in [0, Vl), bt in order. Thread
 * (c, k) owns the rows ≡ k mod kEncClasses of column c, so every element of dwte has one owner
 * that adds its tokens in bt order (the CPU's float adds, the same bits), and a warp (32
 * consecutive columns, one class) reads and writes 128 contiguous bytes and branches alike. */
__global__ void encoder_backward_kernel(real *dwte, const real *dout, const int *tokens, int v0,
                                        int Vl, int BT, int C)
{
  const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  const int k = (int)(blockIdx.y * blockDim.y + threadIdx.y);
  if (c >= C || k >= kEncClasses)
    return;
  for (int bt = 0; bt < BT; bt++) {
    const int row = tokens[bt] - v0;
    if (row < 0 || row >= Vl || row % kEncClasses != k)
      continue;
    real *p = dwte + (size_t)row * C + c;
    *p = __fadd_rn(*p, dout[(size_t)bt * C + c]);
  }
}

void encoder_forward_any(void *ctx, real *out, const int *tokens, const real *wte, int v0, int Vl,
                         int BT, int C)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT <= 0 || C <= 0)
    return;
  encoder_forward_kernel<<<row_grid(BT, C, kThreads), kThreads, 0, c->stream>>>(out, tokens, wte,
                                                                               v0, Vl, BT, C);
  CUDA_LAUNCHED(c);
}

void encoder_backward_any(void *ctx, real *dwte, const real *dout, const int *tokens, int v0,
                          int Vl, int BT, int C)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT <= 0 || C <= 0)
    return;
  const dim3 block(32, 8);
  const dim3 grid((unsigned)((C + 31) / 32), (unsigned)((kEncClasses + 7) / 8));
  encoder_backward_kernel<<<grid, block, 0, c->stream>>>(dwte, dout, tokens, v0, Vl, BT, C);
  CUDA_LAUNCHED(c);
}

template <typename O>
void rmsnorm_forward_any(void *ctx, O *out, real *rstd, const real *inp, const real *weight,
                         int BT, int C, real eps)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT <= 0)
    return;
  rmsnorm_forward_kernel<O><<<(unsigned)BT, kRowThreads, 0, c->stream>>>(out, rstd, inp, weight,
                                                                         C, eps);
  CUDA_LAUNCHED(c);
}

/* optim.c's constants: the scalars in double, then rounded to real. */
adamw_consts adamw_make(double lr, double beta1, double beta2, double eps, double weight_decay,
                        int t, real grad_scale)
{
  const double bias_correction1 = 1.0 - pow(beta1, t);
  const double bias_correction2 = 1.0 - pow(beta2, t);
  adamw_consts k;
  k.grad_scale = grad_scale;
  k.decay = (real)(1.0 - lr * weight_decay);
  k.m_weight = (real)(1.0 - beta1);
  k.v_decay = (real)beta2;
  k.v_weight = (real)(1.0 - beta2);
  k.step_size = (real)(lr / bias_correction1);
  k.bias_correction2_sqrt = (real)sqrt(bias_correction2);
  k.eps = (real)eps;
  return k;
}

void adamw_any(void *ctx, real *param, bf16 *param_bf16, const real *grad, real *m, real *v,
               size_t n, double lr, double beta1, double beta2, double eps, double weight_decay,
               int t, real grad_scale)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n == 0)
    return;
  const adamw_consts k = adamw_make(lr, beta1, beta2, eps, weight_decay, t, grad_scale);
  adamw_kernel<<<stride_blocks(n), kThreads, 0, c->stream>>>(param, param_bf16, grad, m, v, n, k);
  CUDA_LAUNCHED(c);
}

} // namespace

extern "C" {

void cuda_vec_add(void *ctx, real *out, const real *a, const real *b, size_t n_elems)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_elems == 0)
    return;
  add_kernel<<<stride_blocks(n_elems), kThreads, 0, c->stream>>>(out, a, b, n_elems);
  CUDA_LAUNCHED(c);
}

void cuda_swiglu_forward(void *ctx, real *out, const real *gate, const real *up, size_t n_elems)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_elems == 0)
    return;
  swiglu_forward_kernel<real><<<stride_blocks(n_elems), kThreads, 0, c->stream>>>(out, gate, up,
                                                                                  n_elems);
  CUDA_LAUNCHED(c);
}

void cuda_swiglu_forward_bf16(void *ctx, bf16 *out, const real *gate, const real *up,
                              size_t n_elems)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_elems == 0)
    return;
  swiglu_forward_kernel<bf16><<<stride_blocks(n_elems), kThreads, 0, c->stream>>>(out, gate, up,
                                                                                  n_elems);
  CUDA_LAUNCHED(c);
}

void cuda_swiglu_backward(void *ctx, real *dgate, real *dup, const real *dout, const real *gate,
                          const real *up, size_t n_elems)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_elems == 0)
    return;
  swiglu_backward_kernel<<<stride_blocks(n_elems), kThreads, 0, c->stream>>>(dgate, dup, dout,
                                                                             gate, up, n_elems);
  CUDA_LAUNCHED(c);
}

void cuda_swiglu_forward_rows(void *ctx, real *out, const real *gu, int rows, int F)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (rows <= 0 || F <= 0)
    return;
  swiglu_forward_rows_kernel<real><<<row_grid(rows, F, kThreads), kThreads, 0, c->stream>>>(
      out, gu, rows, F);
  CUDA_LAUNCHED(c);
}

void cuda_swiglu_forward_rows_bf16(void *ctx, bf16 *out, const real *gu, int rows, int F)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (rows <= 0 || F <= 0)
    return;
  swiglu_forward_rows_kernel<bf16><<<row_grid(rows, F, kThreads), kThreads, 0, c->stream>>>(
      out, gu, rows, F);
  CUDA_LAUNCHED(c);
}

void cuda_swiglu_backward_rows(void *ctx, real *dgu, const real *dout, const real *gu, int rows,
                               int F)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (rows <= 0 || F <= 0)
    return;
  swiglu_backward_rows_kernel<<<row_grid(rows, F, kThreads), kThreads, 0, c->stream>>>(
      dgu, dout, gu, rows, F);
  CUDA_LAUNCHED(c);
}

void cuda_dropout_mask(void *ctx, real *mask, size_t n_elems, float p, uint64_t seed, uint32_t c1,
                       uint32_t c2, uint32_t c3, uint64_t first_elem)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_elems == 0)
    return;
  /* pointwise.c's keep scale, computed here on the host the same way */
  const real keep_scale = p < 1.0f ? (real)1 / (1 - (real)p) : 0;
  dropout_mask_kernel<<<stride_blocks(n_elems), kThreads, 0, c->stream>>>(
      mask, n_elems, p, keep_scale, seed, c1, c2, c3, first_elem);
  CUDA_LAUNCHED(c);
}

void cuda_dropout_forward(void *ctx, real *out, const real *inp, const real *mask, size_t n_elems)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_elems == 0)
    return;
  mul_kernel<<<stride_blocks(n_elems), kThreads, 0, c->stream>>>(out, inp, mask, n_elems);
  CUDA_LAUNCHED(c);
}

void cuda_dropout_backward(void *ctx, real *dinp, const real *dout, const real *mask,
                           size_t n_elems)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_elems == 0)
    return;
  mul_kernel<<<stride_blocks(n_elems), kThreads, 0, c->stream>>>(dinp, dout, mask, n_elems);
  CUDA_LAUNCHED(c);
}

/* Σ x² in double: kSumsqParts contiguous parts (one block each, a fixed tree inside), then one
 * block over the parts: the same bits for any device, not the CPU's order (which is itself
 * path-dependent: vec.h). The only entry here that allocates: kSumsqParts + 1 doubles of
 * scratch, cudaMallocAsync / cudaFreeAsync on the stream (the context has no workspace), and
 * the only one that synchronises, to return the value. NaN when a call fails (recorded). */
double cuda_sumsq(void *ctx, const real *x, size_t n_elems)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_elems == 0)
    return 0.0;
  double *parts = NULL;
  if (CUDA_CHECK(c, cudaMallocAsync((void **)&parts, (kSumsqParts + 1) * sizeof(double), c->stream)))
    return NAN;
  const size_t chunk = (n_elems + kSumsqParts - 1) / kSumsqParts;
  double total = NAN;
  sumsq_parts_kernel<<<kSumsqParts, kSumsqThreads, 0, c->stream>>>(parts, x, n_elems, chunk);
  int failed = CUDA_LAUNCHED(c);
  if (!failed) {
    sumsq_total_kernel<<<1, kSumsqThreads, 0, c->stream>>>(parts + kSumsqParts, parts);
    failed = CUDA_LAUNCHED(c);
  }
  if (!failed)
    failed = CUDA_CHECK(c, cudaMemcpyAsync(&total, parts + kSumsqParts, sizeof total,
                                           cudaMemcpyDeviceToHost, c->stream));
  CUDA_CHECK(c, cudaFreeAsync(parts, c->stream));
  if (CUDA_CHECK(c, cudaStreamSynchronize(c->stream)) || failed)
    return NAN;
  return total;
}

void cuda_adamw_update(void *ctx, real *param, const real *grad, real *m, real *v, size_t n_elems,
                       double lr, double beta1, double beta2, double eps, double weight_decay,
                       int t, real grad_scale)
{
  adamw_any(ctx, param, NULL, grad, m, v, n_elems, lr, beta1, beta2, eps, weight_decay, t,
            grad_scale);
}

void cuda_adamw_update_bf16(void *ctx, real *param, bf16 *param_bf16, const real *grad, real *m,
                            real *v, size_t n_elems, double lr, double beta1, double beta2,
                            double eps, double weight_decay, int t, real grad_scale)
{
  adamw_any(ctx, param, param_bf16, grad, m, v, n_elems, lr, beta1, beta2, eps, weight_decay, t,
            grad_scale);
}

void cuda_round_bf16(void *ctx, bf16 *dst, const real *src, size_t n_elems)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_elems == 0)
    return;
  round_bf16_kernel<<<stride_blocks(n_elems), kThreads, 0, c->stream>>>(dst, src, n_elems);
  CUDA_LAUNCHED(c);
}

void cuda_widen_bf16(void *ctx, real *dst, const bf16 *src, size_t n_elems)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_elems == 0)
    return;
  widen_bf16_kernel<<<stride_blocks(n_elems), kThreads, 0, c->stream>>>(dst, src, n_elems);
  CUDA_LAUNCHED(c);
}

void cuda_accumulate_bf16(void *ctx, bf16 *acc, const bf16 *x, size_t n_elems)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_elems == 0)
    return;
  accumulate_bf16_kernel<<<stride_blocks(n_elems), kThreads, 0, c->stream>>>(acc, x, n_elems);
  CUDA_LAUNCHED(c);
}

void cuda_encoder_forward_bf16(void *ctx, real *out, const int *tokens, const bf16 *wte, int v0, int Vl,
                               int BT, int C)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT <= 0 || C <= 0)
    return;
  encoder_forward_bf16_kernel<<<row_grid(BT, C, kThreads), kThreads, 0, c->stream>>>(out, tokens, wte, v0, Vl,
                                                                                    BT, C);
  CUDA_LAUNCHED(c);
}

void cuda_rmsnorm_forward(void *ctx, real *out, real *rstd, const real *inp, const real *weight,
                          int BT, int C, real eps)
{
  rmsnorm_forward_any<real>(ctx, out, rstd, inp, weight, BT, C, eps);
}

void cuda_rmsnorm_forward_bf16(void *ctx, bf16 *out, real *rstd, const real *inp,
                               const real *weight, int BT, int C, real eps)
{
  rmsnorm_forward_any<bf16>(ctx, out, rstd, inp, weight, BT, C, eps);
}

/* dweight first (its own kernels, before dinp on the stream): dinp may overwrite dout. The
 * partial sums, ceil(BT / kDwRows) · C doubles, are stream-ordered scratch (cudaMallocAsync, as
 * sumsq's: the context keeps no workspace), freed on the stream after the second pass. */
void cuda_rmsnorm_backward(void *ctx, real *dinp, real *dweight, const real *dout, const real *inp,
                           const real *weight, const real *rstd, int BT, int C)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT <= 0 || C <= 0)
    return;
  const int n_parts = (BT + kDwRows - 1) / kDwRows;
  if (n_parts > 65535) { /* the grid's y limit: 8.4M rows */
    cuda_record(c, __FILE__, __LINE__, "cuda_rmsnorm_backward", "BT over 65535 · 128 rows");
    return;
  }
  double *parts = NULL;
  if (CUDA_CHECK(c, cudaMallocAsync((void **)&parts, (size_t)n_parts * C * sizeof(double), c->stream)))
    return;
  const dim3 block(kDwCols, kDwLanes), grid((unsigned)((C + kDwCols - 1) / kDwCols), (unsigned)n_parts);
  rmsnorm_dweight_parts_kernel<<<grid, block, 0, c->stream>>>(parts, dout, inp, rstd, BT, C);
  int failed = CUDA_LAUNCHED(c);
  if (!failed) {
    rmsnorm_dweight_total_kernel<<<cuda_blocks((size_t)C, kThreads), kThreads, 0, c->stream>>>(
        dweight, parts, n_parts, C);
    failed = CUDA_LAUNCHED(c);
  }
  CUDA_CHECK(c, cudaFreeAsync(parts, c->stream));
  if (failed)
    return;
  rmsnorm_dinp_kernel<<<(unsigned)BT, kRowThreads, 0, c->stream>>>(dinp, dout, inp, weight, rstd,
                                                                   C);
  CUDA_LAUNCHED(c);
}

void cuda_encoder_forward(void *ctx, real *out, const int *tokens, const real *wte, int BT, int C)
{
  encoder_forward_any(ctx, out, tokens, wte, 0, 0x7fffffff, BT, C);
}

void cuda_encoder_forward_shard(void *ctx, real *out, const int *tokens, const real *wte, int v0,
                                int Vl, int BT, int C)
{
  encoder_forward_any(ctx, out, tokens, wte, v0, Vl, BT, C);
}

void cuda_encoder_backward(void *ctx, real *dwte, const real *dout, const int *tokens, int BT, int C)
{
  encoder_backward_any(ctx, dwte, dout, tokens, 0, 0x7fffffff, BT, C);
}

void cuda_encoder_backward_shard(void *ctx, real *dwte, const real *dout, const int *tokens, int v0,
                                 int Vl, int BT, int C)
{
  encoder_backward_any(ctx, dwte, dout, tokens, v0, Vl, BT, C);
}

} // extern "C"
