/* The CUDA backend's losses and mixture-of-experts entries (kernels/ops.h; the CPU reference is
 * kernels/cpu/loss.c and kernels/cpu/moe.c).
 *
 * Determinism. No floating-point atomics anywhere. Every reduction runs in an order fixed by the
 * code, never by the launch: a row reduction is one block of a compile-time size (CE_THREADS)
 * whose threads take a fixed stride of columns and then meet in a fixed shared-memory tree; the
 * MoE kernels whose sums are short (router, aux loss, router backward) run them sequentially in
 * one thread, in the CPU's order. The routing works on integers only (exact in any order).
 *
 * Arithmetic. As the CPU: the softmax's exp(l − max) in fp32 (expf, ≤ 2 ulp on the device, the
 * CPU's ≤ 1 ulp), Σ in double, the losses' log in double; float products and sums that the CPU
 * does as separate roundings use __fmul_rn / __fadd_rn so that nvcc does not contract them into
 * an FMA (the CPU kernels build with -ffp-contract=off). The whole-vocabulary cross-entropy reads
 * a row twice, not three times: its first pass keeps an online max and Σ (each thread's Σ
 * rescaled in double when its max grows), so Σ's terms are exp(l − a running max) rather than
 * the CPU's exp(l − the row's max): another rounding of the exp's argument (see the test's bound).
 * Element kernels over (rows, columns) index on a 2-D grid (ROW_LOOP), no 64-bit division. 
 *
 * Nothing here allocates or synchronises: moe_route keeps its work in slot and counts (device
 * memory, as ops.h says: no host-visible output), moe_router_backward its group counts in the
 * dlogits row of each group's first token, as the CPU does. */
#include <math.h>

#include "cuda_backend.h"
#include "cuda_reduce.cuh"
#include "../moe_router.h"

#define CE_THREADS 256 /* the row reductions' block: fixes their order */
#define EW_THREADS 256 /* elementwise kernels (order-free) */
#define ROUTE_THREADS 256

/* ---- row reductions (blockDim.x == CE_THREADS; cuda_reduce.cuh) ---- */

/* Max of the first n of l; −inf for n 0 (max is exact: any order gives the same bits). NaN is
 * not propagated the CPU's way (l > max ? l : max); logits are finite. */
__device__ static float row_max(const float *l, int n, float *sh)
{
  float m = -INFINITY;
  for (int i = threadIdx.x; i < n; i += CE_THREADS) m = fmaxf(m, l[i]);
  return block_max<CE_THREADS>(m, sh);
}

/* ---- cross-entropy ---- */

/* One block per row, two passes over it. First: each thread's running max m and Σ exp(l − m)
 * in double (Σ times exp(m − l) in double when l raises m: rare, about ln(V / CE_THREADS)
 * times a thread), then the block's max and Σ of the threads' Σ · exp(m_t − max) by the fixed
 * trees. Second: p = exp(l − max) · (1/Σ), the CPU's element. p may equal l: the target's logit
 * is read before the first barrier, and after it every thread reads and writes only its own
 * columns. */
__global__ static void ce_forward_kernel(float *losses, float *probs, const float *logits,
                                         const int *targets, int V, int Vp)
{
  __shared__ float shf[CE_THREADS];
  __shared__ double shd[CE_THREADS];
  const size_t bt = blockIdx.x;
  const float *l = logits + bt * Vp;
  float *p = probs + bt * Vp;
  const int target = targets[bt];
  const float target_logit = target >= 0 ? l[target] : 0.0f;
  float m = -INFINITY;
  double part = 0.0;
  for (int i = threadIdx.x; i < V; i += CE_THREADS) {
    const float li = l[i];
    if (li > m) {
      part = m == -INFINITY ? 0.0 : part * exp((double)m - (double)li);
      m = li;
    }
    if (m != -INFINITY) /* a −inf logit before any finite one adds exp(−inf) = 0, as the CPU's */
      part += expf(li - m);
  }
  const float max = block_max<CE_THREADS>(m, shf); /* its barriers order every read of l[target] first */
  const double sum =
      block_sum<CE_THREADS>(m == -INFINITY ? 0.0 : part * exp((double)m - (double)max), shd);
  const float inv_sum = (float)(1.0 / sum);
  for (int i = threadIdx.x; i < V; i += CE_THREADS) p[i] = __fmul_rn(expf(l[i] - max), inv_sum);
  for (int i = V + threadIdx.x; i < Vp; i += CE_THREADS) p[i] = 0.0f;
  if (threadIdx.x == 0)
    losses[bt] = target >= 0 ? (float)(log(sum) - ((double)target_logit - max)) : 0.0f;
}

