/* Rotary position embedding and causal self-attention with grouped KV heads.
 * Attention is flash-style: no (T, T) matrix is kept. Each (batch, head) is walked in blocks of
 * ATTENTION_BLOCK query rows; rows [r0, r1) meet keys [0, r1) only (the key blocks above the
 * causal diagonal are skipped), in chunks of at most ATTENTION_KEYS keys. Forward keeps an online
 * softmax per row (running max, Σ exp in double, the output rows rescaled when the max grows)
 * and writes out and each row's log-sum-exp; backward recomputes a chunk's scores from q and k,
 * P = exp(s − lse), and draws the dropout again from Philox (attention_drop_u, the numbers
 * dropout_mask draws; a row's keys of a chunk at once, 8 or 16 Philox blocks at a time on the
 * vector layer), so memory is O(T · HS) per head plus fixed blocks. The products are sgemms
 * of a block of rows against a chunk of keys: q·kᵀ, P·v forward; q·kᵀ, dout·vᵀ, Pᵀ·dout, dS·k,
 * dSᵀ·q backward (one more than a kernel that keeps P). The bf16 mode's entries (_bf16) walk the
 * same way and compute the same products on bf16 operands (gemm_bf16.h), packed into each
 * task's part of the scratch. Query head h reads KV head
 * h / (NH / NKV); in backward several query heads add into the same dk, dv, so backward gives
 * each OpenMP task one (batch, KV head) and walks its query heads, and each head's blocks and
 * chunks, in a fixed order — no two threads write one element and the sum order is fixed, so a
 * (batch, head)'s results do not depend on B, NH or the thread count. The walk is written once
 * for a block of rows against a block of keys at global positions (attention_span.h): the
 * entries here run it over the whole sequence, context parallelism's ring (attention_cp.c) over
 * the blocks of a rank's chunks. */
#include "blas.h"
#include <math.h>
#include <omp.h>
#include <string.h>

#include "attention_span.h"
#include "gemm_bf16.h"
#include "kernels.h"
#include "philox.h"
#include "vec.h"

/* Query rows per block. Measured with bench/bench_attention, one thread (host/runtime/README.md,
 * "Attention on CPU"): 64 is as fast as 32 or faster under OpenBLAS's SkylakeX and Haswell
 * kernels; 128 and 16 are slower. Keys per chunk: a multiple of the block (so every row meets a
 * key in every chunk it reads); 512 keeps the sgemms as wide as a whole row's up to T = 512 and
 * a chunk's scores (block × chunk) in cache. A build may set others (-DATTENTION_BLOCK=N,
 * -DATTENTION_KEYS=N) to measure. */
#ifndef ATTENTION_BLOCK
#define ATTENTION_BLOCK 64
#endif
#ifndef ATTENTION_KEYS
#define ATTENTION_KEYS 512
#endif
#if ATTENTION_KEYS % ATTENTION_BLOCK != 0
#error "ATTENTION_KEYS must be a multiple of ATTENTION_BLOCK"
#endif

void rope_table(real *cos_table, real *sin_table, int T, int HS, double theta, int pos0)
{
  int half = HS / 2;
  for (int i = 0; i < half; i++) {
    double inv_freq = pow(theta, -2.0 * i / HS);
    for (int t = 0; t < T; t++) {
      double angle = (double)(pos0 + t) * inv_freq;
      cos_table[(size_t)t * half + i] = (real)cos(angle);
      sin_table[(size_t)t * half + i] = (real)sin(angle);
    }
  }
}

/* sign = +1 rotates by the angle (forward), −1 by its negative (backward: the transpose).
 * Token rows are ld elements apart in inp and in out (NHx · HS when packed). */
static void rope_rotate(real *out, const real *inp, size_t ld, const real *cos_tab, const real *sin_tab,
                        int B, int T, int NHx, int HS, real sign)
{
  const int half = HS / 2;
  const long n_tokens = (long)B * T;
  const struct vec_ops *vrows = VEC_FOR_REAL;
  /* Threads take tokens and walk their heads (no division per head row), each head's row on the
   * vector layer where it has a path (the same operations: the same bits), else in the loop
   * below, whose simd pragma lets the in-place call vectorise: iteration i reads and writes
   * elements i and i + half only. */
#pragma omp parallel for
  for (long token = 0; token < n_tokens; token++) {
    const size_t t = (size_t)(token % T);
    const real *c = cos_tab + t * half, *s = sin_tab + t * half;
    for (int h = 0; h < NHx; h++) {
      const size_t at = (size_t)token * ld + (size_t)h * HS;
      const real *x = inp + at;
      real *y = out + at;
      if (vrows) {
        vrows->rope((float *)y, (const float *)x, (const float *)c, (const float *)s, (float)sign, (size_t)half);
        continue;
      }
#pragma omp simd
      for (int i = 0; i < half; i++) {
        real x1 = x[i], x2 = x[i + half], si = sign * s[i];
        y[i] = x1 * c[i] - x2 * si;
        y[i + half] = x2 * c[i] + x1 * si;
      }
    }
  }
}

