/* Token-wise layers: embedding lookup, RMSNorm, linear (through gemm_rows: sgemm, or dgemm in
 * the float64 build, in row tiles) and the residual add. Each row (token) is independent, so rows are split across OpenMP threads; gradients of
 * parameters shared by all rows are reduced over column blocks instead, so every thread owns
 * whole columns and the sum order is the same for any thread count. */
#include "blas.h"
#include <math.h>

#include "kernels.h"
#include "vec.h"

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

/* The row sums below run ROW_GROUP rows side by side: each row's sum is still one chain of adds
 * in column order (the single-row loop's bits, whatever the grouping or the thread count), but
 * the rows' chains overlap instead of each add waiting on the one before it. */
enum { ROW_GROUP = 8 };

/* Σ_c x_c² in double of each of `rows` ≤ ROW_GROUP rows of C elements, one after another. */
static void group_sumsq(double *ss, const real *x, int rows, int C)
{
  double s[ROW_GROUP] = { 0 };
  if (rows == ROW_GROUP) {
    for (int c = 0; c < C; c++)
      for (int j = 0; j < ROW_GROUP; j++) {
        const double v = x[(size_t)j * C + c];
        s[j] += v * v;
      }
  } else {
    for (int j = 0; j < rows; j++)
      for (int c = 0; c < C; c++) {
        const double v = x[(size_t)j * C + c];
        s[j] += v * v;
      }
  }
  for (int j = 0; j < rows; j++) ss[j] = s[j];
}

/* Σ_c d_c · w_c · x_c in double (multiplied in that order) of each of `rows` ≤ ROW_GROUP rows. */
static void group_dot(double *dot, const real *d, const real *w, const real *x, int rows, int C)
{
  double s[ROW_GROUP] = { 0 };
  if (rows == ROW_GROUP) {
    for (int c = 0; c < C; c++) {
      const double wc = w[c];
      for (int j = 0; j < ROW_GROUP; j++)
        s[j] += (double)d[(size_t)j * C + c] * wc * x[(size_t)j * C + c];
    }
  } else {
    for (int j = 0; j < rows; j++)
      for (int c = 0; c < C; c++) s[j] += (double)d[(size_t)j * C + c] * w[c] * x[(size_t)j * C + c];
  }
  for (int j = 0; j < rows; j++) dot[j] = s[j];
}

/* 1 / sqrt(mean(x²) + eps) of each of `rows` ≤ ROW_GROUP rows. */
static void group_rstd(real *r, const real *x, int rows, int C, real eps)
{
  double ss[ROW_GROUP];
  group_sumsq(ss, x, rows, C);
  for (int j = 0; j < rows; j++) r[j] = (real)(1.0 / sqrt(ss[j] / C + eps));
}

#define N_GROUPS(BT) (((BT) + ROW_GROUP - 1) / ROW_GROUP)
#define GROUP_ROWS(BT, g) ((BT) - (g) * ROW_GROUP < ROW_GROUP ? (BT) - (g) * ROW_GROUP : ROW_GROUP)

void rmsnorm_forward(real *out, real *rstd, const real *inp, const real *weight,
                     int BT, int C, real eps)
{
#pragma omp parallel for
  for (int g = 0; g < N_GROUPS(BT); g++) {
    const int bt0 = g * ROW_GROUP, rows = GROUP_ROWS(BT, g);
    group_rstd(rstd + bt0, inp + (size_t)bt0 * C, rows, C, eps);
    for (int bt = bt0; bt < bt0 + rows; bt++) {
      const real *x = inp + (size_t)bt * C, r = rstd[bt];
      real *o = out + (size_t)bt * C;
      for (int c = 0; c < C; c++) o[c] = x[c] * r * weight[c];
    }
  }
}

#if !REAL_IS_DOUBLE
/* rmsnorm_forward's values, element for element, written rounded to bf16 (ops.h) */
void rmsnorm_forward_bf16(bf16 *out, real *rstd, const real *inp, const real *weight, int BT,
                          int C, real eps)
{
#pragma omp parallel for
  for (int g = 0; g < N_GROUPS(BT); g++) {
    const int bt0 = g * ROW_GROUP, rows = GROUP_ROWS(BT, g);
    group_rstd(rstd + bt0, inp + (size_t)bt0 * C, rows, C, eps);
    for (int bt = bt0; bt < bt0 + rows; bt++) {
      const real *x = inp + (size_t)bt * C, r = rstd[bt];
      bf16 *o = out + (size_t)bt * C;
      for (int c = 0; c < C; c++) o[c] = bf16_from_float(x[c] * r * weight[c]);
    }
  }
}
#endif

