/* Rotary position embedding and causal self-attention with grouped KV heads.
 * Attention works one (batch, head) at a time with three sgemm calls, and keeps the (T, T)
 * probabilities for backward, which is what a CPU reference needs; the CUDA backend is free to
 * be flash-style behind the same signature. Query head h reads KV head h / (NH / NKV); in
 * backward several query heads add into the same dk, dv, so backward gives each OpenMP task one
 * (batch, KV head) and walks its query heads in order — no two threads write one element and
 * the sum order is fixed. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "kernels.h"

void rope_table(float *cos_table, float *sin_table, int T, int HS, double theta, int pos0)
{
  int half = HS / 2;
  for (int i = 0; i < half; i++) {
    double inv_freq = pow(theta, -2.0 * i / HS);
    for (int t = 0; t < T; t++) {
      double angle = (double)(pos0 + t) * inv_freq;
      cos_table[(size_t)t * half + i] = (float)cos(angle);
      sin_table[(size_t)t * half + i] = (float)sin(angle);
    }
  }
}

/* sign = +1 rotates by the angle (forward), −1 by its negative (backward: the transpose). */
static void rope_rotate(float *out, const float *inp, const float *cos_tab, const float *sin_tab,
                        int B, int T, int NHx, int HS, float sign)
{
  int half = HS / 2;
  long n_rows = (long)B * T * NHx;
#pragma omp parallel for
  for (long row = 0; row < n_rows; row++) {
    int t = (int)((row / NHx) % T);
    const float *x = inp + (size_t)row * HS, *c = cos_tab + (size_t)t * half;
    const float *s = sin_tab + (size_t)t * half;
    float *y = out + (size_t)row * HS;
    for (int i = 0; i < half; i++) {
      float x1 = x[i], x2 = x[i + half], si = sign * s[i];
      y[i] = x1 * c[i] - x2 * si;
      y[i + half] = x2 * c[i] + x1 * si;
    }
  }
}

void rope_forward(float *out, const float *inp, const float *cos_table, const float *sin_table,
                  int B, int T, int NHx, int HS)
{
  rope_rotate(out, inp, cos_table, sin_table, B, T, NHx, HS, 1.0f);
}

void rope_backward(float *dinp, const float *dout, const float *cos_table,
                   const float *sin_table, int B, int T, int NHx, int HS)
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

void attention_forward(float *out, float *probs, float *scratch, const float *q, const float *k,
                       const float *v, const float *dropmask, int B, int T, int NH, int NKV,
                       int HS)
{
  const int group = NH / NKV, ldq = NH * HS, ldkv = NKV * HS;
  const float scale = 1.0f / sqrtf((float)HS);
  const size_t TT = (size_t)T * T;
  int blas_threads, parallel = tasks_parallel_begin(B * NH, &blas_threads);
#pragma omp parallel for if (parallel)
  for (int task = 0; task < B * NH; task++) {
    int b = task / NH, h = task % NH, kvh = h / group;
    const float *qb = q + (size_t)b * T * ldq + (size_t)h * HS;
    const float *kb = k + (size_t)b * T * ldkv + (size_t)kvh * HS;
    const float *vb = v + (size_t)b * T * ldkv + (size_t)kvh * HS;
    float *P = probs + (size_t)task * TT;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS,
                scale, qb, ldq, kb, ldkv, 0.0f, P, T);
    for (int t = 0; t < T; t++) {
      float *row = P + (size_t)t * T;
      float max = -INFINITY;
      for (int j = 0; j <= t; j++) max = row[j] > max ? row[j] : max;
      double sum = 0.0;
      for (int j = 0; j <= t; j++) {
        row[j] = expf(row[j] - max);
        sum += row[j];
      }
      float inv_sum = (float)(1.0 / sum);
      for (int j = 0; j <= t; j++) row[j] *= inv_sum;
      for (int j = t + 1; j < T; j++) row[j] = 0.0f;
    }
    const float *A = P;
    if (dropmask) {
      float *dropped = scratch + (size_t)task * TT;
      const float *M = dropmask + (size_t)task * TT;
      for (size_t i = 0; i < TT; i++) dropped[i] = P[i] * M[i];
      A = dropped;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T,
                1.0f, A, T, vb, ldkv, 0.0f, out + (size_t)b * T * ldq + (size_t)h * HS, ldq);
  }
  tasks_parallel_end(parallel, blas_threads);
}