void rope_forward(real *out, const real *inp, const real *cos_table, const real *sin_table,
                  int B, int T, int NHx, int HS)
{
  rope_rotate(out, inp, (size_t)NHx * HS, cos_table, sin_table, B, T, NHx, HS, 1.0f);
}

void rope_backward(real *dinp, const real *dout, const real *cos_table,
                   const real *sin_table, int B, int T, int NHx, int HS)
{
  rope_rotate(dinp, dout, (size_t)NHx * HS, cos_table, sin_table, B, T, NHx, HS, -1.0f);
}

/* The fused q|k|v product's rows [q | k | v] ((NH + 2 NKV) · HS each): q and k rotated in place. */
void rope_forward_qkv(real *qkv, const real *cos_table, const real *sin_table, int B, int T, int NH,
                      int NKV, int HS)
{
  const size_t ld = (size_t)(NH + 2 * NKV) * HS;
  rope_rotate(qkv, qkv, ld, cos_table, sin_table, B, T, NH, HS, 1.0f);
  rope_rotate(qkv + (size_t)NH * HS, qkv + (size_t)NH * HS, ld, cos_table, sin_table, B, T, NKV, HS, 1.0f);
}

void rope_backward_qkv(real *dqkv, const real *cos_table, const real *sin_table, int B, int T,
                       int NH, int NKV, int HS)
{
  const size_t ld = (size_t)(NH + 2 * NKV) * HS;
  rope_rotate(dqkv, dqkv, ld, cos_table, sin_table, B, T, NH, HS, -1.0f);
  rope_rotate(dqkv + (size_t)NH * HS, dqkv + (size_t)NH * HS, ld, cos_table, sin_table, B, T, NKV, HS,
              -1.0f);
}

/* Keys per chunk for a T-long sequence: ATTENTION_KEYS, or T rounded up to a block when shorter. */
static int chunk_keys(int T)
{
  const int up = (T + ATTENTION_BLOCK - 1) / ATTENTION_BLOCK * ATTENTION_BLOCK;
  return up < ATTENTION_KEYS ? up : ATTENTION_KEYS;
}

/* A block × chunk of scores: at most min(T, block) rows of min(T, chunk) keys. */
static size_t task_scratch(int T)
{
  const int rows = T < ATTENTION_BLOCK ? T : ATTENTION_BLOCK, keys = T < ATTENTION_KEYS ? T : ATTENTION_KEYS;
  return (size_t)rows * (size_t)keys;
}

/* The same for a block of Tq rows against Tk keys (attention_span.h): task_scratch(T) at Tq = Tk = T. */
static size_t span_scratch(int Tq, int Tk)
{
  const int rows = Tq < ATTENTION_BLOCK ? Tq : ATTENTION_BLOCK, keys = Tk < ATTENTION_KEYS ? Tk : ATTENTION_KEYS;
  return (size_t)rows * (size_t)keys;
}

/* One block × chunk of scores per forward task (batch, head), two per backward task (batch, KV
 * head): no T · T term, whatever the thread count. */
size_t attention_scratch_n_elems(int B, int T, int NH, int NKV, int HS)
{
  (void)HS;
  const size_t per_task = task_scratch(T);
  const size_t fwd = (size_t)NH, bwd = 2 * (size_t)NKV;
  return (size_t)B * per_task * (fwd > bwd ? fwd : bwd);
}

/* The bf16 entries' tasks (attention_*_bf16): the same scores, then a pack buffer for the bf16
 * operands of the task's largest product (gemm_bf16_pack_elems), each part a whole number of
 * 64-byte lines. The products: q·kᵀ and dout·vᵀ (rows × keys × HS), P·v and dS·k (rows × HS ×
 * keys), Pᵀ·dout and dSᵀ·q (keys × HS × rows), a block's rows and a chunk's keys at most
 * min(T, block) and min(T, chunk). */
static size_t line_up(size_t n_reals)
{
  const size_t line = 64 / sizeof(real);
  return (n_reals + line - 1) / line * line;
}

