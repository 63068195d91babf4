/* Context parallelism's attention blocks on the CUDA backend (the attention_cp_* entries,
 * kernels/ops_list.h; the CPU's twins are kernels/cpu/attention_cp.c). The forward and the two
 * backward kernels are cuda_dense.cu's flash attention with a block's coordinates: a tile's local
 * rows and keys are read from the block's buffers (q_rows and kv_rows apart per sample), while
 * the causal test and the dropout draw use global positions — row q0 + i sees key k0 + j when
 * k0 + j ≤ q0 + i, and its mask is attention_drop_u at (h, q0 + i, k0 + j, T) — so a ring of
 * blocks draws the whole-sequence kernel's numbers. Key tiles wholly after a query tile's last
 * row are skipped, as the whole-sequence kernel skips those above the diagonal.
 *
 * What a block adds to the whole-sequence walk: a row may see no key of the block (it lies before
 * k0): its running max stays −∞, its partial is out 0, lse −∞ (the CPU's), and the exponentials
 * of a still-empty row are taken as 0 and 1 instead of exp(−∞ + ∞). Backward accumulates
 * (dq, dk, dv +=) instead of assigning, with lse the rows' final log-sum-exp and D given
 * (attention_cp_row_dots), so no scratch is needed (its size is 0).
 *
 * The merge and the row dots are one warp per row, in double (as the CPU's), rounded once; the
 * merge's lanes read the two lse before lane 0 writes the merged one. Every output element has
 * one writer and a fixed summation order; no atomics. */
#include "cuda_flash.h"

/* Forward of a block: blockIdx = (query tile, query head, sample − b0); rows i0 .. i0 + BR − 1
 * of the block (local), the block's key tiles in order up to the last that holds a key at or
 * before the tile's last row. As flash_forward_kernel, with the global causal test. */
