/* Rotary position embedding and causal self-attention with grouped KV heads.
 * Attention works one (batch, head) at a time and keeps the (T, T) probabilities for backward,
 * which is what a CPU reference needs; the CUDA backend is free to be flash-style behind the
 * same signature. Each (batch, head) is walked in blocks of ATTENTION_BLOCK query rows: rows
 * [r0, r1) meet keys [0, r1) only, so the sgemms skip the key blocks above the causal diagonal
 * (at T = 128 with blocks of 64, 1/4 of the full square's products), and a block's scores are
 * soft-maxed while they are in cache. The probabilities are stored as the full (B, NH, T, T)
 * with zeros above the diagonal, written once. A row's softmax is the same operations as on the
 * full square, so probs are those of the full-square kernel wherever the sgemm rounds a score
 * alike at every shape (OpenBLAS's SkylakeX, Cooperlake and Sandybridge kernels do; Haswell's
 * rounds a few scores a unit apart by their tile position). Query head h reads KV head
 * h / (NH / NKV); in backward several query heads add into the same dk, dv, so backward gives
 * each OpenMP task one (batch, KV head) and walks its query heads, and each head's blocks, in
 * a fixed order — no two threads write one element and the sum order is fixed. */
#include "blas.h"
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels.h"
#include "vec.h"

/* Query rows per block. Measured with bench/bench_attention, one thread (host/runtime/README.md,
 * "Attention on CPU"): under OpenBLAS's SkylakeX kernel 64 is as fast as 32 at T = 128 and up to
 * 10% faster at T = 512 (HS 128), and keeps the probabilities bit-identical to the full-square
 * kernel (with 32 that kernel rounds some scores of the narrower sgemms differently); under
 * Haswell 32 is 7-13% faster at T = 128, the same at T = 512; 128 and 16 are slower in both. A
 * build may set another (-DATTENTION_BLOCK=N) to measure. */
#ifndef ATTENTION_BLOCK
#define ATTENTION_BLOCK 64
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
  int half = HS / 2;
  long n_rows = (long)B * T * NHx;