static size_t pack_reals(int T, int HS)
{
#if REAL_IS_DOUBLE
  (void)T, (void)HS;
  return 0;
#else
  const int rows = T < ATTENTION_BLOCK ? T : ATTENTION_BLOCK, keys = T < ATTENTION_KEYS ? T : ATTENTION_KEYS;
  size_t n = gemm_bf16_pack_elems(rows, keys, HS);
  const size_t pv = gemm_bf16_pack_elems(rows, HS, keys), tr = gemm_bf16_pack_elems(keys, HS, rows);
  n = pv > n ? pv : n;
  n = tr > n ? tr : n;
  return line_up((n * sizeof(bf16) + sizeof(real) - 1) / sizeof(real));
#endif
}

static size_t task_stride_bf16(int T, int HS, int n_scores)
{
  return line_up((size_t)n_scores * task_scratch(T)) + pack_reals(T, HS);
}

const char *attention_bf16_path(void)
{
  return gemm_bf16_path();
}

size_t attention_scratch_n_elems_bf16(int B, int T, int NH, int NKV, int HS)
{
  const size_t fwd = (size_t)NH * task_stride_bf16(T, HS, 1), bwd = (size_t)NKV * task_stride_bf16(T, HS, 2);
  return (size_t)B * (fwd > bwd ? fwd : bwd);
}

/* One product of the attention: in bf16 operands on the task's pack buffer (gemm_bf16) where
 * pack is given, else in fp32 row tiles (gemm_rows). Either way a result's bits do not depend
 * on the thread count or on whether the caller is inside a parallel region. */
static void product(bf16 *pack, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M, int N, int K,
                    real alpha, const real *A, int lda, const real *B, int ldb, real beta, real *C, int ldc)
{
#if !REAL_IS_DOUBLE
  if (pack) {
    gemm_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, pack);
    return;
  }
#else
  (void)pack;
