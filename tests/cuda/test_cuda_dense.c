/* The CUDA backend's products and RoPE (kernels/cuda/cuda_dense.cu) against the CPU table:
 * linear (fp32 and bf16 operands) and RoPE, forward and backward, separate and fused q|k|v
 * layouts (the attention of that file: test_cuda_attention.c).
 *
 * Bounds. Where an output is a straight-line computation of sums and products (the linears),
 * each side is within γ_n · |the same computation on absolute values| of the exact result
 * (γ_n ≈ n · u, n the roundings along the longest path: the reduction lengths added), so the two
 * sides are within 2 · n · u of that "magnitude" computation, which the test computes in double
 * beside the reference; it is checked per element. The orders differ (cuBLAS' tiling, the CPU's
 * sgemm), so bits are not expected to match except where the operations are the same (RoPE: one
 * product each, no FMA on either side). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "check.h"
#include "cuda_fixture.h"

static real *host_alloc(size_t n) { return (real *)calloc(n ? n : 1, sizeof(real)); }

static real *dev_copy(const real *h, size_t n) { return (real *)dev_upload(h, sizeof(real) * n); }

static void download(real *h, const real *d, size_t n) { dev_download(h, d, sizeof(real) * n); }

/* Every element: |got − want| ≤ bound[i] (+ the smallest normal, for outputs that are 0). */
static int within(const real *got, const real *want, const double *bound, size_t n, const char *what)
{
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - want[i]) <= bound[i] + 1e-37)) {
      if (!bad) first = i;
      bad++;
    }
  if (bad)
    fprintf(stderr, "%s: %zu of %zu beyond the bound; first [%zu]: got %.9g, want %.9g, bound %.3g\n", what, bad,
            n, first, (double)got[first], (double)want[first], bound[first]);
  return bad == 0;
}

/* mag[m, n] = Σ_k |A(m, k)| |B(k, n)|, A(m, k) = A[m·ars + k·acs], B likewise; plus |C0| when
 * given (the accumulated destination). */
static void magnitude(double *mag, const real *A, size_t ars, size_t acs, const real *B, size_t brs, size_t bcs,
                      int M, int N, int K, const real *C0)
{
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double s = C0 ? fabs((double)C0[(size_t)m * N + n]) : 0.0;
      for (int k = 0; k < K; k++) s += fabs((double)A[m * ars + k * acs]) * fabs((double)B[k * brs + n * bcs]);
      mag[(size_t)m * N + n] = s;
    }
}

static void scale_bound(double *b, size_t n, double f)
{
  for (size_t i = 0; i < n; i++) b[i] *= f;
}

/* ---- fp32 linears ---- */