/* d = (p − onehot(t)) · scale on the first Vvalid columns, 0 after them and in rows without a
 * target; elementwise (d may equal p). Also the shard's backward (t = target − v0). */
__global__ static void ce_backward_kernel(float *dlogits, const float *probs, const int *targets,
                                          int v0, float scale, int BT, int Vvalid, int Vl)
{
  ROW_LOOP(bt, i, BT, Vl)
  {
    const size_t idx = (size_t)bt * Vl + i;
    const int target = targets[bt];
    float d = 0.0f;
    if (target >= 0 && i < Vvalid)
      d = __fmul_rn(__fsub_rn(probs[idx], i == target - v0 ? 1.0f : 0.0f), scale);
    dlogits[idx] = d;
  }
}

/* Elementwise grids are grid-stride loops: capped so a huge tensor does not ask for 2^31 blocks. */
static unsigned ew_blocks(size_t n)
{
  const unsigned b = cuda_blocks(n, EW_THREADS);
  return b > (1u << 20) ? (1u << 20) : b;
}

extern "C" void cuda_crossentropy_forward(void *ctx, real *losses, real *probs, const real *logits,
                                          const int *targets, int BT, int V, int Vp)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT <= 0) return;
  ce_forward_kernel<<<(unsigned)BT, CE_THREADS, 0, c->stream>>>(losses, probs, logits, targets, V, Vp);
  CUDA_LAUNCHED(c);
}

extern "C" void cuda_crossentropy_backward(void *ctx, real *dlogits, const real *probs,
                                           const int *targets, real dloss_scale, int BT, int V, int Vp)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT <= 0 || Vp <= 0) return;
  ce_backward_kernel<<<row_grid(BT, Vp, EW_THREADS), EW_THREADS, 0, c->stream>>>(dlogits, probs, targets, 0,
                                                                                 dloss_scale, BT, V, Vp);
  CUDA_LAUNCHED(c);
}

__global__ static void ce_shard_max_kernel(float *stats, const float *logits, int Vvalid, int Vl)
{
  __shared__ float shf[CE_THREADS];
  const size_t bt = blockIdx.x;
  const float m = row_max(logits + bt * Vl, Vvalid, shf);
  if (threadIdx.x == 0) stats[bt] = m;
}

__global__ static void ce_shard_sums_kernel(float *stats, const float *logits, const int *targets,
                                            int v0, int BT, int Vvalid, int Vl)
{
  __shared__ double shd[CE_THREADS];
  const size_t bt = blockIdx.x;
  const float *l = logits + bt * Vl;
  const float max = stats[bt];
  double part = 0.0;
  for (int i = threadIdx.x; i < Vvalid; i += CE_THREADS) part += expf(l[i] - max);
  const double sum = block_sum<CE_THREADS>(part, shd);
  if (threadIdx.x == 0) {
    stats[BT + bt] = (float)sum;
    const int t = targets[bt] - v0;
    stats[2 * (size_t)BT + bt] = targets[bt] >= 0 && t >= 0 && t < Vvalid ? l[t] : 0.0f;
  }
}

/* Elementwise over (BT, Vl): p may equal l (each element read, then written, by one thread). */
__global__ static void ce_shard_finish_probs(float *probs, const float *logits, const float *stats,
                                             int BT, int Vvalid, int Vl)
{
  ROW_LOOP(bt, i, BT, Vl)
  {
    const size_t idx = (size_t)bt * Vl + i;
    float p = 0.0f;
    if (i < Vvalid) {
      const float inv_sum = (float)(1.0 / (double)stats[BT + bt]);
      p = __fmul_rn(expf(logits[idx] - stats[bt]), inv_sum);
    }
    probs[idx] = p;
  }
}

__global__ static void ce_shard_finish_losses(float *losses, const float *stats, const int *targets,
                                              int BT)
{
  const int bt = blockIdx.x * blockDim.x + threadIdx.x;
  if (bt >= BT) return;
  const double sum = stats[BT + bt];
  losses[bt] = targets[bt] >= 0 ? (float)(log(sum) - ((double)stats[2 * (size_t)BT + bt] - stats[bt])) : 0.0f;
}