#endif
  gemm_rows(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* With at least as many tasks as OpenMP threads, run the tasks in parallel, each product's
 * tiles one after another; otherwise run the tasks one after another and share each product's
 * tiles among the threads (blas.h). Either way every product is the same tiles, so the bits do not
 * depend on the thread count. */
static int tasks_parallel(int n_tasks)
{
  return omp_get_max_threads() > 1 && n_tasks >= omp_get_max_threads();
}

/* max_j row[j] over n ≥ 1 elements in 8 lanes (vector max instructions). The maximum of a set
 * does not depend on the order it is taken in, but for the sign of a zero (+0 and −0 compare
 * equal), and score − (±0) and exp of ±0 are the same numbers, so the probabilities are those of
 * a left-to-right loop; a NaN is passed over either way (NaN > m is false), as there. */
static real row_max(const real *row, int n)
{
  real lane[8] = { -INFINITY, -INFINITY, -INFINITY, -INFINITY,
                   -INFINITY, -INFINITY, -INFINITY, -INFINITY };
  int j = 0;
  for (; j + 8 <= n; j += 8)
    for (int i = 0; i < 8; i++) lane[i] = row[j + i] > lane[i] ? row[j + i] : lane[i];
  real max = -INFINITY;
  for (int i = 0; i < 8; i++) max = lane[i] > max ? lane[i] : max;
  for (; j < n; j++) max = row[j] > max ? row[j] : max;
  return max;
}

/* The dropout of struct attention_dropout, resolved for one call: on, p and the kept scale
 * (dropout_mask's: 1/(1 − p) in real, 0 at p ≥ 1), and the vector layer's stream with all but
 * the sample's counter word (c2) filled in. */
struct drop_at {
  const struct attention_dropout *d;
  real keep;
  struct vec_dropout stream;
};

static struct drop_at drop_resolve(const struct attention_dropout *d)
{
  struct drop_at r;
  memset(&r, 0, sizeof r);
  if (d && d->p > 0.0f) {
    r.d = d;
    r.keep = d->p < 1.0f ? (real)1 / (1 - (real)d->p) : 0;
    vec_dropout_stream(&r.stream, d->seed, d->c1, 0, d->c3, d->p, (float)r.keep);
  }
  return r;
}

/* M_ij for sample b, query head h, row i, keys j = c0 .. c0 + n − 1 into m: attention_drop_u's
 * numbers (philox_uniform's, word e % 4 of block e / 4). The vector layer draws 8 or 16 Philox
 * blocks at a time (vec.h, dropout_keep: the same numbers); the scalar path, and the float64
 * build, one block per 4 keys. */
static void drop_row(real *m, const struct drop_at *x, const struct vec_ops *v, int b, int h,
                     int i, int c0, int n, int T)
{
  const struct attention_dropout *d = x->d;
  uint64_t e = d->first + ((uint64_t)h * T + i) * T + (uint64_t)c0;
  if (v) {
    struct vec_dropout s = x->stream;
    s.c2 = d->samples[b];
    v->dropout_keep((float *)m, &s, e, (size_t)n);
    return;
  }
  const uint32_t key[2] = { (uint32_t)d->seed, (uint32_t)(d->seed >> 32) };
  uint32_t w[4] = { 0, 0, 0, 0 };
  for (int j = 0; j < n; j++, e++) {
    if (j == 0 || (e & 3) == 0) {
      const uint32_t ctr[4] = { (uint32_t)(e >> 2), d->c1, d->samples[b], d->c3 };
      philox4x32_10(ctr, key, w);
    }
    const float u = (float)(w[e & 3] >> 8) * (1.0f / 16777216.0f);
    m[j] = u < d->p ? 0 : x->keep;
  }
}

/* q's token rows ldq apart, k's and v's ldkv apart (packed: NH · HS and NKV · HS; the fused
 * q|k|v product's rows: both (NH + 2 NKV) · HS); out packed (NH · HS). The output rows hold the
 * running Σ_j exp(s_ij − m_i) M_ij v_j until a block's keys are all seen. The rows and keys are
 * those of s (attention_span.h): the whole sequence for attention_forward; for a block of
 * context parallelism's ring, rows and keys at global positions, a row seeing the keys at or
 * before it. Only there can a row see no key of a chunk (keys starting after it): it adds
 * nothing, and a row that sees no key of the block at all gets out 0 and lse −∞ (the merge's
 * empty partial). */
static void forward_span(real *out, real *lse, real *scratch, const real *q, const real *k,
                         const real *v, int ldq, int ldkv, const struct attention_dropout *drop,
                         int B, int NH, int NKV, int HS, int lowp, const struct attention_block *s)
{
  const int group = NH / NKV, ldo = NH * HS, BK = chunk_keys(s->Tk), Tq = s->Tq;
  const int qoff = s->q0 - s->k0; /* row t's global position less the first key's */
  const size_t stride = lowp ? task_stride_bf16(s->T, HS, 1) : span_scratch(Tq, s->Tk);
  const real scale = 1.0f / real_sqrt((real)HS);
  const struct drop_at dr = drop_resolve(drop);
  const struct vec_ops *vrows = VEC_FOR_REAL;
  const int parallel = tasks_parallel(B * NH);
#pragma omp parallel for if (parallel)
  for (int task = 0; task < B * NH; task++) {
    const int b = task / NH, h = task % NH, kvh = h / group;
    const real *qb = q + (size_t)b * s->q_rows * ldq + (size_t)h * HS;
    const real *kb = k + (size_t)b * s->kv_rows * ldkv + (size_t)kvh * HS;
    const real *vb = v + (size_t)b * s->kv_rows * ldkv + (size_t)kvh * HS;
    real *ob = out + (size_t)b * s->q_rows * ldo + (size_t)h * HS, *lb = lse + (size_t)task * s->q_rows;
    real *S = scratch + (size_t)task * stride;
    bf16 *pack = lowp ? (bf16 *)(S + line_up(task_scratch(s->T))) : NULL;
    real rmax[ATTENTION_BLOCK];
    double rsum[ATTENTION_BLOCK];
    for (int r0 = 0; r0 < Tq; r0 += ATTENTION_BLOCK) {
      const int r1 = r0 + ATTENTION_BLOCK < Tq ? r0 + ATTENTION_BLOCK : Tq, m = r1 - r0;
      const int kend = qoff + r1 < s->Tk ? qoff + r1 : s->Tk; /* keys at or before row r1 − 1 */
      real *ob0 = ob + (size_t)r0 * ldo;
      for (int t = 0; t < m; t++) rmax[t] = -INFINITY, rsum[t] = 0.0;
      for (int c0 = 0; c0 < kend; c0 += BK) {
        const int c1 = c0 + BK < kend ? c0 + BK : kend, n = c1 - c0;
        product(pack, CblasNoTrans, CblasTrans, m, n, HS,
                scale, qb + (size_t)r0 * ldq, ldq, kb + (size_t)c0 * ldkv, ldkv, 0.0f, S, n);
        for (int t = r0; t < r1; t++) {
          real *row = S + (size_t)(t - r0) * n;
          const int lim = qoff + t + 1, nv = lim < c1 ? lim - c0 : n; /* keys c0 .. min(c1, lim) */
          if (nv <= 0) { /* the chunk's keys all after row t: nothing to add */
            memset(row, 0, sizeof(real) * (size_t)n);
            continue;
          }
          const real cmax = row_max(row, nv), mold = c0 == 0 ? -INFINITY : rmax[t - r0];
          const real mnew = cmax > mold ? cmax : mold;
          double sum = 0.0;
          if (vrows) {
            sum = vrows->exp_sum((float *)row, (const float *)row, (float)mnew, (size_t)nv);
          } else {
            for (int j = 0; j < nv; j++) {
              row[j] = real_exp(row[j] - mnew);
              sum += row[j];
            }
          }
          if (c0 == 0) {
            rsum[t - r0] = sum;
          } else { /* the earlier chunks' terms were taken against mold */
            const real alpha = real_exp(mold - mnew);
            rsum[t - r0] = rsum[t - r0] * alpha + sum;
            if (alpha != 1) {
              real *orow = ob + (size_t)t * ldo;
              for (int d = 0; d < HS; d++) orow[d] *= alpha;
            }
          }
          rmax[t - r0] = mnew;
          if (dr.d) {
            real mrow[ATTENTION_KEYS];
            drop_row(mrow, &dr, vrows, b, h, s->q0 + t, s->k0 + c0, nv, s->T);
            if (vrows)
              vrows->mul((float *)row, (const float *)mrow, (size_t)nv);
            else
              for (int j = 0; j < nv; j++) row[j] *= mrow[j];
          }
          if (nv < n) memset(row + nv, 0, sizeof(real) * (size_t)(n - nv));
        }
        product(pack, CblasNoTrans, CblasNoTrans, m, HS, n,
                1.0f, S, n, vb + (size_t)c0 * ldkv, ldkv, c0 == 0 ? 0.0f : 1.0f, ob0, ldo);
      }
      for (int t = r0; t < r1; t++) {
        real *orow = ob + (size_t)t * ldo;
        if (rsum[t - r0] == 0.0) { /* no key of the block at or before row t */
          memset(orow, 0, sizeof(real) * (size_t)HS);
          lb[t] = -INFINITY;
          continue;
        }
        const real inv = (real)(1.0 / rsum[t - r0]);
        for (int d = 0; d < HS; d++) orow[d] *= inv;
        lb[t] = (real)((double)rmax[t - r0] + log(rsum[t - r0]));
      }
    }
  }
}

/* The whole sequence: rows and keys 0 .. T − 1. */
static struct attention_block whole(int T)
{
  const struct attention_block s = { .T = T, .q0 = 0, .Tq = T, .k0 = 0, .Tk = T, .q_rows = T, .kv_rows = T };
  return s;
}

static void forward_ld(real *out, real *lse, real *scratch, const real *q, const real *k,
                       const real *v, int ldq, int ldkv, const struct attention_dropout *drop,
                       int B, int T, int NH, int NKV, int HS, int lowp)
{
  const struct attention_block s = whole(T);
  forward_span(out, lse, scratch, q, k, v, ldq, ldkv, drop, B, NH, NKV, HS, lowp, &s);
}

/* D[t] = Σ_d a_t,d · o_t,d in double for rows t < rows (ld apart): 8 rows side by side, each
 * row's sum the one-row loop's operations in its order (the same bits), so 8 chains of adds
 * overlap instead of each add waiting on the last (one row's chain was most of backward's time
 * outside its products: a double add's latency per element). */
static void row_dots(double *D, const real *a, const real *o, size_t ld, int rows, int HS)
{
  int t = 0;
  for (; t + 8 <= rows; t += 8) {
    double acc[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
    for (int d = 0; d < HS; d++)
      for (int r = 0; r < 8; r++) acc[r] += (double)a[(size_t)(t + r) * ld + d] * o[(size_t)(t + r) * ld + d];
    for (int r = 0; r < 8; r++) D[t + r] = acc[r];
  }
  for (; t < rows; t++) {
    double dot = 0.0;
    for (int d = 0; d < HS; d++) dot += (double)a[(size_t)t * ld + d] * o[(size_t)t * ld + d];
    D[t] = dot;
  }
}

/* As forward_span: q and dq rows ldq apart, k, v, dk and dv ldkv apart; out and dout packed.
 * Dgiven NULL (the whole sequence): dq, dk and dv assigned, D computed here from dout and out.
 * Dgiven set (a block of the ring): D_t read from it ((B, NH, q_rows), computed once per row from
 * the final out), out not read, and dq, dk, dv accumulated; a row sees the keys at or before it,
 * so rows that see none of a chunk add nothing. */
static void backward_span(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                          const real *q, const real *k, const real *v, int ldq, int ldkv,
                          const real *out, const real *lse, const real *Dgiven,
                          const struct attention_dropout *drop, int B, int NH, int NKV, int HS, int lowp,
                          const struct attention_block *s)
{
  const int group = NH / NKV, ldo = NH * HS, BK = chunk_keys(s->Tk), Tq = s->Tq;
  const int qoff = s->q0 - s->k0;
  const size_t stride = lowp ? task_stride_bf16(s->T, HS, 2) : 2 * span_scratch(Tq, s->Tk);
  const real scale = 1.0f / real_sqrt((real)HS);
  const struct drop_at dr = drop_resolve(drop);
  const struct vec_ops *vrows = VEC_FOR_REAL;
  const int parallel = tasks_parallel(B * NKV);
#pragma omp parallel for if (parallel)
  for (int task = 0; task < B * NKV; task++) {
    const int b = task / NKV, kvh = task % NKV;
    const real *kb = k + (size_t)b * s->kv_rows * ldkv + (size_t)kvh * HS;
    const real *vb = v + (size_t)b * s->kv_rows * ldkv + (size_t)kvh * HS;
    real *dkb = dk + (size_t)b * s->kv_rows * ldkv + (size_t)kvh * HS;
    real *dvb = dv + (size_t)b * s->kv_rows * ldkv + (size_t)kvh * HS;
    real *P = scratch + (size_t)task * stride;
    real *dS = P + span_scratch(Tq, s->Tk);
    bf16 *pack = lowp ? (bf16 *)(P + line_up(2 * task_scratch(s->T))) : NULL;
    double D[ATTENTION_BLOCK];
    for (int t = 0; t < s->Tk && !Dgiven; t++) { /* every product below adds into dk and dv */
      memset(dkb + (size_t)t * ldkv, 0, sizeof(real) * (size_t)HS);
      memset(dvb + (size_t)t * ldkv, 0, sizeof(real) * (size_t)HS);
    }
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
      const real *qb = q + (size_t)b * s->q_rows * ldq + (size_t)h * HS;
      const real *dob = dout + (size_t)b * s->q_rows * ldo + (size_t)h * HS;
      const real *lb = lse + ((size_t)b * NH + h) * s->q_rows;
      real *dqb = dq + (size_t)b * s->q_rows * ldq + (size_t)h * HS;
      for (int r0 = 0; r0 < Tq; r0 += ATTENTION_BLOCK) {
        const int r1 = r0 + ATTENTION_BLOCK < Tq ? r0 + ATTENTION_BLOCK : Tq, m = r1 - r0;
        const int kend = qoff + r1 < s->Tk ? qoff + r1 : s->Tk;
        /* D_t = dout_t · out_t = Σ_j P_tj dP_tj */
        if (Dgiven)
          for (int t = 0; t < m; t++) D[t] = Dgiven[((size_t)b * NH + h) * s->q_rows + (size_t)(r0 + t)];
        else
          row_dots(D, dob + (size_t)r0 * ldo, out + (size_t)b * s->q_rows * ldo + (size_t)h * HS + (size_t)r0 * ldo,
                   (size_t)ldo, m, HS);
        for (int c0 = 0; c0 < kend; c0 += BK) {
          const int c1 = c0 + BK < kend ? c0 + BK : kend, n = c1 - c0;
          product(pack, CblasNoTrans, CblasTrans, m, n, HS,
                  scale, qb + (size_t)r0 * ldq, ldq, kb + (size_t)c0 * ldkv, ldkv, 0.0f, P, n);
          product(pack, CblasNoTrans, CblasTrans, m, n, HS,
                  1.0f, dob + (size_t)r0 * ldo, ldo, vb + (size_t)c0 * ldkv, ldkv, 0.0f, dS, n);
          /* P = exp(s − lse); dP = (dout·vᵀ) ⊙ M; dS = P ⊙ (dP − D); P ⊙ M for dv. */
          for (int t = r0; t < r1; t++) {
            real *prow = P + (size_t)(t - r0) * n, *srow = dS + (size_t)(t - r0) * n;
            const int lim = qoff + t + 1, nv0 = lim < c1 ? lim - c0 : n, nv = nv0 > 0 ? nv0 : 0;
            const real Dt = (real)D[t - r0];
            if (nv == 0) {
              /* the chunk's keys all after row t: zeroed below */
            } else if (vrows) {
              vrows->exp_scale((float *)prow, (const float *)prow, (float)lb[t], 1.0f, (size_t)nv);
            } else {
              for (int j = 0; j < nv; j++) prow[j] = real_exp(prow[j] - lb[t]);
            }
            if (dr.d && vrows && nv) { /* the loop below in three passes: the same operations */
              real mrow[ATTENTION_KEYS];
              drop_row(mrow, &dr, vrows, b, h, s->q0 + t, s->k0 + c0, nv, s->T);
              vrows->mul((float *)srow, (const float *)mrow, (size_t)nv);
              for (int j = 0; j < nv; j++) srow[j] = prow[j] * (srow[j] - Dt);
              vrows->mul((float *)prow, (const float *)mrow, (size_t)nv);
            } else if (dr.d && nv) {
              real mrow[ATTENTION_KEYS];
              drop_row(mrow, &dr, vrows, b, h, s->q0 + t, s->k0 + c0, nv, s->T);
              for (int j = 0; j < nv; j++) {
                const real mij = mrow[j];
                srow[j] = prow[j] * (srow[j] * mij - Dt);
                prow[j] *= mij;
              }
            } else {
              for (int j = 0; j < nv; j++) srow[j] = prow[j] * (srow[j] - Dt);
            }
            if (nv < n) {
              memset(prow + nv, 0, sizeof(real) * (size_t)(n - nv));
              memset(srow + nv, 0, sizeof(real) * (size_t)(n - nv));
            }
          }
          /* dv[c0:c1] += (P ⊙ M)ᵀ·dout; scores = scale · q·kᵀ: dq[r0:r1] (+)= scale · dS·k,
           * dk[c0:c1] += scale · dSᵀ·q. */
          product(pack, CblasTrans, CblasNoTrans, n, HS, m,
                  1.0f, P, n, dob + (size_t)r0 * ldo, ldo, 1.0f, dvb + (size_t)c0 * ldkv, ldkv);
          product(pack, CblasNoTrans, CblasNoTrans, m, HS, n,
                  scale, dS, n, kb + (size_t)c0 * ldkv, ldkv, c0 == 0 && !Dgiven ? 0.0f : 1.0f,
                  dqb + (size_t)r0 * ldq, ldq);
          product(pack, CblasTrans, CblasNoTrans, n, HS, m,
                  scale, dS, n, qb + (size_t)r0 * ldq, ldq, 1.0f, dkb + (size_t)c0 * ldkv, ldkv);
        }
      }
    }
  }
}

static void backward_ld(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                        const real *q, const real *k, const real *v, int ldq, int ldkv,
                        const real *out, const real *lse, const struct attention_dropout *drop,
                        int B, int T, int NH, int NKV, int HS, int lowp)
{
  const struct attention_block s = whole(T);
  backward_span(dq, dk, dv, scratch, dout, q, k, v, ldq, ldkv, out, lse, NULL, drop, B, NH, NKV, HS, lowp, &s);
}

/* The entries of attention_span.h. */
size_t attention_span_scratch_n_elems(int B, int Tq, int Tk, int NH, int NKV)
{
  const size_t fwd = (size_t)NH, bwd = 2 * (size_t)NKV;
  return (size_t)B * span_scratch(Tq, Tk) * (fwd > bwd ? fwd : bwd);
}

void attention_span_forward(real *out, real *lse, real *scratch, const real *q, const real *k, const real *v,
                            const struct attention_dropout *drop, const struct attention_block *s, int B, int NH,
                            int NKV, int HS)
{
  forward_span(out, lse, scratch, q, k, v, NH * HS, NKV * HS, drop, B, NH, NKV, HS, 0, s);
}

void attention_span_backward(real *dq, real *dk, real *dv, real *scratch, const real *dout, const real *q,
                             const real *k, const real *v, const real *lse, const real *D,
                             const struct attention_dropout *drop, const struct attention_block *s, int B, int NH,
                             int NKV, int HS)
{
  backward_span(dq, dk, dv, scratch, dout, q, k, v, NH * HS, NKV * HS, NULL, lse, D, drop, B, NH, NKV, HS, 0, s);
}

void attention_span_row_dots(real *D, const real *dout, const real *out, int B, int Tq, int q_rows, int NH,
                             int HS)
{
  const size_t ldo = (size_t)NH * HS;
  double Db[ATTENTION_BLOCK];
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int r0 = 0; r0 < Tq; r0 += ATTENTION_BLOCK) {
        const int m = r0 + ATTENTION_BLOCK < Tq ? ATTENTION_BLOCK : Tq - r0;
        const size_t at = ((size_t)b * q_rows + (size_t)r0) * ldo + (size_t)h * HS;
        row_dots(Db, dout + at, out + at, ldo, m, HS);
        for (int t = 0; t < m; t++) D[((size_t)b * NH + h) * q_rows + (size_t)(r0 + t)] = (real)Db[t];
      }
}