void attention_backward(float *dq, float *dk, float *dv, float *scratch, const float *dout,
                        const float *q, const float *k, const float *v, const float *probs,
                        const float *dropmask, int B, int T, int NH, int NKV, int HS)
{
  const int group = NH / NKV, ldq = NH * HS, ldkv = NKV * HS;
  const float scale = 1.0f / sqrtf((float)HS);
  const size_t TT = (size_t)T * T;
  int blas_threads, parallel = tasks_parallel_begin(B * NKV, &blas_threads);
#pragma omp parallel for if (parallel)
  for (int task = 0; task < B * NKV; task++) {
    int b = task / NKV, kvh = task % NKV;
    const float *kb = k + (size_t)b * T * ldkv + (size_t)kvh * HS;
    const float *vb = v + (size_t)b * T * ldkv + (size_t)kvh * HS;
    float *dkb = dk + (size_t)b * T * ldkv + (size_t)kvh * HS;
    float *dvb = dv + (size_t)b * T * ldkv + (size_t)kvh * HS;
    float *dS = scratch + (size_t)task * 2 * TT, *dropped = dS + TT;
    for (int t = 0; t < T; t++) {
      memset(dkb + (size_t)t * ldkv, 0, sizeof(float) * HS);
      memset(dvb + (size_t)t * ldkv, 0, sizeof(float) * HS);
    }
    for (int h = kvh * group; h < (kvh + 1) * group; h++) {
      const float *P = probs + ((size_t)b * NH + h) * TT;
      const float *M = dropmask ? dropmask + ((size_t)b * NH + h) * TT : NULL;
      const float *qb = q + (size_t)b * T * ldq + (size_t)h * HS;
      const float *dob = dout + (size_t)b * T * ldq + (size_t)h * HS;
      float *dqb = dq + (size_t)b * T * ldq + (size_t)h * HS;
      const float *A = P;
      if (M) {
        for (size_t i = 0; i < TT; i++) dropped[i] = P[i] * M[i];
        A = dropped;
      }
      /* out = A·v: dv += Aᵀ·dout, dA = dout·vᵀ (into dS). */
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T,
                  1.0f, A, T, dob, ldq, 1.0f, dvb, ldkv);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS,
                  1.0f, dob, ldq, vb, ldkv, 0.0f, dS, T);
      /* dP = dA ⊙ M; softmax backward dS = P ⊙ (dP − Σ_j P_j dP_j), 0 above the diagonal. */
      for (int t = 0; t < T; t++) {
        float *row = dS + (size_t)t * T;
        const float *prow = P + (size_t)t * T;
        if (M)
          for (int j = 0; j <= t; j++) row[j] *= M[(size_t)t * T + j];
        double dot = 0.0;
        for (int j = 0; j <= t; j++) dot += (double)prow[j] * row[j];
        for (int j = 0; j <= t; j++) row[j] = prow[j] * (row[j] - (float)dot);
        for (int j = t + 1; j < T; j++) row[j] = 0.0f;
      }
      /* scores = scale · q·kᵀ: dq = scale · dS·k, dk += scale · dSᵀ·q. */
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T,
                  scale, dS, T, kb, ldkv, 0.0f, dqb, ldq);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T,
                  scale, dS, T, qb, ldq, 1.0f, dkb, ldkv);
    }
  }
  tasks_parallel_end(parallel, blas_threads);
}