template <int BR, int NJ>
__global__ void __launch_bounds__(ATT_THREADS)
cp_forward_kernel(real *out, real *lse, const real *q, const real *k, const real *v, struct attention_block bk,
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
  const int ldq = NH * HS, ldkv = NKV * HS, Tq = bk.Tq, Tk = bk.Tk, T = bk.T;
  const real *qb = q + (size_t)b * bk.q_rows * ldq + (size_t)h * HS;
  const real *kb = k + (size_t)b * bk.kv_rows * ldkv + (size_t)kvh * HS;
  const real *vb = v + (size_t)b * bk.kv_rows * ldkv + (size_t)kvh * HS;
  load_tile<BR, W, LD>(Qs, qb, ldq, i0, Tq, HS);
  if (tid < BR) {
    row_l[tid] = 0.0;
    row_m[tid] = -INFINITY;
  }
  float o[RI][NJ];
#pragma unroll
  for (int i = 0; i < RI; i++)
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) o[i][jj] = 0.0f;
  /* the tile's last row (global) and the key tiles that reach it */
  const int last = bk.q0 + min(i0 + BR, Tq) - 1;
  const int nk = last < bk.k0 ? 0 : min((Tk + BR - 1) / BR, (last - bk.k0) / BR + 1);
  for (int kt = 0; kt < nk; kt++) {
    const int j0 = kt * BR;
    __syncthreads(); /* the last tile's Ks, Vs, Ss read by every thread */
    load_tile<BR, W, LD>(Ks, kb, ldkv, j0, Tk, HS);
    load_tile<BR, W, LD>(Vs, vb, ldkv, j0, Tk, HS);
    __syncthreads();
    float s[RI][RI];
    tile_dots<BR, LD>(s, Qs, Ks, HS, tx, ty);
#pragma unroll
    for (int i = 0; i < RI; i++)
#pragma unroll
      for (int jj = 0; jj < RI; jj++) {
        const int r = ty + 16 * i, c = tx + 16 * jj, jl = j0 + c, il = i0 + r;
        Ss[r * SL + c] = jl < Tk && il < Tq && bk.k0 + jl <= bk.q0 + il ? scale * s[i][jj] : -INFINITY;
      }
    __syncthreads();
    { /* the online softmax of this tile: TPR adjacent lanes per row, CPT columns each */
      const int r = tid / TPR, part = tid % TPR, row = bk.q0 + i0 + r, lane = tid % 32;
      float *srow = Ss + r * SL;
      float mx = -INFINITY;
#pragma unroll
      for (int x = 0; x < CPT; x++) mx = fmaxf(mx, srow[part + TPR * x]);
#pragma unroll
      for (int o_ = 1; o_ < TPR; o_ <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o_));
      mx = __shfl_sync(0xffffffffu, mx, lane - part); /* one max per row, whatever a NaN did */
      const float m_old = row_m[r], m_new = fmaxf(mx, m_old);
      const int empty = m_new == -INFINITY; /* no key of the block so far at or before this row */
      double sum = 0.0;
#pragma unroll
      for (int x = 0; x < CPT; x++) {
        const int c = part + TPR * x, j = bk.k0 + j0 + c;
        const float p = empty ? 0.0f : expf(srow[c] - m_new); /* −inf (masked): 0 */
        sum += p;
        srow[c] = dr.on && p != 0.0f ? p * att_mask(dr, h, row, j, T) : p;
      }
#pragma unroll
      for (int o_ = 1; o_ < TPR; o_ <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o_);
      const float alpha = empty ? 1.0f : expf(m_old - m_new); /* the first keys: exp(−inf) = 0 */
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
  __syncthreads(); /* row_l, row_m: written inside the loop, or only before it when nk is 0 */
#pragma unroll
  for (int i = 0; i < RI; i++) {
    const int r = ty + 16 * i, il = i0 + r;
    if (il >= Tq)
      continue;
    const double l = row_l[r];
    const float inv = l > 0.0 ? (float)(1.0 / l) : 0.0f; /* an empty row: out 0 */
    real *orow = out + ((size_t)b * bk.q_rows + il) * ldq + (size_t)h * HS;
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
      const int d = tx + 16 * jj;
      if (d < HS)
        orow[d] = o[i][jj] * inv;
    }
  }
  if (tid < BR && i0 + tid < Tq)
    lse[((size_t)b * NH + h) * bk.q_rows + i0 + tid] =
        row_l[tid] > 0.0 ? (float)((double)row_m[tid] + log(row_l[tid])) : -INFINITY;
}

/* The recomputed tile of local query rows i0.. against local keys j0.. of a block (as
 * cuda_dense.cu's flash_ds, the causal test and the draws by global position): A = P · M and
 * dS = P (dP · M − D); 0 where masked or outside the block. */
template <int BR, int LD>
__device__ static inline void cp_ds(float (&a)[BR / 16][BR / 16], float (&ds)[BR / 16][BR / 16], const float *Qs,
                                    const float *dOs, const float *Ks, const float *Vs, const float *lse_s,
                                    const float *D_s, int i0, int j0, int h, const struct attention_block &bk,
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
      const int r = ty + 16 * i, il = i0 + r, jl = j0 + tx + 16 * jj, row = bk.q0 + il, j = bk.k0 + jl;
      a[i][jj] = 0.0f, ds[i][jj] = 0.0f;
      if (il < bk.Tq && jl < bk.Tk && j <= row) {
        const float p = expf(scale * s[i][jj] - lse_s[r]);
        const float m = dr.on ? att_mask(dr, h, row, j, bk.T) : 1.0f;
        a[i][jj] = p * m;
        ds[i][jj] = p * (dp[i][jj] * m - D_s[r]);
      }
    }
}