extern "C" void cuda_crossentropy_shard_max(void *ctx, real *stats, const real *logits, int BT,
                                            int Vvalid, int Vl)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT <= 0) return;
  ce_shard_max_kernel<<<(unsigned)BT, CE_THREADS, 0, c->stream>>>(stats, logits, Vvalid, Vl);
  CUDA_LAUNCHED(c);
}

extern "C" void cuda_crossentropy_shard_sums(void *ctx, real *stats, const real *logits,
                                             const int *targets, int v0, int BT, int Vvalid, int Vl)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT <= 0) return;
  ce_shard_sums_kernel<<<(unsigned)BT, CE_THREADS, 0, c->stream>>>(stats, logits, targets, v0, BT, Vvalid, Vl);
  CUDA_LAUNCHED(c);
}

extern "C" void cuda_crossentropy_shard_finish(void *ctx, real *losses, real *probs, const real *logits,
                                               const real *stats, const int *targets, int BT,
                                               int Vvalid, int Vl)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT <= 0) return;
  if (Vl > 0) {
    ce_shard_finish_probs<<<row_grid(BT, Vl, EW_THREADS), EW_THREADS, 0, c->stream>>>(probs, logits, stats,
                                                                                      BT, Vvalid, Vl);
    if (CUDA_LAUNCHED(c)) return;
  }
  ce_shard_finish_losses<<<cuda_blocks((size_t)BT, EW_THREADS), EW_THREADS, 0, c->stream>>>(losses, stats,
                                                                                           targets, BT);
  CUDA_LAUNCHED(c);
}

extern "C" void cuda_crossentropy_shard_backward(void *ctx, real *dlogits, const real *probs,
                                                 const int *targets, int v0, real dloss_scale, int BT,
                                                 int Vvalid, int Vl)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (BT <= 0 || Vl <= 0) return;
  ce_backward_kernel<<<row_grid(BT, Vl, EW_THREADS), EW_THREADS, 0, c->stream>>>(dlogits, probs, targets, v0,
                                                                                 dloss_scale, BT, Vvalid, Vl);
  CUDA_LAUNCHED(c);
}

/* ---- mixture of experts ---- */

/* One thread per token, the CPU's computation (kernels/moe_router.h; E is small: tens to
 * hundreds). */
__global__ static void moe_router_forward_kernel(float *probs, int *topi, float *topw, float *lse,
                                                 const float *logits, int N, int E, int K)
{
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  moe_router_token(probs + (size_t)n * E, topi + (size_t)n * K, topw + (size_t)n * K, lse + n,
                   logits + (size_t)n * E, E, K);
}

extern "C" void cuda_moe_router_forward(void *ctx, real *probs, int *topi, real *topw, real *lse,
                                        const real *logits, int N, int E, int K)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (N <= 0) return;
  moe_router_forward_kernel<<<cuda_blocks((size_t)N, 128), 128, 0, c->stream>>>(probs, topi, topw, lse,
                                                                                logits, N, E, K);
  CUDA_LAUNCHED(c);
}

/* Exclusive rank of this thread's flag among the block's (thread order), and the block's total
 * into *total. Integers: exact. blockDim.x == ROUTE_THREADS. */
__device__ static int block_rank(int flag, int *warp_tot, int *total)
{
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned mask = __ballot_sync(0xffffffffu, flag);
  const int before = __popc(mask & ((1u << lane) - 1u));
  if (lane == 0) warp_tot[warp] = __popc(mask);
  __syncthreads();
  int off = 0, tot = 0;
  for (int w = 0; w < ROUTE_THREADS / 32; w++) {
    if (w < warp) off += warp_tot[w];
    tot += warp_tot[w];
  }
  __syncthreads(); /* warp_tot is reused by the next call */
  *total = tot;
  return off + before;
}

#define ROUTE_KEPT (-2) /* slot marker between the two kernels: kept, row not yet numbered */

/* Block e: routed[e]; then group by group, e's assignments in priority order (k-major, then n),
 * the first `capacity` kept (ROUTE_KEPT), the rest −1; counts[e] = e's kept total. Every slot
 * entry is written by the block of its expert only. */