static void linear_case(int BT, int IC, int OC, uint64_t seed)
{
  const size_t nx = (size_t)BT * IC, nw = (size_t)OC * IC, ny = (size_t)BT * OC;
  real *x = host_alloc(nx), *w = host_alloc(nw), *dy = host_alloc(ny), *y0 = host_alloc(ny), *dw0 = host_alloc(nw);
  fill_uniform(x, nx, seed, 1.0);
  fill_uniform(w, nw, seed + 1, 0.5);
  fill_uniform(dy, ny, seed + 2, 1.0);
  fill_uniform(y0, ny, seed + 3, 2.0);
  fill_uniform(dw0, nw, seed + 4, 2.0);
  real *x_d = dev_copy(x, nx), *w_d = dev_copy(w, nw), *dy_d = dev_copy(dy, ny);
  real *y_d = dev_copy(y0, ny), *yacc_d = dev_copy(y0, ny), *dx_d = dev_zeros(sizeof(real) * nx),
       *dw_d = dev_copy(dw0, nw);

  /* CPU reference: forward (assign), forward_acc onto y0, backward (dinp assigned, dweight += onto dw0) */
  real *y = host_alloc(ny), *yacc = host_alloc(ny), *dx = host_alloc(nx), *dw = host_alloc(nw);
  memcpy(y, y0, sizeof(real) * ny); /* assigned: its old contents must not matter */
  memcpy(yacc, y0, sizeof(real) * ny);
  memcpy(dw, dw0, sizeof(real) * nw);
  kernel_ops_cpu.linear_forward(NULL, y, x, w, BT, IC, OC);
  kernel_ops_cpu.linear_forward_acc(NULL, yacc, x, w, BT, IC, OC);
  kernel_ops_cpu.linear_backward(NULL, dx, dw, dy, x, w, BT, IC, OC);
  kernel_ops_cuda.linear_forward(fixture_ctx, y_d, x_d, w_d, BT, IC, OC);
  kernel_ops_cuda.linear_forward_acc(fixture_ctx, yacc_d, x_d, w_d, BT, IC, OC);
  kernel_ops_cuda.linear_backward(fixture_ctx, dx_d, dw_d, dy_d, x_d, w_d, BT, IC, OC);

  real *g = host_alloc(nx > nw ? (nx > ny ? nx : ny) : (nw > ny ? nw : ny));
  double *mag = (double *)calloc(nx + nw + ny, sizeof(double));
  /* y[bt, oc] = Σ_ic x[bt, ic] w[oc, ic]: IC products and adds, plus alpha/beta: 2 (IC + 2) u */
  magnitude(mag, x, IC, 1, w, 1, IC, BT, OC, IC, NULL);
  scale_bound(mag, ny, 2.0 * (IC + 2) * REAL_U);
  download(g, y_d, ny);
  CHECK(within(g, y, mag, ny, "linear_forward"));
  magnitude(mag, x, IC, 1, w, 1, IC, BT, OC, IC, y0); /* the destination's add: one more rounding */
  scale_bound(mag, ny, 2.0 * (IC + 3) * REAL_U);
  download(g, yacc_d, ny);
  CHECK(within(g, yacc, mag, ny, "linear_forward_acc"));
  /* dx[bt, ic] = Σ_oc dy[bt, oc] w[oc, ic] */
  magnitude(mag, dy, OC, 1, w, IC, 1, BT, IC, OC, NULL);
  scale_bound(mag, nx, 2.0 * (OC + 2) * REAL_U);
  download(g, dx_d, nx);
  CHECK(within(g, dx, mag, nx, "linear_backward dinp"));
  /* dw[oc, ic] = dw0 + Σ_bt dy[bt, oc] x[bt, ic] */
  magnitude(mag, dy, 1, OC, x, IC, 1, OC, IC, BT, dw0);
  scale_bound(mag, nw, 2.0 * (BT + 3) * REAL_U);
  download(g, dw_d, nw);
  CHECK(within(g, dw, mag, nw, "linear_backward dweight"));

  /* dinp NULL: skipped; dweight accumulates again on both sides (now dw0 + 2 Σ) */
  kernel_ops_cpu.linear_backward(NULL, NULL, dw, dy, x, w, BT, IC, OC);
  kernel_ops_cuda.linear_backward(fixture_ctx, NULL, dw_d, dy_d, x_d, w_d, BT, IC, OC);
  magnitude(mag, dy, 1, OC, x, IC, 1, OC, IC, BT, dw0);
  for (size_t i = 0; i < nw; i++) mag[i] = 2.0 * (BT + 3) * REAL_U * (2.0 * mag[i] - fabs((double)dw0[i]));
  scale_bound(mag, nw, 2.0); /* two accumulations, each bounded as above */
  download(g, dw_d, nw);
  CHECK(within(g, dw, mag, nw, "linear_backward dweight, dinp NULL, accumulated twice"));

  /* dweight NULL (a split backward's B): dinp alone, assigned over what was there, the weight
   * gradient left as it was */
  real *dx2_d = dev_copy(x, nx), *dw_before = host_alloc(nw); /* dinp over nonzero contents */
  download(dw_before, dw_d, nw);
  kernel_ops_cuda.linear_backward(fixture_ctx, dx2_d, NULL, dy_d, x_d, w_d, BT, IC, OC);
  magnitude(mag, dy, OC, 1, w, IC, 1, BT, IC, OC, NULL);
  scale_bound(mag, nx, 2.0 * (OC + 2) * REAL_U);
  download(g, dx2_d, nx);
  CHECK(within(g, dx, mag, nx, "linear_backward dinp, dweight NULL"));
  download(g, dw_d, nw);
  CHECK_MSG(!memcmp(g, dw_before, sizeof(real) * nw), "linear_backward with dweight NULL wrote the weight gradient");
  dev_free(dx2_d);
  free(dw_before);
  CHECK_CUDA_OK();

  dev_free(x_d), dev_free(w_d), dev_free(dy_d), dev_free(y_d), dev_free(yacc_d), dev_free(dx_d), dev_free(dw_d);
  free(x), free(w), free(dy), free(y0), free(dw0), free(y), free(yacc), free(dx), free(dw), free(g), free(mag);
}

