/* Rotary position embedding and causal self-attention with grouped KV heads.
 * Attention works one (batch, head) at a time with three sgemm calls, and keeps the (T, T)
 * probabilities for backward, which is what a CPU reference needs; the CUDA backend is free to
 * be flash-style behind the same signature. Query head h reads KV head h / (NH / NKV); in
 * backward several query heads add into the same dk, dv, so backward gives each OpenMP task one
 * (batch, KV head) and walks its query heads in order — no two threads write one element and
 * the sum order is fixed. */
#include "blas.h"
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels.h"

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

/* sign = +1 rotates by the angle (forward), −1 by its negative (backward: the transpose). */
static void rope_rotate(real *out, const real *inp, const real *cos_tab, const real *sin_tab,
                        int B, int T, int NHx, int HS, real sign)
{
  int half = HS / 2;
  long n_rows = (long)B * T * NHx;
#pragma omp parallel for
  for (long row = 0; row < n_rows; row++) {
    int t = (int)((row / NHx) % T);
    const real *x = inp + (size_t)row * HS, *c = cos_tab + (size_t)t * half;
    const real *s = sin_tab + (size_t)t * half;
    real *y = out + (size_t)row * HS;
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
  rope_rotate(out, inp, cos_table, sin_table, B, T, NHx, HS, 1.0f);
}

void rope_backward(real *dinp, const real *dout, const real *cos_table,
                   const real *sin_table, int B, int T, int NHx, int HS)
{
  rope_rotate(dinp, dout, cos_table, sin_table, B, T, NHx, HS, -1.0f);
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

void attention_forward(real *out, real *probs, real *scratch, const real *q, const real *k,
                       const real *v, const real *dropmask, int B, int T, int NH, int NKV,
                       int HS)
{
  const int group = NH / NKV, ldq = NH * HS, ldkv = NKV * HS;
  const real scale = 1.0f / real_sqrt((real)HS);
  const size_t TT = (size_t)T * T;
  int blas_threads, parallel = tasks_parallel_begin(B * NH, &blas_threads);
#pragma omp parallel for if (parallel)
  for (int task = 0; task < B * NH; task++) {
    int b = task / NH, h = task % NH, kvh = h / group;
    const real *qb = q + (size_t)b * T * ldq + (size_t)h * HS;
    const real *kb = k + (size_t)b * T * ldkv + (size_t)kvh * HS;
    const real *vb = v + (size_t)b * T * ldkv + (size_t)kvh * HS;
    real *P = probs + (size_t)task * TT;
    real_gemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS,
                scale, qb, ldq, kb, ldkv, 0.0f, P, T);
    for (int t = 0; t < T; t++) {
      real *row = P + (size_t)t * T;
      real max = -INFINITY;
      for (int j = 0; j <= t; j++) max = row[j] > max ? row[j] : max;
      double sum = 0.0;
      for (int j = 0; j <= t; j++) {
        row[j] = real_exp(row[j] - max);
        sum += row[j];
      }
      real inv_sum = (real)(1.0 / sum);
      for (int j = 0; j <= t; j++) row[j] *= inv_sum;
      for (int j = t + 1; j < T; j++) row[j] = 0.0f;
    }
    const real *A = P;
    if (dropmask) {
      real *dropped = scratch + (size_t)task * TT;
      const real *M = dropmask + (size_t)task * TT;
      for (size_t i = 0; i < TT; i++) dropped[i] = P[i] * M[i];
      A = dropped;
    }
    real_gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T,
                1.0f, A, T, vb, ldkv, 0.0f, out + (size_t)b * T * ldq + (size_t)h * HS, ldq);
  }
  tasks_parallel_end(parallel, blas_threads);
}

void attention_backward(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                        const real *q, const real *k, const real *v, const real *probs,
                        const real *dropmask, int B, int T, int NH, int NKV, int HS)
{
  const int group = NH / NKV, ldq = NH * HS, ldkv = NKV * HS;
  const real scale = 1.0f / real_sqrt((real)HS);
  const size_t TT = (size_t)T * T;
  int blas_threads, parallel = tasks_parallel_begin(B * NKV, &blas_threads);
#pragma omp parallel for if (parallel)
  for (int task = 0; task < B * NKV; task++) {
    int b = task / NKV, kvh = task % NKV;
    const real *kb = k + (size_t)b * T * ldkv + (size_t)kvh * HS;
    const real *vb = v + (size_t)b * T * ldkv + (size_t)kvh * HS;
    real *dkb = dk + (size_t)b * T * ldkv + (size_t)kvh * HS;
    real *dvb = dv + (size_t)b * T * ldkv + (size_t)kvh * HS;
    real *dS = scratch + (size_t)task * 2 * TT, *dropped = dS + TT;
    for (int t = 0; t < T; t++) {
      memset(dkb + (size_t)t * ldkv, 0, sizeof(real) * HS);
      memset(dvb + (size_t)t * ldkv, 0, sizeof(real) * HS);
    }
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
      const real *P = probs + ((size_t)b * NH + h) * TT;
      const real *M = dropmask ? dropmask + ((size_t)b * NH + h) * TT : NULL;
      const real *qb = q + (size_t)b * T * ldq + (size_t)h * HS;
      const real *dob = dout + (size_t)b * T * ldq + (size_t)h * HS;
      real *dqb = dq + (size_t)b * T * ldq + (size_t)h * HS;
      const real *A = P;
      if (M) {
        for (size_t i = 0; i < TT; i++) dropped[i] = P[i] * M[i];
        A = dropped;
      }
      /* out = A·v: dv += Aᵀ·dout, dA = dout·vᵀ (into dS). */
      real_gemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T,
                  1.0f, A, T, dob, ldq, 1.0f, dvb, ldkv);
      real_gemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS,
                  1.0f, dob, ldq, vb, ldkv, 0.0f, dS, T);
      /* dP = dA ⊙ M; softmax backward dS = P ⊙ (dP − Σ_j P_j dP_j), 0 above the diagonal. */
      for (int t = 0; t < T; t++) {
        real *row = dS + (size_t)t * T;
        const real *prow = P + (size_t)t * T;
        if (M)
          for (int j = 0; j <= t; j++) row[j] *= M[(size_t)t * T + j];
        double dot = 0.0;
        for (int j = 0; j <= t; j++) dot += (double)prow[j] * row[j];
        for (int j = 0; j <= t; j++) row[j] = prow[j] * (row[j] - (real)dot);
        for (int j = t + 1; j < T; j++) row[j] = 0.0f;
      }
      /* scores = scale · q·kᵀ: dq = scale · dS·k, dk += scale · dSᵀ·q. */
      real_gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T,
                  scale, dS, T, kb, ldkv, 0.0f, dqb, ldq);
      real_gemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T,
                  scale, dS, T, qb, ldq, 1.0f, dkb, ldkv);
    }
  }
  tasks_parallel_end(parallel, blas_threads);
}