__global__ static void moe_route_keep_kernel(int *slot, int *counts, int *routed, const int *topi,
                                             int N, int group, int K, int capacity)
{
  __shared__ int warp_tot[ROUTE_THREADS / 32];
  const int e = blockIdx.x;
  int n_routed = 0, n_kept = 0, total;
  for (int g0 = 0; g0 < N; g0 += group) {
    const int g1 = g0 + group < N ? g0 + group : N;
    const int len = g1 - g0;
    const size_t m = (size_t)len * K; /* priority j = k·len + (n − g0) */
    int rank = 0;                     /* e's assignments so far in this group */
    for (size_t j0 = 0; j0 < m; j0 += ROUTE_THREADS) {
      const size_t j = j0 + threadIdx.x;
      size_t i = 0;
      int flag = 0;
      if (j < m) {
        const int k = (int)(j / (size_t)len), n = g0 + (int)(j % (size_t)len);
        i = (size_t)n * K + k;
        flag = topi[i] == e;
      }
      const int r = rank + block_rank(flag, warp_tot, &total);
      if (flag) slot[i] = capacity > 0 && r >= capacity ? -1 : ROUTE_KEPT;
      rank += total;
    }
    n_routed += rank;
    n_kept += capacity > 0 && rank > capacity ? capacity : rank;
  }
  if (threadIdx.x == 0) {
    routed[e] = n_routed;
    counts[e] = n_kept;
  }
}

/* Block e: off_e = Σ_{e' < e} counts[e'], then e's kept assignments numbered off_e, off_e + 1, ...
 * in assignment order (n ascending: an expert's rows in token order). */
__global__ static void moe_route_number_kernel(int *slot, const int *counts, const int *topi, int N,
                                               int K)
{
  __shared__ int warp_tot[ROUTE_THREADS / 32];
  const int e = blockIdx.x;
  int row = 0, total;
  for (int e2 = 0; e2 < e; e2++) row += counts[e2];
  const size_t NK = (size_t)N * K;
  for (size_t i0 = 0; i0 < NK; i0 += ROUTE_THREADS) {
    const size_t i = i0 + threadIdx.x;
    const int flag = i < NK && topi[i] == e && slot[i] == ROUTE_KEPT;
    const int r = block_rank(flag, warp_tot, &total);
    if (flag) slot[i] = row + r;
    row += total;
  }
}

extern "C" void cuda_moe_route(void *ctx, int *slot, int *counts, int *routed, const int *topi, int N,
                               int T, int E, int K, int capacity)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (E <= 0) return;
  if (N <= 0 || K <= 0) {
    if (!CUDA_CHECK(c, cudaMemsetAsync(counts, 0, (size_t)E * sizeof(int), c->stream)))
      CUDA_CHECK(c, cudaMemsetAsync(routed, 0, (size_t)E * sizeof(int), c->stream));
    return;
  }
  const int group = T > 0 ? T : N; /* T ≤ 0 is outside the contract: one group, as the CPU */
  moe_route_keep_kernel<<<(unsigned)E, ROUTE_THREADS, 0, c->stream>>>(slot, counts, routed, topi, N, group,
                                                                      K, capacity);
  if (CUDA_LAUNCHED(c)) return;
  moe_route_number_kernel<<<(unsigned)E, ROUTE_THREADS, 0, c->stream>>>(slot, counts, topi, N, K);
  CUDA_LAUNCHED(c);
}

/* Thread per (n, k, c): the kept rows are distinct, so no two threads write one element. */
__global__ static void moe_dispatch_kernel(float *xe, const float *x, const int *slot, size_t N, int K,
                                           int C)
{
  const size_t total = N * K * (size_t)C;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const size_t a = idx / (size_t)C, cc = idx - a * (size_t)C;
    const int s = slot[a];
    if (s >= 0) xe[(size_t)s * C + cc] = x[(a / K) * C + cc];
  }
}

extern "C" void cuda_moe_dispatch(void *ctx, real *xe, const real *x, const int *slot, int N, int K, int C)
{
  struct cuda_ctx *c = cuda_of(ctx);
  const size_t total = (size_t)(N > 0 ? N : 0) * (size_t)(K > 0 ? K : 0) * (size_t)(C > 0 ? C : 0);
  if (!total) return;
  moe_dispatch_kernel<<<ew_blocks(total), EW_THREADS, 0, c->stream>>>(xe, x, slot, (size_t)N, K, C);
  CUDA_LAUNCHED(c);
}