/* The fused layout's row stride and k's and v's offsets in a row: [q | k | v]. */
static void forward_qkv(real *out, real *lse, real *scratch, const real *qkv, const struct attention_dropout *drop,
                        int B, int T, int NH, int NKV, int HS, int lowp)
{
  const int ld = (NH + 2 * NKV) * HS;
  forward_ld(out, lse, scratch, qkv, qkv + (size_t)NH * HS, qkv + (size_t)(NH + NKV) * HS, ld, ld, drop, B, T, NH,
             NKV, HS, lowp);
}

static void backward_qkv(real *dqkv, real *scratch, const real *dout, const real *qkv, const real *out,
                         const real *lse, const struct attention_dropout *drop, int B, int T, int NH, int NKV,
                         int HS, int lowp)
{
  const int ld = (NH + 2 * NKV) * HS;
  const size_t k0 = (size_t)NH * HS, v0 = (size_t)(NH + NKV) * HS;
  backward_ld(dqkv, dqkv + k0, dqkv + v0, scratch, dout, qkv, qkv + k0, qkv + v0, ld, ld, out, lse, drop, B, T, NH,
              NKV, HS, lowp);
}

void attention_forward(real *out, real *lse, real *scratch, const real *q, const real *k,
                       const real *v, const struct attention_dropout *drop, int B, int T, int NH,
                       int NKV, int HS)
{
  forward_ld(out, lse, scratch, q, k, v, NH * HS, NKV * HS, drop, B, T, NH, NKV, HS, 0);
}