void rmsnorm_backward(real *dinp, real *dweight, const real *dout, const real *inp,
                      const real *weight, const real *rstd, int BT, int C)
{
  /* dweight first: dinp may overwrite dout. dweight[c] += Σ_bt dout · x · rstd. Both passes on
   * the vector layer where it has a path (the same operations, the same bits). */
  const struct vec_ops *vrows = VEC_FOR_REAL;
  int n_blocks = (C + COLUMN_BLOCK - 1) / COLUMN_BLOCK;
#pragma omp parallel for
  for (int blk = 0; blk < n_blocks; blk++) {
    int c0 = blk * COLUMN_BLOCK, c1 = c0 + COLUMN_BLOCK < C ? c0 + COLUMN_BLOCK : C;
    double acc[COLUMN_BLOCK] = { 0 };
    for (int bt = 0; bt < BT; bt++) {
      const real *x = inp + (size_t)bt * C, *d = dout + (size_t)bt * C;
      if (vrows)
        vrows->norm_wgrad(acc, (const float *)d + c0, (const float *)x + c0, rstd[bt], (size_t)(c1 - c0));
      else
        for (int c = c0; c < c1; c++) acc[c - c0] += (double)d[c] * x[c] * rstd[bt];
    }
    for (int c = c0; c < c1; c++) dweight[c] += (real)acc[c - c0];
  }
  /* y_c = g_c x_c r with r = (mean(x²) + eps)^(-1/2), dr/dx_j = −r³ x_j / C:
   * dx_j = r g_j dy_j − (r³ / C) x_j Σ_c dy_c g_c x_c. */
#pragma omp parallel for
  for (int g = 0; g < N_GROUPS(BT); g++) {
    const int bt0 = g * ROW_GROUP, rows = GROUP_ROWS(BT, g);
    double dots[ROW_GROUP];
    group_dot(dots, dout + (size_t)bt0 * C, weight, inp + (size_t)bt0 * C, rows, C);
    for (int bt = bt0; bt < bt0 + rows; bt++) {
      const real *x = inp + (size_t)bt * C, *d = dout + (size_t)bt * C;
      real *dx = dinp + (size_t)bt * C;
      double r = rstd[bt], dot = dots[bt - bt0];
      real k = (real)(r * r * r * dot / C);
      if (vrows)
        vrows->norm_dx((float *)dx, (const float *)weight, (const float *)d, (const float *)x, (float)r, (float)k,
                       (size_t)C);
      else
        for (int c = 0; c < C; c++) dx[c] = (real)r * weight[c] * d[c] - k * x[c];
    }
  }
}

void linear_forward(real *out, const real *inp, const real *weight, int BT, int IC, int OC)
{
  if (BT == 0 || OC == 0) return;
  gemm_rows(CblasNoTrans, CblasTrans, BT, OC, IC,
            1.0f, inp, IC, weight, IC, 0.0f, out, OC);
}

void linear_forward_acc(real *out, const real *inp, const real *weight, int BT, int IC, int OC)
{
  if (BT == 0 || OC == 0) return;
  gemm_rows(CblasNoTrans, CblasTrans, BT, OC, IC,
            1.0f, inp, IC, weight, IC, 1.0f, out, OC);
}

void linear_backward(real *dinp, real *dweight, const real *dout, const real *inp,
                     const real *weight, int BT, int IC, int OC)
{
  if (BT == 0) return;
  if (dinp)
    gemm_rows(CblasNoTrans, CblasNoTrans, BT, IC, OC,
              1.0f, dout, OC, weight, IC, 0.0f, dinp, IC);
  if (dweight) /* NULL: the input gradient alone (a split backward's B) */
    gemm_rows(CblasTrans, CblasNoTrans, OC, IC, BT,
            1.0f, dout, OC, inp, IC, 1.0f, dweight, IC);
}

void vec_add(real *out, const real *a, const real *b, size_t n_elems)
{
#pragma omp parallel for
  for (size_t i = 0; i < n_elems; i++) out[i] = a[i] + b[i];
}