/* Thread per (n, c): Σ over kept k, k ascending, from 0 (the CPU's order and roundings). */
__global__ static void moe_dispatch_backward_kernel(float *dx, const float *dxe, const int *slot, size_t N,
                                                    int K, int C)
{
  const size_t total = N * (size_t)C;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const size_t n = idx / (size_t)C, cc = idx - n * (size_t)C;
    float d = 0.0f;
    for (int k = 0; k < K; k++) {
      const int s = slot[n * K + k];
      if (s >= 0) d = __fadd_rn(d, dxe[(size_t)s * C + cc]);
    }
    dx[idx] = d;
  }
}

extern "C" void cuda_moe_dispatch_backward(void *ctx, real *dx, const real *dxe, const int *slot, int N,
                                           int K, int C)
{
  struct cuda_ctx *c = cuda_of(ctx);
  const size_t total = (size_t)(N > 0 ? N : 0) * (size_t)(C > 0 ? C : 0);
  if (!total) return;
  moe_dispatch_backward_kernel<<<ew_blocks(total), EW_THREADS, 0, c->stream>>>(dx, dxe, slot, (size_t)N, K, C);
  CUDA_LAUNCHED(c);
}

/* Thread per (n, c): Σ over kept k, k ascending, of w · y, each product and sum rounded apart. */
__global__ static void moe_combine_kernel(float *out, const float *ye, const int *slot, const float *topw,
                                          size_t N, int K, int C)
{
  const size_t total = N * (size_t)C;
  for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const size_t n = idx / (size_t)C, cc = idx - n * (size_t)C;
    float o = 0.0f;
    for (int k = 0; k < K; k++) {
      const size_t i = n * K + k;
      const int s = slot[i];
      if (s >= 0) o = __fadd_rn(o, __fmul_rn(topw[i], ye[(size_t)s * C + cc]));
    }
    out[idx] = o;
  }
}

extern "C" void cuda_moe_combine(void *ctx, real *out, const real *ye, const int *slot, const real *topw,
                                 int N, int K, int C)
{
  struct cuda_ctx *c = cuda_of(ctx);
  const size_t total = (size_t)(N > 0 ? N : 0) * (size_t)(C > 0 ? C : 0);
  if (!total) return;
  moe_combine_kernel<<<ew_blocks(total), EW_THREADS, 0, c->stream>>>(out, ye, slot, topw, (size_t)N, K, C);
  CUDA_LAUNCHED(c);
}

/* Block per assignment (n, k): dye's row = w · dout[n]; dtopw = dout[n] · ye[row] in double
 * (each product exact in double), thread-strided partials, then block_sum's fixed tree. */
__global__ static void moe_combine_backward_kernel(float *dye, float *dtopw, const float *dout,
                                                   const float *ye, const int *slot, const float *topw,
                                                   int K, int C)
{
  __shared__ double shd[CE_THREADS];
  const size_t i = blockIdx.x;
  const int s = slot[i];
  if (s < 0) { /* uniform over the block: no thread reaches block_sum */
    if (threadIdx.x == 0) dtopw[i] = 0.0f;
    return;
  }
  const float *d = dout + (i / K) * C;
  const float *y = ye + (size_t)s * C;
  float *dy = dye + (size_t)s * C;
  const float w = topw[i];
  double part = 0.0;
  for (int cc = threadIdx.x; cc < C; cc += CE_THREADS) {
    part += (double)d[cc] * y[cc];
    dy[cc] = __fmul_rn(w, d[cc]);
  }
  const double dot = block_sum<CE_THREADS>(part, shd);
  if (threadIdx.x == 0) dtopw[i] = (float)dot;
}

extern "C" void cuda_moe_combine_backward(void *ctx, real *dye, real *dtopw, const real *dout, const real *ye,
                                          const int *slot, const real *topw, int N, int K, int C)
{
  struct cuda_ctx *c = cuda_of(ctx);
  const size_t NK = (size_t)(N > 0 ? N : 0) * (size_t)(K > 0 ? K : 0);
  if (!NK) return;
  if (NK > 0x7fffffffu) { /* one block per assignment: the grid's x limit */
    cuda_record(c, __FILE__, __LINE__, "cuda_moe_combine_backward", "N·K over 2^31 - 1");
    return;
  }
  moe_combine_backward_kernel<<<(unsigned)NK, CE_THREADS, 0, c->stream>>>(dye, dtopw, dout, ye, slot, topw,
                                                                          K, C);
  CUDA_LAUNCHED(c);
}

#define AUX_THREADS 256