static void test_linear_small(void) { linear_case(37, 53, 29, 11); }
static void test_linear_large(void) { linear_case(300, 515, 259, 12); }

/* ---- bf16 linears ---- */

static bf16 *to_bf16(const real *x, size_t n, real *widened)
{
  bf16 *b = (bf16 *)calloc(n ? n : 1, sizeof(bf16));
  for (size_t i = 0; i < n; i++) {
    b[i] = bf16_from_float(x[i]);
    widened[i] = bf16_to_float(b[i]);
  }
  return b;
}

/* The CPU's bf16 products need oneDNN; without it (they refuse), the reference is the fp32
 * linear on the widened operands: the same mathematical product, since a product of two bf16
 * values is exact in fp32 and both accumulate in fp32. Bound: 4 (K + 3) u · magnitude, twice
 * the fp32 one, as tensor-core fp32 accumulation may truncate instead of rounding (≤ 2u per add). */
static void linear_bf16_case(int BT, int IC, int OC, uint64_t seed)
{
  const size_t nx = (size_t)BT * IC, nw = (size_t)OC * IC, ny = (size_t)BT * OC;
  real *x = host_alloc(nx), *w = host_alloc(nw), *dy = host_alloc(ny), *y0 = host_alloc(ny), *dw0 = host_alloc(nw);
  fill_uniform(x, nx, seed, 1.0);
  fill_uniform(w, nw, seed + 1, 0.5);
  fill_uniform(dy, ny, seed + 2, 1.0);
  fill_uniform(y0, ny, seed + 3, 2.0);
  fill_uniform(dw0, nw, seed + 4, 2.0);
  bf16 *xb = to_bf16(x, nx, x), *wb = to_bf16(w, nw, w), *dyb = to_bf16(dy, ny, dy); /* x, w, dy now widened */
  bf16 *xb_d = dev_upload(xb, sizeof(bf16) * nx), *wb_d = dev_upload(wb, sizeof(bf16) * nw),
       *dyb_d = dev_upload(dyb, sizeof(bf16) * ny);
  real *y_d = dev_copy(y0, ny), *yacc_d = dev_copy(y0, ny), *dx_d = dev_zeros(sizeof(real) * nx),
       *dw_d = dev_copy(dw0, nw);
  real *y = host_alloc(ny), *yacc = host_alloc(ny), *dx = host_alloc(nx), *dw = host_alloc(nw);
  memcpy(yacc, y0, sizeof(real) * ny);
  memcpy(dw, dw0, sizeof(real) * nw);
  char err[512] = "";
  int cpu_bf16 = kernel_ops_cpu.linear_forward_bf16 &&
                 kernel_ops_cpu.linear_forward_bf16(NULL, y, xb, wb, BT, IC, OC, err, sizeof err) == 0;
  if (cpu_bf16) {
    CHECK(kernel_ops_cpu.linear_forward_acc_bf16(NULL, yacc, xb, wb, BT, IC, OC, err, sizeof err) == 0);
    CHECK(kernel_ops_cpu.linear_backward_bf16(NULL, dx, dw, dyb, xb, wb, BT, IC, OC, err, sizeof err) == 0);
  } else {
    printf("CPU bf16 products refused (%s): the reference is the fp32 linear on the widened operands\n", err);
    kernel_ops_cpu.linear_forward(NULL, y, x, w, BT, IC, OC);
    kernel_ops_cpu.linear_forward_acc(NULL, yacc, x, w, BT, IC, OC);
    kernel_ops_cpu.linear_backward(NULL, dx, dw, dy, x, w, BT, IC, OC);
  }
  err[0] = 0;
  CHECK(kernel_ops_cuda.linear_forward_bf16(fixture_ctx, y_d, xb_d, wb_d, BT, IC, OC, err, sizeof err) == 0);
  CHECK(kernel_ops_cuda.linear_forward_acc_bf16(fixture_ctx, yacc_d, xb_d, wb_d, BT, IC, OC, err, sizeof err) == 0);
  CHECK(kernel_ops_cuda.linear_backward_bf16(fixture_ctx, dx_d, dw_d, dyb_d, xb_d, wb_d, BT, IC, OC, err,
                                             sizeof err) == 0);
  CHECK_MSG(err[0] == 0, "%s", err);

  real *g = host_alloc(nx > nw ? (nx > ny ? nx : ny) : (nw > ny ? nw : ny));
  double *mag = (double *)calloc(nx + nw + ny, sizeof(double));
  magnitude(mag, x, IC, 1, w, 1, IC, BT, OC, IC, NULL);
  scale_bound(mag, ny, 4.0 * (IC + 3) * REAL_U);
  download(g, y_d, ny);
  CHECK(within(g, y, mag, ny, "linear_forward_bf16"));
  magnitude(mag, x, IC, 1, w, 1, IC, BT, OC, IC, y0);
  scale_bound(mag, ny, 4.0 * (IC + 3) * REAL_U);
  download(g, yacc_d, ny);
  CHECK(within(g, yacc, mag, ny, "linear_forward_acc_bf16"));
  magnitude(mag, dy, OC, 1, w, IC, 1, BT, IC, OC, NULL);
  scale_bound(mag, nx, 4.0 * (OC + 3) * REAL_U);
  download(g, dx_d, nx);
  CHECK(within(g, dx, mag, nx, "linear_backward_bf16 dinp"));
  magnitude(mag, dy, 1, OC, x, IC, 1, OC, IC, BT, dw0);
  scale_bound(mag, nw, 4.0 * (BT + 3) * REAL_U);
  download(g, dw_d, nw);
  CHECK(within(g, dw, mag, nw, "linear_backward_bf16 dweight"));
  CHECK_CUDA_OK();

  dev_free(xb_d), dev_free(wb_d), dev_free(dyb_d), dev_free(y_d), dev_free(yacc_d), dev_free(dx_d), dev_free(dw_d);
  free(x), free(w), free(dy), free(y0), free(dw0), free(xb), free(wb), free(dyb);
  free(y), free(yacc), free(dx), free(dw), free(g), free(mag);
}