/* Loads the query-side tiles of rows i0.. (local) of head h: q, dout, lse and D. */
template <int BR, int W, int LD>
__device__ static inline void cp_load_rows(float *Qs, float *dOs, float *lse_s, float *D_s, const real *q,
                                           const real *dout, const real *lse, const real *Dv, int b, int h, int i0,
                                           const struct attention_block &bk, int NH, int HS)
{
  const int ld = NH * HS, tid = threadIdx.x;
  load_tile<BR, W, LD>(Qs, q + (size_t)b * bk.q_rows * ld + (size_t)h * HS, ld, i0, bk.Tq, HS);
  load_tile<BR, W, LD>(dOs, dout + (size_t)b * bk.q_rows * ld + (size_t)h * HS, ld, i0, bk.Tq, HS);
  if (tid < BR) {
    const int il = i0 + tid;
    const size_t at = ((size_t)b * NH + h) * bk.q_rows + il;
    lse_s[tid] = il < bk.Tq ? lse[at] : 0.0f;
    D_s[tid] = il < bk.Tq ? Dv[at] : 0.0f;
  }
}

/* Backward, dk and dv of a block: blockIdx = (key tile, KV head, sample − b0); the group's query
 * heads in order, each over the query tiles whose last row reaches the key tile's first key, in
 * order. dk += scale · Σ dS q, dv += Σ A dout. */
template <int BR, int NJ>
__global__ void __launch_bounds__(ATT_THREADS)
cp_backward_dkv_kernel(real *dk, real *dv, const real *dout, const real *q, const real *k, const real *v,
                       const real *lse, const real *Dv, struct attention_block bk, int NH, int NKV, int HS,
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
  const int ldkv = NKV * HS, nq = (bk.Tq + BR - 1) / BR;
  load_tile<BR, W, LD>(Ks, k + (size_t)b * bk.kv_rows * ldkv + (size_t)kvh * HS, ldkv, j0, bk.Tk, HS);
  load_tile<BR, W, LD>(Vs, v + (size_t)b * bk.kv_rows * ldkv + (size_t)kvh * HS, ldkv, j0, bk.Tk, HS);
  /* the first query tile with a row at or after the key tile's first key (global) */
  const int first_key = bk.k0 + j0, qt0 = first_key <= bk.q0 ? 0 : (first_key - bk.q0) / BR;
  float dka[RI][NJ], dva[RI][NJ];
#pragma unroll
  for (int i = 0; i < RI; i++)
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) dka[i][jj] = 0.0f, dva[i][jj] = 0.0f;
  for (int h = kvh * group; h < (kvh + 1) * group; h++)
    for (int qt = qt0; qt < nq; qt++) {
      const int i0 = qt * BR;
      __syncthreads(); /* the last tile's Qs, dOs, As, dSs read by every thread */
      cp_load_rows<BR, W, LD>(Qs, dOs, lse_s, D_s, q, dout, lse, Dv, b, h, i0, bk, NH, HS);
      __syncthreads();
      float a[RI][RI], ds[RI][RI];
      cp_ds<BR, LD>(a, ds, Qs, dOs, Ks, Vs, lse_s, D_s, i0, j0, h, bk, HS, scale, dr, tx, ty);
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
#pragma unroll
  for (int i = 0; i < RI; i++) {
    const int jl = j0 + ty + 16 * i;
    if (jl >= bk.Tk)
      continue;
    real *dkj = dk + ((size_t)b * bk.kv_rows + jl) * ldkv + (size_t)kvh * HS;
    real *dvj = dv + ((size_t)b * bk.kv_rows + jl) * ldkv + (size_t)kvh * HS;
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
      const int d = tx + 16 * jj;
      if (d < HS) {
        dkj[d] += scale * dka[i][jj];
        dvj[d] += dva[i][jj];
      }
    }
  }
}

/* Backward, dq of a block: blockIdx = (query tile, query head, sample − b0); the key tiles that
 * reach the tile's last row, in order. dq += scale · Σ dS k. */