/* Block per group: thread e (strided) sums its expert's count and column of probabilities in
 * token order, as the CPU; thread 0 then adds count_e · P_e over e in order, a chunk of
 * AUX_THREADS experts at a time: the CPU's sums, in the CPU's order. */
__global__ static void moe_aux_loss_kernel(float *aux, const float *probs, const int *topi, int T, int E,
                                           int K)
{
  __shared__ double term[AUX_THREADS];
  const size_t n0 = (size_t)blockIdx.x * T;
  double sum = 0.0;
  for (int e0 = 0; e0 < E; e0 += AUX_THREADS) {
    const int e = e0 + threadIdx.x;
    if (e < E) {
      long long chosen = 0;
      double p = 0.0;
      for (size_t n = n0; n < n0 + (size_t)T; n++) {
        for (int k = 0; k < K; k++) chosen += topi[n * K + k] == e;
        p += probs[n * E + e];
      }
      term[threadIdx.x] = (double)chosen * p;
    }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int t = 0; t < AUX_THREADS && e0 + t < E; t++) sum += term[t];
    __syncthreads();
  }
  if (threadIdx.x == 0) aux[blockIdx.x] = (float)(E * sum / ((double)T * T));
}

extern "C" void cuda_moe_aux_loss(void *ctx, real *aux, const real *probs, const int *topi, int N, int T,
                                  int E, int K)
{
  struct cuda_ctx *c = cuda_of(ctx);
  const int G = T > 0 ? N / T : 0;
  if (G <= 0) return;
  moe_aux_loss_kernel<<<(unsigned)G, AUX_THREADS, 0, c->stream>>>(aux, probs, topi, T, E, K);
  CUDA_LAUNCHED(c);
}

/* Thread per (g, e): the group's count of choices of e (an exact small integer in fp32) into
 * the dlogits row of the group's first token. */
__global__ static void moe_router_counts_kernel(float *dlogits, const int *topi, int G, int T, int E, int K)
{
  const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (idx >= (size_t)G * E) return;
  const size_t g = idx / E;
  const int e = (int)(idx - g * E);
  const size_t n0 = g * T;
  int count = 0;
  for (size_t i = n0 * K; i < (n0 + T) * K; i++) count += topi[i] == e;
  dlogits[n0 * E + e] = (float)count;
}


/* first 0: every token but the groups' first ones (thread per token); first 1: the first ones
 * (thread per group), after, over their own rows' counts. */
__global__ static void moe_router_backward_kernel(float *dlogits, const float *dtopw, const float *probs,
                                                  const int *topi, const float *topw, const float *lse,
                                                  int G, int T, int E, int K, double aux_coef,
                                                  double z_scale, int first)
{
  const size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  size_t n;
  if (first) {
    if (idx >= (size_t)G) return;
    n = idx * T;
  } else {
    if (idx >= (size_t)G * T || idx % T == 0) return;
    n = idx;
  }
  const size_t n0 = n - n % T;
  moe_router_backward_row(dlogits + n * E, dlogits + n0 * E, dtopw + n * K, probs + n * E, topi + n * K,
                      topw + n * K, lse[n], E, K, aux_coef, z_scale);
}

extern "C" void cuda_moe_router_backward(void *ctx, real *dlogits, const real *dtopw, const real *probs,
                                         const int *topi, const real *topw, const real *lse, int N, int T,
                                         int E, int K, real aux_scale, real z_scale)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (T <= 0 || E <= 0) return; /* outside the contract (N = G·T), as the CPU */
  const int G = N / T;
  if (G <= 0) return;
  const double aux_coef = (double)aux_scale * E / ((double)T * T);
  moe_router_counts_kernel<<<cuda_blocks((size_t)G * E, 128), 128, 0, c->stream>>>(dlogits, topi, G, T, E, K);
  if (CUDA_LAUNCHED(c)) return;
  moe_router_backward_kernel<<<cuda_blocks((size_t)G * T, 128), 128, 0, c->stream>>>(
      dlogits, dtopw, probs, topi, topw, lse, G, T, E, K, aux_coef, (double)z_scale, 0);
  if (CUDA_LAUNCHED(c)) return;
  moe_router_backward_kernel<<<cuda_blocks((size_t)G, 128), 128, 0, c->stream>>>(
      dlogits, dtopw, probs, topi, topw, lse, G, T, E, K, aux_coef, (double)z_scale, 1);
  CUDA_LAUNCHED(c);
}