static void test_linear_bf16_small(void) { linear_bf16_case(37, 53, 29, 21); }
static void test_linear_bf16_large(void) { linear_bf16_case(300, 515, 259, 22); }

/* A product cuBLAS refuses (k < 0) returns nonzero with the message in err and in the context's
 * first failure; on a context of its own, so the fixture's stays clean. */
static void test_linear_bf16_error(void)
{
  char err[512] = "";
  void *ctx = cuda_ctx_create(0, err, sizeof err);
  CHECK_MSG(ctx != NULL, "%s", err);
  if (!ctx)
    return;
  bf16 *a = kernel_ops_cuda.mem_alloc(ctx, 4096);
  real *o = kernel_ops_cuda.mem_alloc(ctx, 4096);
  err[0] = 0;
  const int rc = kernel_ops_cuda.linear_forward_bf16(ctx, o, a, a, 4, -1, 4, err, sizeof err);
  CHECK(rc != 0);
  CHECK_STR_CONTAINS(err, "cublasGemmEx");
  CHECK_STR_CONTAINS(cuda_ctx_error(ctx), "cuda_dense.cu:");
  kernel_ops_cuda.mem_free(ctx, a);
  kernel_ops_cuda.mem_free(ctx, o);
  cuda_ctx_destroy(ctx);
}

/* ---- RoPE ---- */

/* cos and sin of angles in double rounded to fp32 on both sides: CUDA's double cos/sin are
 * within 2 ulps (of double) of glibc's, so the fp32 roundings agree but for an angle within
 * 2^-29 of a rounding boundary: at most one fp32 ulp apart, ≤ 2^-24 for values in [−1, 1]. */