#pragma omp parallel for
  for (long row = 0; row < n_rows; row++) {
    const size_t token = (size_t)(row / NHx), at = token * ld + (size_t)(row % NHx) * HS;
    int t = (int)(token % (size_t)T);
    const real *x = inp + at, *c = cos_tab + (size_t)t * half;
    const real *s = sin_tab + (size_t)t * half;
    real *y = out + at;
    for (int i = 0; i < half; i++) {
      real x1 = x[i], x2 = x[i + half], si = sign * s[i];
      y[i] = x1 * c[i] - x2 * si;
      y[i + half] = x2 * c[i] + x1 * si;
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

size_t attention_scratch_n_elems(int B, int T, int NH, int NKV)
{
  size_t per_row = (size_t)(NH > 2 * NKV ? NH : 2 * NKV);
  return (size_t)B * T * T * per_row;
}

/* With at least as many tasks as OpenMP threads, run tasks in parallel with single-threaded
 * sgemm; otherwise run them one after another and let OpenBLAS use its threads inside each
 * sgemm. Returns whether the task loop is parallel; *blas_threads keeps the setting to restore. */
static int tasks_parallel_begin(int n_tasks, int *blas_threads)
{
  *blas_threads = openblas_get_num_threads();
  int parallel = omp_get_max_threads() > 1 && n_tasks >= omp_get_max_threads();
  if (parallel && *blas_threads > 1) openblas_set_num_threads(1);
  return parallel;
}

static void tasks_parallel_end(int parallel, int blas_threads)
{
  if (parallel && blas_threads > 1) openblas_set_num_threads(blas_threads);
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

/* Rows [r0, r1) of the dropped probabilities A = P ⊙ M against keys [0, r1), packed with
 * leading dimension r1 (zero above the diagonal, like P). P and M are whole (T, T) squares. */
static void dropped_block(real *A, const real *P, const real *M, int T, int r0, int r1)
{
  for (int t = r0; t < r1; t++) {
    real *row = A + (size_t)(t - r0) * r1;
    const real *prow = P + (size_t)t * T, *mrow = M + (size_t)t * T;
    for (int j = 0; j <= t; j++) row[j] = prow[j] * mrow[j];
    for (int j = t + 1; j < r1; j++) row[j] = 0.0f;
  }
}

/* q's token rows ldq apart, k's and v's ldkv apart (packed: NH · HS and NKV · HS; the fused
 * q|k|v product's rows: both (NH + 2 NKV) · HS); out packed (NH · HS). */
static void forward_ld(real *out, real *probs, real *scratch, const real *q, const real *k,
                       const real *v, int ldq, int ldkv, const real *dropmask, int B, int T,
                       int NH, int NKV, int HS)
{
  const int group = NH / NKV, ldo = NH * HS;
  const real scale = 1.0f / real_sqrt((real)HS);
  const size_t TT = (size_t)T * T;
  const struct vec_ops *vrows = VEC_FOR_REAL;
  int blas_threads, parallel = tasks_parallel_begin(B * NH, &blas_threads);
#pragma omp parallel for if (parallel)
  for (int task = 0; task < B * NH; task++) {
    int b = task / NH, h = task % NH, kvh = h / group;
    const real *qb = q + (size_t)b * T * ldq + (size_t)h * HS;
    const real *kb = k + (size_t)b * T * ldkv + (size_t)kvh * HS;
    const real *vb = v + (size_t)b * T * ldkv + (size_t)kvh * HS;
    real *ob = out + (size_t)b * T * ldo + (size_t)h * HS;
    real *P = probs + (size_t)task * TT;
    const real *M = dropmask ? dropmask + (size_t)task * TT : NULL;
    real *dropped = M ? scratch + (size_t)task * TT : NULL; /* one block: ≤ BLOCK · T */
    for (int r0 = 0; r0 < T; r0 += ATTENTION_BLOCK) {
      const int r1 = r0 + ATTENTION_BLOCK < T ? r0 + ATTENTION_BLOCK : T, m = r1 - r0;
      real *Pb = P + (size_t)r0 * T;
      /* Scores of the block's rows against keys [0, r1) only; the rest of each row is 0. */
      real_gemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, HS,
                scale, qb + (size_t)r0 * ldq, ldq, kb, ldkv, 0.0f, Pb, T);
      for (int t = r0; t < r1; t++) {
        real *row = P + (size_t)t * T;
        real max = row_max(row, t + 1);
        if (vrows) { /* exp(s − max) and its sum in double, then the scaling, in vectors */
          const double sum = vrows->exp_sum((float *)row, (const float *)row, (float)max, (size_t)t + 1);
          vrows->scale((float *)row, (size_t)t + 1, (float)(1.0 / sum));
        } else {
          double sum = 0.0;
          for (int j = 0; j <= t; j++) {
            row[j] = real_exp(row[j] - max);
            sum += row[j];
          }
          real inv_sum = (real)(1.0 / sum);
          for (int j = 0; j <= t; j++) row[j] *= inv_sum;
        }
        if (t + 1 < T) memset(row + t + 1, 0, sizeof(real) * (size_t)(T - t - 1));
      }
      const real *A = Pb;
      int lda = T;
      if (M) {
        dropped_block(dropped, P, M, T, r0, r1);
        A = dropped;
        lda = r1;
      }
      real_gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, r1,
                1.0f, A, lda, vb, ldkv, 0.0f, ob + (size_t)r0 * ldo, ldo);
    }
  }
  tasks_parallel_end(parallel, blas_threads);
}

void attention_forward(real *out, real *probs, real *scratch, const real *q, const real *k,
                       const real *v, const real *dropmask, int B, int T, int NH, int NKV,
                       int HS)
{
  forward_ld(out, probs, scratch, q, k, v, NH * HS, NKV * HS, dropmask, B, T, NH, NKV, HS);
}

void attention_forward_qkv(real *out, real *probs, real *scratch, const real *qkv,
                           const real *dropmask, int B, int T, int NH, int NKV, int HS)
{
  const int ld = (NH + 2 * NKV) * HS;
  forward_ld(out, probs, scratch, qkv, qkv + (size_t)NH * HS, qkv + (size_t)(NH + NKV) * HS, ld, ld,
             dropmask, B, T, NH, NKV, HS);
}

/* As forward_ld: q and dq rows ldq apart, k, v, dk and dv ldkv apart; dout packed. */
static void backward_ld(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                        const real *q, const real *k, const real *v, int ldq, int ldkv,
                        const real *probs, const real *dropmask, int B, int T, int NH, int NKV,
                        int HS)
{
  const int group = NH / NKV, ldo = NH * HS;
  const real scale = 1.0f / real_sqrt((real)HS);
  const size_t TT = (size_t)T * T;
  const int last_r0 = T > 0 ? (T - 1) / ATTENTION_BLOCK * ATTENTION_BLOCK : 0;
  int blas_threads, parallel = tasks_parallel_begin(B * NKV, &blas_threads);
#pragma omp parallel for if (parallel)
  for (int task = 0; task < B * NKV; task++) {
    int b = task / NKV, kvh = task % NKV;
    const real *kb = k + (size_t)b * T * ldkv + (size_t)kvh * HS;
    const real *vb = v + (size_t)b * T * ldkv + (size_t)kvh * HS;
    real *dkb = dk + (size_t)b * T * ldkv + (size_t)kvh * HS;
    real *dvb = dv + (size_t)b * T * ldkv + (size_t)kvh * HS;
    real *dS = scratch + (size_t)task * 2 * TT, *dropped = dS + TT; /* one block each */
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
      const real *P = probs + ((size_t)b * NH + h) * TT;
      const real *M = dropmask ? dropmask + ((size_t)b * NH + h) * TT : NULL;
      const real *qb = q + (size_t)b * T * ldq + (size_t)h * HS;
      const real *dob = dout + (size_t)b * T * ldo + (size_t)h * HS;
      real *dqb = dq + (size_t)b * T * ldq + (size_t)h * HS;
      /* The last block first: it reaches every key, so the group's first head assigns dk and
       * dv there (beta 0) and every later product adds into them. */
      for (int r0 = last_r0; T > 0 && r0 >= 0; r0 -= ATTENTION_BLOCK) {
        const int r1 = r0 + ATTENTION_BLOCK < T ? r0 + ATTENTION_BLOCK : T, m = r1 - r0;
        const real beta = h == kvh * group && r0 == last_r0 ? 0.0f : 1.0f;
        const real *Pb = P + (size_t)r0 * T, *A = Pb;
        int lda = T;
        if (M) {
          dropped_block(dropped, P, M, T, r0, r1);
          A = dropped;
          lda = r1;
        }
        /* out = A·v: dv[0:r1] += Aᵀ·dout, dA = dout·vᵀ (into dS, leading dimension r1). */
        real_gemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, HS, m,
                  1.0f, A, lda, dob + (size_t)r0 * ldo, ldo, beta, dvb, ldkv);
        real_gemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1, HS,
                  1.0f, dob + (size_t)r0 * ldo, ldo, vb, ldkv, 0.0f, dS, r1);
        /* dP = dA ⊙ M; softmax backward dS = P ⊙ (dP − Σ_j P_j dP_j), 0 above the diagonal. */
        for (int t = r0; t < r1; t++) {
          real *row = dS + (size_t)(t - r0) * r1;
          const real *prow = P + (size_t)t * T;
          if (M)
            for (int j = 0; j <= t; j++) row[j] *= M[(size_t)t * T + j];
          double dot = 0.0;
          for (int j = 0; j <= t; j++) dot += (double)prow[j] * row[j];
          for (int j = 0; j <= t; j++) row[j] = prow[j] * (row[j] - (real)dot);
          for (int j = t + 1; j < r1; j++) row[j] = 0.0f;
        }
        /* scores = scale · q·kᵀ: dq[r0:r1] = scale · dS·k, dk[0:r1] += scale · dSᵀ·q. */
        real_gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, HS, r1,
                  scale, dS, r1, kb, ldkv, 0.0f, dqb + (size_t)r0 * ldq, ldq);
        real_gemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, HS, m,
                  scale, dS, r1, qb + (size_t)r0 * ldq, ldq, beta, dkb, ldkv);
      }
    }
  }
  tasks_parallel_end(parallel, blas_threads);
}

void attention_backward(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                        const real *q, const real *k, const real *v, const real *probs,
                        const real *dropmask, int B, int T, int NH, int NKV, int HS)
{
  backward_ld(dq, dk, dv, scratch, dout, q, k, v, NH * HS, NKV * HS, probs, dropmask, B, T, NH, NKV,
              HS);
}

void attention_backward_qkv(real *dqkv, real *scratch, const real *dout, const real *qkv,
                            const real *probs, const real *dropmask, int B, int T, int NH, int NKV,
                            int HS)
{
  const int ld = (NH + 2 * NKV) * HS;
  const size_t k0 = (size_t)NH * HS, v0 = (size_t)(NH + NKV) * HS;
  backward_ld(dqkv, dqkv + k0, dqkv + v0, scratch, dout, qkv, qkv + k0, qkv + v0, ld, ld, probs,
              dropmask, B, T, NH, NKV, HS);
}