void attention_forward_qkv(real *out, real *lse, real *scratch, const real *qkv,
                           const struct attention_dropout *drop, int B, int T, int NH, int NKV,
                           int HS)
{
  forward_qkv(out, lse, scratch, qkv, drop, B, T, NH, NKV, HS, 0);
}

void attention_backward(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                        const real *q, const real *k, const real *v, const real *out,
                        const real *lse, const struct attention_dropout *drop, int B, int T, int NH,
                        int NKV, int HS)
{
  backward_ld(dq, dk, dv, scratch, dout, q, k, v, NH * HS, NKV * HS, out, lse, drop, B, T, NH, NKV,
              HS, 0);
}

void attention_backward_qkv(real *dqkv, real *scratch, const real *dout, const real *qkv,
                            const real *out, const real *lse, const struct attention_dropout *drop,
                            int B, int T, int NH, int NKV, int HS)
{
  backward_qkv(dqkv, scratch, dout, qkv, out, lse, drop, B, T, NH, NKV, HS, 0);
}

/* The bf16 mode's entries: the same walk, sums and softmax, the products on bf16 operands. */
void attention_forward_bf16(real *out, real *lse, real *scratch, const real *q, const real *k,
                            const real *v, const struct attention_dropout *drop, int B, int T, int NH,
                            int NKV, int HS)
{
  forward_ld(out, lse, scratch, q, k, v, NH * HS, NKV * HS, drop, B, T, NH, NKV, HS, 1);
}

void attention_forward_qkv_bf16(real *out, real *lse, real *scratch, const real *qkv,
                                const struct attention_dropout *drop, int B, int T, int NH, int NKV,
                                int HS)
{
  forward_qkv(out, lse, scratch, qkv, drop, B, T, NH, NKV, HS, 1);
}

void attention_backward_bf16(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                             const real *q, const real *k, const real *v, const real *out,
                             const real *lse, const struct attention_dropout *drop, int B, int T,
                             int NH, int NKV, int HS)
{
  backward_ld(dq, dk, dv, scratch, dout, q, k, v, NH * HS, NKV * HS, out, lse, drop, B, T, NH, NKV,
              HS, 1);
}

void attention_backward_qkv_bf16(real *dqkv, real *scratch, const real *dout, const real *qkv,
                                 const real *out, const real *lse,
                                 const struct attention_dropout *drop, int B, int T, int NH, int NKV,
                                 int HS)
{
  backward_qkv(dqkv, scratch, dout, qkv, out, lse, drop, B, T, NH, NKV, HS, 1);
}