static void rope_table_case(int T, int HS, double theta, int pos0)
{
  const size_t n = (size_t)T * (HS / 2);
  real *c = host_alloc(n), *s = host_alloc(n), *g = host_alloc(n);
  real *c_d = dev_zeros(sizeof(real) * n), *s_d = dev_zeros(sizeof(real) * n);
  kernel_ops_cpu.rope_table(NULL, c, s, T, HS, theta, pos0);
  kernel_ops_cuda.rope_table(fixture_ctx, c_d, s_d, T, HS, theta, pos0);
  double *b = (double *)calloc(n, sizeof(double));
  for (size_t i = 0; i < n; i++) b[i] = 2.0 * REAL_U;
  download(g, c_d, n);
  CHECK(within(g, c, b, n, "rope_table cos"));
  download(g, s_d, n);
  CHECK(within(g, s, b, n, "rope_table sin"));
  CHECK_CUDA_OK();
  dev_free(c_d), dev_free(s_d);
  free(c), free(s), free(g), free(b);
}

static void test_rope_table(void)
{
  rope_table_case(37, 10, 10000.0, 0);
  rope_table_case(1000, 128, 500000.0, 3000);
}

/* Each output is x1·c ∓ x2·s: two products and a sum, rounded the same on both sides (no FMA
 * on either: -ffp-contract=off on the CPU, __fmul_rn/__fadd_rn here), so the bits are expected;
 * the bound is still the argued one, 2 · 2u · (|x1 c| + |x2 s|), so a contracting build passes. */
static double *rope_bound(const real *x, size_t ld, const real *c, const real *s, int B, int T, int NHx, int HS,
                          size_t n)
{
  double *b = (double *)calloc(n, sizeof(double));
  const int half = HS / 2;
  for (int bt = 0; bt < B * T; bt++)
    for (int h = 0; h < NHx; h++)
      for (int i = 0; i < half; i++) {
        const size_t at = (size_t)bt * ld + (size_t)h * HS;
        const int t = bt % T;
        const double m = fabs((double)x[at + i]) * fabs((double)c[t * half + i]) +
                         fabs((double)x[at + i + half]) * fabs((double)s[t * half + i]);
        const double m2 = fabs((double)x[at + i + half]) * fabs((double)c[t * half + i]) +
                          fabs((double)x[at + i]) * fabs((double)s[t * half + i]);
        b[at + i] = 4.0 * REAL_U * m;
        b[at + i + half] = 4.0 * REAL_U * m2;
      }
  return b;
}