template <int BR, int NJ>
__global__ void __launch_bounds__(ATT_THREADS)
cp_backward_dq_kernel(real *dq, const real *dout, const real *q, const real *k, const real *v, const real *lse,
                      const real *Dv, struct attention_block bk, int NH, int NKV, int HS, float scale,
                      struct att_drop dr, int b0)
{
  typedef flash_cfg<BR, NJ> C;
  constexpr int W = C::W, LD = C::LD, SL = C::SL, RI = BR / 16;
  extern __shared__ double att_smem[];
  float *Qs = (float *)att_smem, *dOs = Qs + BR * LD, *Ks = dOs + BR * LD, *Vs = Ks + BR * LD; /* BR × LD */
  float *dSs = Vs + BR * LD, *lse_s = dSs + BR * SL, *D_s = lse_s + BR;                     /* BR × SL, BR, BR */
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int qt = blockIdx.x, h = blockIdx.y, b = b0 + (int)blockIdx.z, kvh = h / (NH / NKV), i0 = qt * BR;
  const int ldq = NH * HS, ldkv = NKV * HS;
  const real *kb = k + (size_t)b * bk.kv_rows * ldkv + (size_t)kvh * HS;
  const real *vb = v + (size_t)b * bk.kv_rows * ldkv + (size_t)kvh * HS;
  cp_load_rows<BR, W, LD>(Qs, dOs, lse_s, D_s, q, dout, lse, Dv, b, h, i0, bk, NH, HS);
  float dqa[RI][NJ];
#pragma unroll
  for (int i = 0; i < RI; i++)
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) dqa[i][jj] = 0.0f;
  const int last = bk.q0 + min(i0 + BR, bk.Tq) - 1;
  const int nk = last < bk.k0 ? 0 : min((bk.Tk + BR - 1) / BR, (last - bk.k0) / BR + 1);
  for (int kt = 0; kt < nk; kt++) {
    const int j0 = kt * BR;
    __syncthreads(); /* the last tile's Ks, dSs read by every thread */
    load_tile<BR, W, LD>(Ks, kb, ldkv, j0, bk.Tk, HS);
    load_tile<BR, W, LD>(Vs, vb, ldkv, j0, bk.Tk, HS);
    __syncthreads();
    float a[RI][RI], ds[RI][RI];
    cp_ds<BR, LD>(a, ds, Qs, dOs, Ks, Vs, lse_s, D_s, i0, j0, h, bk, HS, scale, dr, tx, ty);
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
    const int il = i0 + ty + 16 * i;
    if (il >= bk.Tq)
      continue;
    real *dqi = dq + ((size_t)b * bk.q_rows + il) * ldq + (size_t)h * HS;
#pragma unroll
    for (int jj = 0; jj < NJ; jj++) {
      const int d = tx + 16 * jj;
      if (d < HS)
        dqi[d] += scale * dqa[i][jj];
    }
  }
}

/* Row r = (b · NH + h) · Tq + t of a (B, NH, Tq) walk: its place in (B, q_rows, NH·HS) rows and in
 * (B, NH, q_rows) per-row values. */
__device__ static inline void cp_row_at(size_t row, int Tq, int q_rows, int NH, int HS, size_t *at, size_t *l)
{
  const int t = (int)(row % (size_t)Tq), bh = (int)(row / (size_t)Tq), b = bh / NH, h = bh % NH;
  *at = ((size_t)b * q_rows + t) * NH * HS + (size_t)h * HS;
  *l = (size_t)bh * q_rows + t;
}

/* D = Σ_d dout · out of a row, one warp per row, in double (lanes over d in order, a fixed xor
 * tree), rounded once. */
__global__ void __launch_bounds__(ATT_THREADS)
cp_rowdot_kernel(real *D, const real *dout, const real *out, int Tq, int q_rows, int NH, int HS, size_t rows)
{
  const size_t row = (size_t)blockIdx.x * ATT_WARPS + threadIdx.x / 32;
  if (row >= rows)
    return; /* a whole warp */
  const int lane = threadIdx.x % 32;
  size_t at, l;
  cp_row_at(row, Tq, q_rows, NH, HS, &at, &l);
  double acc = 0.0;
  for (int d = lane; d < HS; d += 32) acc += (double)dout[at + d] * (double)out[at + d];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0)
    D[l] = (real)acc;
}

