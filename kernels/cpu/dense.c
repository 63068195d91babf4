/* Token-wise layers: embedding lookup, RMSNorm, linear (through real_gemm: sgemm, or dgemm in
 * the float64 build) and the residual add. Each row (token) is independent, so rows are split across OpenMP threads; gradients of
 * parameters shared by all rows are reduced over column blocks instead, so every thread owns
 * whole columns and the sum order is the same for any thread count. */
#include "blas.h"
#include <math.h>

#include "kernels.h"

enum { COLUMN_BLOCK = 64 };

void encoder_forward(real *out, const int *tokens, const real *wte, int BT, int C)
{
#pragma omp parallel for
  for (int bt = 0; bt < BT; bt++) {
    const real *row = wte + (size_t)tokens[bt] * C;
    real *o = out + (size_t)bt * C;
    for (int c = 0; c < C; c++) o[c] = row[c];
  }
}

void encoder_forward_shard(real *out, const int *tokens, const real *wte, int v0, int Vl,
                           int BT, int C)
{
#pragma omp parallel for
  for (int bt = 0; bt < BT; bt++) {
    const int row = tokens[bt] - v0;
    real *o = out + (size_t)bt * C;
    if (row < 0 || row >= Vl) {
      for (int c = 0; c < C; c++) o[c] = 0.0f;
      continue;
    }
    const real *w = wte + (size_t)row * C;
    for (int c = 0; c < C; c++) o[c] = w[c];
  }
}

void encoder_backward_shard(real *dwte, const real *dout, const int *tokens, int v0, int Vl,
                            int BT, int C)
{
  int n_blocks = (C + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for
  for (int blk = 0; blk < n_blocks; blk++) {
    int c0 = blk * COLUMN_BLOCK, c1 = c0 + COLUMN_BLOCK < C ? c0 + COLUMN_BLOCK : C;
    for (int bt = 0; bt < BT; bt++) {
      const int row = tokens[bt] - v0;
      if (row < 0 || row >= Vl)
        continue;
      real *drow = dwte + (size_t)row * C;
      const real *d = dout + (size_t)bt * C;
      for (int c = c0; c < c1; c++) drow[c] += d[c];
    }
  }
}

void encoder_backward(real *dwte, const real *dout, const int *tokens, int BT, int C)
{
  /* Several tokens may share a row of dwte: threads split columns, not tokens. */
  int n_blocks = (C + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for
  for (int blk = 0; blk < n_blocks; blk++) {
    int c0 = blk * COLUMN_BLOCK, c1 = c0 + COLUMN_BLOCK < C ? c0 + COLUMN_BLOCK : C;
    for (int bt = 0; bt < BT; bt++) {
      real *drow = dwte + (size_t)tokens[bt] * C;
      const real *d = dout + (size_t)bt * C;
      for (int c = c0; c < c1; c++) drow[c] += d[c];
    }
  }
}

/* 1 / sqrt(mean(x²) + eps) of one row, the sum in double. */
static real row_rstd(const real *x, int C, real eps)
{
  double ss = 0.0;
  for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
  return (real)(1.0 / sqrt(ss / C + eps));
}

void rmsnorm_forward(real *out, real *rstd, const real *inp, const real *weight,
                     int BT, int C, real eps)
{
#pragma omp parallel for
  for (int bt = 0; bt < BT; bt++) {
    const real *x = inp + (size_t)bt * C;
    real *o = out + (size_t)bt * C;
    const real r = row_rstd(x, C, eps);
    for (int c = 0; c < C; c++) o[c] = x[c] * r * weight[c];
    rstd[bt] = r;
  }
}

#if !REAL_IS_DOUBLE
/* rmsnorm_forward's values, element for element, written rounded to bf16 (ops.h) */
void rmsnorm_forward_bf16(bf16 *out, real *rstd, const real *inp, const real *weight, int BT,
                          int C, real eps)
{
#pragma omp parallel for
  for (int bt = 0; bt < BT; bt++) {
    const real *x = inp + (size_t)bt * C;
    bf16 *o = out + (size_t)bt * C;
    const real r = row_rstd(x, C, eps);
    for (int c = 0; c < C; c++) o[c] = bf16_from_float(x[c] * r * weight[c]);
    rstd[bt] = r;
  }
}
#endif

void rmsnorm_backward(real *dinp, real *dweight, const real *dout, const real *inp,
                      const real *weight, const real *rstd, int BT, int C)
{
  /* dweight first: dinp may overwrite dout. dweight[c] += Σ_bt dout · x · rstd. */
  int n_blocks = (C + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for
  for (int blk = 0; blk < n_blocks; blk++) {
    int c0 = blk * COLUMN_BLOCK, c1 = c0 + COLUMN_BLOCK < C ? c0 + COLUMN_BLOCK : C;
    double acc[COLUMN_BLOCK] = { 0 };
    for (int bt = 0; bt < BT; bt++) {
      const real *x = inp + (size_t)bt * C, *d = dout + (size_t)bt * C;
      for (int c = c0; c < c1; c++) acc[c - c0] += (double)d[c] * x[c] * rstd[bt];
    }
    for (int c = c0; c < c1; c++) dweight[c] += (real)acc[c - c0];
  }
  /* y_c = g_c x_c r with r = (mean(x²) + eps)^(-1/2), dr/dx_j = −r³ x_j / C:
   * dx_j = r g_j dy_j − (r³ / C) x_j Σ_c dy_c g_c x_c. */
#pragma omp parallel for
  for (int bt = 0; bt < BT; bt++) {
    const real *x = inp + (size_t)bt * C, *d = dout + (size_t)bt * C;
    real *dx = dinp + (size_t)bt * C;
    double r = rstd[bt], dot = 0.0;
    for (int c = 0; c < C; c++) dot += (double)d[c] * weight[c] * x[c];
    real k = (real)(r * r * r * dot / C);
    for (int c = 0; c < C; c++) dx[c] = (real)r * weight[c] * d[c] - k * x[c];
  }
}

void linear_forward(real *out, const real *inp, const real *weight, int BT, int IC, int OC)
{
  if (BT == 0 || OC == 0) return;
  real_gemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, IC,
              1.0f, inp, IC, weight, IC, 0.0f, out, OC);
}

void linear_forward_acc(real *out, const real *inp, const real *weight, int BT, int IC, int OC)
{
  if (BT == 0 || OC == 0) return;
  real_gemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, IC,
              1.0f, inp, IC, weight, IC, 1.0f, out, OC);
}

void linear_backward(real *dinp, real *dweight, const real *dout, const real *inp,
                     const real *weight, int BT, int IC, int OC)
{
  if (BT == 0) return;
  if (dinp)
    real_gemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, IC, OC,
                1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
  real_gemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, BT,
              1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
}

void vec_add(real *out, const real *a, const real *b, size_t n_elems)
{
#pragma omp parallel for
  for (size_t i = 0; i < n_elems; i++) out[i] = a[i] + b[i];
}