static void rope_case(int B, int T, int NH, int NKV, int HS, uint64_t seed)
{
  const int half = HS / 2;
  const size_t nt = (size_t)T * half, nq = (size_t)B * T * NH * HS, nk = (size_t)B * T * NKV * HS;
  const size_t ld = (size_t)(NH + 2 * NKV) * HS, nqkv = (size_t)B * T * ld;
  real *c = host_alloc(nt), *s = host_alloc(nt);
  kernel_ops_cpu.rope_table(NULL, c, s, T, HS, 10000.0, 7);
  real *c_d = dev_copy(c, nt), *s_d = dev_copy(s, nt); /* the same tables on both sides */
  real *q = host_alloc(nq), *qo = host_alloc(nq), *g = host_alloc(nqkv), *k = host_alloc(nk), *ko = host_alloc(nk);
  fill_uniform(q, nq, seed, 1.0);
  fill_uniform(k, nk, seed + 1, 1.0);
  real *q_d = dev_copy(q, nq), *qo_d = dev_zeros(sizeof(real) * nq), *k_d = dev_copy(k, nk);
  double *bq = rope_bound(q, (size_t)NH * HS, c, s, B, T, NH, HS, nq);
  double *bk = rope_bound(k, (size_t)NKV * HS, c, s, B, T, NKV, HS, nk);

  /* forward out of place (q), in place (k) */
  kernel_ops_cpu.rope_forward(NULL, qo, q, c, s, B, T, NH, HS);
  kernel_ops_cuda.rope_forward(fixture_ctx, qo_d, q_d, c_d, s_d, B, T, NH, HS);
  download(g, qo_d, nq);
  CHECK(within(g, qo, bq, nq, "rope_forward"));
  memcpy(ko, k, sizeof(real) * nk);
  kernel_ops_cpu.rope_forward(NULL, ko, ko, c, s, B, T, NKV, HS);
  kernel_ops_cuda.rope_forward(fixture_ctx, k_d, k_d, c_d, s_d, B, T, NKV, HS);
  download(g, k_d, nk);
  CHECK(within(g, ko, bk, nk, "rope_forward in place"));
  /* backward out of place, on q as the gradient; in place on k */
  kernel_ops_cpu.rope_backward(NULL, qo, q, c, s, B, T, NH, HS);
  kernel_ops_cuda.rope_backward(fixture_ctx, qo_d, q_d, c_d, s_d, B, T, NH, HS);
  download(g, qo_d, nq);
  CHECK(within(g, qo, bq, nq, "rope_backward"));
  memcpy(ko, k, sizeof(real) * nk);
  kernel_ops_cpu.rope_backward(NULL, ko, ko, c, s, B, T, NKV, HS);
  kernel_ops_cuda.from_host(fixture_ctx, k_d, k, sizeof(real) * nk);
  kernel_ops_cuda.rope_backward(fixture_ctx, k_d, k_d, c_d, s_d, B, T, NKV, HS);
  download(g, k_d, nk);
  CHECK(within(g, ko, bk, nk, "rope_backward in place"));

  /* fused: q and k heads rotated, v untouched (bit for bit) */
  real *qkv = host_alloc(nqkv), *ref = host_alloc(nqkv);
  fill_uniform(qkv, nqkv, seed + 2, 1.0);
  double *bqkv = rope_bound(qkv, ld, c, s, B, T, NH + NKV, HS, nqkv); /* q and k heads are adjacent */
  real *qkv_d = dev_copy(qkv, nqkv);
  for (int dir = 0; dir < 2; dir++) {
    memcpy(ref, qkv, sizeof(real) * nqkv);
    kernel_ops_cuda.from_host(fixture_ctx, qkv_d, qkv, sizeof(real) * nqkv);
    if (dir == 0) {
      kernel_ops_cpu.rope_forward_qkv(NULL, ref, c, s, B, T, NH, NKV, HS);
      kernel_ops_cuda.rope_forward_qkv(fixture_ctx, qkv_d, c_d, s_d, B, T, NH, NKV, HS);
    } else {
      kernel_ops_cpu.rope_backward_qkv(NULL, ref, c, s, B, T, NH, NKV, HS);
      kernel_ops_cuda.rope_backward_qkv(fixture_ctx, qkv_d, c_d, s_d, B, T, NH, NKV, HS);
    }
    download(g, qkv_d, nqkv);
    CHECK(within(g, ref, bqkv, nqkv, dir == 0 ? "rope_forward_qkv" : "rope_backward_qkv"));
    int v_same = 1;
    for (int bt = 0; bt < B * T; bt++)
      v_same &= memcmp(g + (size_t)bt * ld + (size_t)(NH + NKV) * HS, qkv + (size_t)bt * ld + (size_t)(NH + NKV) * HS,
                       sizeof(real) * (size_t)NKV * HS) == 0;
    CHECK_MSG(v_same, "v changed by rope_%s_qkv", dir == 0 ? "forward" : "backward");
  }
  CHECK_CUDA_OK();
  dev_free(c_d), dev_free(s_d), dev_free(q_d), dev_free(qo_d), dev_free(k_d), dev_free(qkv_d);
  free(c), free(s), free(q), free(qo), free(g), free(k), free(ko), free(bq), free(bk), free(qkv), free(ref),
      free(bqkv);
}

static void test_rope_small(void) { rope_case(2, 37, 4, 2, 10, 31); }
static void test_rope_large(void) { rope_case(2, 300, 8, 2, 128, 32); }

int main(void)
{
  cuda_test_open();
  static const struct test_case t[] = {
    TEST(test_linear_small),         TEST(test_linear_large),          TEST(test_linear_bf16_small),
    TEST(test_linear_bf16_large),    TEST(test_linear_bf16_error),     TEST(test_rope_table),
    TEST(test_rope_small),           TEST(test_rope_large),
  };
  return test_run_all(t, (int)(sizeof t / sizeof t[0]));
}