/* The log-sum-exp merge of a row, one warp per row (attention_cp_merge's formula, in double). */
__global__ void __launch_bounds__(ATT_THREADS)
cp_merge_kernel(real *out, real *lse, const real *out_b, const real *lse_b, int Tq, int q_rows, int NH, int HS,
                size_t rows)
{
  const size_t row = (size_t)blockIdx.x * ATT_WARPS + threadIdx.x / 32;
  if (row >= rows)
    return;
  const int lane = threadIdx.x % 32;
  size_t at, l;
  cp_row_at(row, Tq, q_rows, NH, HS, &at, &l);
  const double la = lse[l], lb = lse_b[l], m = la > lb ? la : lb;
  if (m == -INFINITY) /* both empty: stays empty */
    return;
  const double wa = exp(la - m), wb = exp(lb - m), sum = wa + wb, ca = wa / sum, cb = wb / sum;
  for (int d = lane; d < HS; d += 32) out[at + d] = (real)(ca * out[at + d] + cb * out_b[at + d]);
  __syncwarp(); /* every lane has read lse[l] */
  if (lane == 0)
    lse[l] = (real)(m + log(sum));
}

extern "C" size_t cuda_attention_cp_scratch_n_elems(void *ctx, int B, int Tq, int Tk, int NH, int NKV, int HS)
{
  (void)ctx, (void)B, (void)Tq, (void)Tk, (void)NH, (void)NKV, (void)HS; /* D is the caller's */
  return 0;
}

template <int BR, int NJ>
static void cp_forward(struct cuda_ctx *c, real *out, real *lse, const real *q, const real *k, const real *v,
                       const struct attention_dropout *drop, const struct attention_block &bk, int B, int NH,
                       int NKV, int HS)
{
  typedef flash_cfg<BR, NJ> C;
  if (CUDA_CHECK(c, cudaFuncSetAttribute(cp_forward_kernel<BR, NJ>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)C::fwd_bytes)))
    return;
  const float scale = 1.0f / sqrtf((float)HS);
  const unsigned tiles = (unsigned)((bk.Tq + BR - 1) / BR);
  per_sample(c, drop, B, [&](const struct att_drop &dr, int b0, int nb) {
    cp_forward_kernel<BR, NJ><<<dim3(tiles, (unsigned)NH, (unsigned)nb), ATT_THREADS, C::fwd_bytes, c->stream>>>(
        out, lse, q, k, v, bk, NH, NKV, HS, scale, dr, b0);
  });
}

extern "C" void cuda_attention_cp_forward(void *ctx, real *out, real *lse, real *scratch, const real *q,
                                          const real *k, const real *v, const struct attention_dropout *drop,
                                          const struct attention_block *blk, int B, int NH, int NKV, int HS)
{
  struct cuda_ctx *c = cuda_of(ctx);
  (void)scratch;
  if (B == 0 || blk->Tq == 0 || NH == 0 || HS == 0)
    return;
  const struct attention_block bk = *blk;
  switch (flash_cfg_of(c, HS)) {
  case 32: cp_forward<64, 2>(c, out, lse, q, k, v, drop, bk, B, NH, NKV, HS); break;
  case 64: cp_forward<64, 4>(c, out, lse, q, k, v, drop, bk, B, NH, NKV, HS); break;
  case 128: cp_forward<64, 8>(c, out, lse, q, k, v, drop, bk, B, NH, NKV, HS); break;
  case 256: cp_forward<32, 16>(c, out, lse, q, k, v, drop, bk, B, NH, NKV, HS); break;
  default: break;
  }
}

extern "C" void cuda_attention_cp_merge(void *ctx, real *out, real *lse, const real *out_b, const real *lse_b, int B,
                                        int Tq, int q_rows, int NH, int HS)
{
  struct cuda_ctx *c = cuda_of(ctx);
  const size_t rows = (size_t)B * NH * Tq;
  if (rows == 0)
    return;
  cp_merge_kernel<<<cuda_blocks(rows, ATT_WARPS), ATT_THREADS, 0, c->stream>>>(out, lse, out_b, lse_b, Tq, q_rows,
                                                                              NH, HS, rows);
  CUDA_LAUNCHED(c);
}

extern "C" void cuda_attention_cp_row_dots(void *ctx, real *D, const real *dout, const real *out, int B, int Tq,
                                           int q_rows, int NH, int HS)
{
  struct cuda_ctx *c = cuda_of(ctx);
  const size_t rows = (size_t)B * NH * Tq;
  if (rows == 0)
    return;
  cp_rowdot_kernel<<<cuda_blocks(rows, ATT_WARPS), ATT_THREADS, 0, c->stream>>>(D, dout, out, Tq, q_rows, NH, HS,
                                                                               rows);
  CUDA_LAUNCHED(c);
}

template <int BR, int NJ>
static void cp_backward(struct cuda_ctx *c, real *dq, real *dk, real *dv, const real *dout, const real *q,
                        const real *k, const real *v, const real *lse, const real *D,
                        const struct attention_dropout *drop, const struct attention_block &bk, int B, int NH,
                        int NKV, int HS)
{
  typedef flash_cfg<BR, NJ> C;
  if (CUDA_CHECK(c, cudaFuncSetAttribute(cp_backward_dkv_kernel<BR, NJ>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::dkv_bytes)) ||
      CUDA_CHECK(c, cudaFuncSetAttribute(cp_backward_dq_kernel<BR, NJ>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::dq_bytes)))
    return;
  const float scale = 1.0f / sqrtf((float)HS);
  const unsigned qtiles = (unsigned)((bk.Tq + BR - 1) / BR), ktiles = (unsigned)((bk.Tk + BR - 1) / BR);
  if (ktiles && per_sample(c, drop, B, [&](const struct att_drop &dr, int b0, int nb) {
        cp_backward_dkv_kernel<BR, NJ><<<dim3(ktiles, (unsigned)NKV, (unsigned)nb), ATT_THREADS, C::dkv_bytes,
                                         c->stream>>>(dk, dv, dout, q, k, v, lse, D, bk, NH, NKV, HS, scale, dr, b0);
      }))
    return;
  per_sample(c, drop, B, [&](const struct att_drop &dr, int b0, int nb) {
    cp_backward_dq_kernel<BR, NJ><<<dim3(qtiles, (unsigned)NH, (unsigned)nb), ATT_THREADS, C::dq_bytes, c->stream>>>(
        dq, dout, q, k, v, lse, D, bk, NH, NKV, HS, scale, dr, b0);
  });
}

extern "C" void cuda_attention_cp_backward(void *ctx, real *dq, real *dk, real *dv, real *scratch, const real *dout,
                                           const real *q, const real *k, const real *v, const real *lse,
                                           const real *D, const struct attention_dropout *drop,
                                           const struct attention_block *blk, int B, int NH, int NKV, int HS)
{
  struct cuda_ctx *c = cuda_of(ctx);
  (void)scratch;
  if (B == 0 || blk->Tq == 0 || blk->Tk == 0 || NH == 0 || HS == 0)
    return;
  const struct attention_block bk = *blk;
  switch (flash_cfg_of(c, HS)) {
  case 32: cp_backward<64, 2>(c, dq, dk, dv, dout, q, k, v, lse, D, drop, bk, B, NH, NKV, HS); break;
  case 64: cp_backward<64, 4>(c, dq, dk, dv, dout, q, k, v, lse, D, drop, bk, B, NH, NKV, HS); break;
  case 128: cp_backward<64, 8>(c, dq, dk, dv, dout, q, k, v, lse, D, drop, bk, B, NH, NKV, HS); break;
  case 256: cp_backward<32, 16>(c, dq, dk, dv, dout, q, k, v, lse, D, drop, bk, B, NH, NKV, HS); break;
  default: break;
  }
}
