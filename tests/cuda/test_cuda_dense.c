/* The CUDA backend's products and attention (kernels/cuda/cuda_dense.cu) against the CPU table:
 * linear (fp32 and bf16 operands), RoPE and causal grouped-query attention, forward and
 * backward, separate and fused q|k|v layouts, with and without a dropout mask.
 *
 * Bounds. Where an output is a straight-line computation of sums and products (the linears, the
 * attention backward), each side is within γ_n · |the same computation on absolute values| of
 * the exact result (γ_n ≈ n · u, n the roundings along the longest path: the reduction lengths
 * added), so the two sides are within 2 · n · u of that "magnitude" computation, which the test
 * computes in double beside the reference; it is checked per element. The softmax is bounded
 * through its condition: a score error δs moves p_j by at most p_j · (|δs_j| + max |δs|) to first
 * order, plus the roundings of exp (≤ 1 ulp on the CPU, ≤ 2 on CUDA) and of the scaling. The
 * orders differ (cuBLAS' tiling, the CPU's sgemm, one key per warp here), so bits are not
 * expected to match except where the operations are the same (RoPE: one product each, no FMA on
 * either side; the fused and separate attention entries of one backend). */
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

/* ---- attention ---- */

struct att {
  int B, T, NH, NKV, HS;
  size_t nq, nk, nout, np;
  real *q, *k, *v, *mask, *dout; /* host inputs (mask NULL: none) */
};

static void att_init(struct att *a, int B, int T, int NH, int NKV, int HS, int dropout, uint64_t seed)
{
  a->B = B, a->T = T, a->NH = NH, a->NKV = NKV, a->HS = HS;
  a->nq = (size_t)B * T * NH * HS, a->nk = (size_t)B * T * NKV * HS, a->nout = a->nq;
  a->np = (size_t)B * NH * T * T;
  a->q = host_alloc(a->nq), a->k = host_alloc(a->nk), a->v = host_alloc(a->nk), a->dout = host_alloc(a->nout);
  fill_uniform(a->q, a->nq, seed, 2.0);
  fill_uniform(a->k, a->nk, seed + 1, 2.0);
  fill_uniform(a->v, a->nk, seed + 2, 1.0);
  fill_uniform(a->dout, a->nout, seed + 3, 1.0);
  a->mask = NULL;
  if (dropout) { /* p = 0.25: 0 or 4/3, from the fixture's LCG */
    a->mask = host_alloc(a->np);
    fill_uniform(a->mask, a->np, seed + 4, 1.0);
    for (size_t i = 0; i < a->np; i++) a->mask[i] = a->mask[i] < -0.5f ? 0.0f : (real)(1.0 / 0.75);
  }
}

static void att_free(struct att *a) { free(a->q), free(a->k), free(a->v), free(a->dout), free(a->mask); }

/* The fused row [q | k | v] of the same q, k, v. */
static real *att_fuse(const struct att *a, const real *q, const real *k, const real *v)
{
  const size_t lq = (size_t)a->NH * a->HS, lk = (size_t)a->NKV * a->HS, ld = lq + 2 * lk;
  real *f = host_alloc((size_t)a->B * a->T * ld);
  for (size_t bt = 0; bt < (size_t)a->B * a->T; bt++) {
    memcpy(f + bt * ld, q + bt * lq, sizeof(real) * lq);
    memcpy(f + bt * ld + lq, k + bt * lk, sizeof(real) * lk);
    memcpy(f + bt * ld + lq + lk, v + bt * lk, sizeof(real) * lk);
  }
  return f;
}

static void attention_case(int B, int T, int NH, int NKV, int HS, int dropout, uint64_t seed)
{
  struct att a;
  att_init(&a, B, T, NH, NKV, HS, dropout, seed);
  const int group = NH / NKV;
  const size_t TT = (size_t)T * T, ld = (size_t)(NH + 2 * NKV) * HS, nqkv = (size_t)B * T * ld;
  const double u = REAL_U, scale = 1.0 / sqrt((double)HS);
  const size_t ns_cpu = kernel_ops_cpu.attention_scratch_n_elems(NULL, B, T, NH, NKV);
  const size_t ns_cuda = kernel_ops_cuda.attention_scratch_n_elems(NULL, B, T, NH, NKV);
  real *scratch = host_alloc(ns_cpu), *out = host_alloc(a.nout), *probs = host_alloc(a.np);
  real *dq = host_alloc(a.nq), *dk = host_alloc(a.nk), *dv = host_alloc(a.nk);
  kernel_ops_cpu.attention_forward(NULL, out, probs, scratch, a.q, a.k, a.v, a.mask, B, T, NH, NKV, HS);

  real *q_d = dev_copy(a.q, a.nq), *k_d = dev_copy(a.k, a.nk), *v_d = dev_copy(a.v, a.nk);
  real *m_d = a.mask ? dev_copy(a.mask, a.np) : NULL, *dout_d = dev_copy(a.dout, a.nout);
  real *out_d = dev_zeros(sizeof(real) * a.nout), *p_d = dev_zeros(sizeof(real) * a.np);
  real *s_d = dev_zeros(sizeof(real) * ns_cuda);
  kernel_ops_cuda.attention_forward(fixture_ctx, out_d, p_d, s_d, q_d, k_d, v_d, m_d, B, T, NH, NKV, HS);
  real *g = host_alloc(a.np > nqkv ? a.np : nqkv);
  double *bnd = (double *)calloc(a.np > nqkv ? a.np : nqkv, sizeof(double));

  /* probs: per row, the score error e_s = 2 (HS + 4) u · scale · max_j Σ_d |q_d k_jd| (a dot of HS
   * terms, the scaling, and s − max, each side); p_j moves by ≤ p_j (2 e_s + 12u): log p_j =
   * s_j − logsumexp(s) moves by ≤ |δs_j| + max |δs| ≤ 2 e_s, then exp (≤ 1 ulp on the CPU, ≤ 2 on
   * CUDA: 6u), 1/Σ rounded and the product (2u a side: 4u), 2u spare (Σ is in double). */
  double *row_es = (double *)calloc((size_t)B * NH * T, sizeof(double));
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const real *qt = a.q + ((size_t)b * T + t) * NH * HS + (size_t)h * HS;
        double mx = 0;
        for (int j = 0; j <= t; j++) {
          const real *kj = a.k + ((size_t)b * T + j) * NKV * HS + (size_t)(h / group) * HS;
          double m = 0;
          for (int d = 0; d < HS; d++) m += fabs((double)qt[d]) * fabs((double)kj[d]);
          mx = m > mx ? m : mx;
        }
        const size_t row = ((size_t)b * NH + h) * T + t;
        row_es[row] = 2.0 * (HS + 4) * u * scale * mx;
        for (int j = 0; j < T; j++) bnd[row * T + j] = probs[row * T + j] * (2.0 * row_es[row] + 12.0 * u);
      }
  download(g, p_d, a.np);
  CHECK(within(g, probs, bnd, a.np, "attention_forward probs"));
  int upper_zero = 1;
  for (size_t row = 0; row < (size_t)B * NH * T; row++)
    for (int j = (int)(row % T) + 1; j < T; j++) upper_zero &= g[row * T + j] == 0.0f;
  CHECK_MSG(upper_zero, "probs not 0 above the diagonal");

  /* out_d = Σ_j A_j v_jd: the probabilities' error (as above) plus T products and adds on each
   * side: (2 e_s + 12u + 2 (T + 2) u) · Σ_j A_j |v_jd|. */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const size_t row = ((size_t)b * NH + h) * T + t;
        for (int d = 0; d < HS; d++) {
          double m = 0;
          for (int j = 0; j <= t; j++)
            m += probs[row * T + j] * (a.mask ? a.mask[row * T + j] : 1.0) *
                 fabs((double)a.v[((size_t)b * T + j) * NKV * HS + (size_t)(h / group) * HS + d]);
          bnd[((size_t)b * T + t) * NH * HS + (size_t)h * HS + d] =
              (2.0 * row_es[row] + 12.0 * u + 2.0 * (T + 2) * u) * m;
        }
      }
  download(g, out_d, a.nout);
  CHECK(within(g, out, bnd, a.nout, "attention_forward out"));

  /* the fused forward: the same bits as the separate one */
  real *qkv = att_fuse(&a, a.q, a.k, a.v);
  real *qkv_d = dev_copy(qkv, nqkv), *out2_d = dev_zeros(sizeof(real) * a.nout), *p2_d = dev_zeros(sizeof(real) * a.np);
  kernel_ops_cuda.attention_forward_qkv(fixture_ctx, out2_d, p2_d, s_d, qkv_d, m_d, B, T, NH, NKV, HS);
  real *g2 = host_alloc(a.np > nqkv ? a.np : nqkv);
  download(g, p_d, a.np);
  download(g2, p2_d, a.np);
  CHECK_MSG(memcmp(g, g2, sizeof(real) * a.np) == 0, "attention_forward_qkv probs differ from attention_forward's");
  download(g, out_d, a.nout);
  download(g2, out2_d, a.nout);
  CHECK_MSG(memcmp(g, g2, sizeof(real) * a.nout) == 0, "attention_forward_qkv out differs from attention_forward's");

  /* backward from the CPU's probs on both sides (the same inputs). Bound per element: 2 n u ·
   * the computation on magnitudes, n = HS + T (dP, then the dot) + T·group (dk's and dv's sums
   * over the group's rows) + 8 (the scalings, the difference, the products). */
  kernel_ops_cpu.attention_backward(NULL, dq, dk, dv, scratch, a.dout, a.q, a.k, a.v, probs, a.mask, B, T, NH, NKV,
                                    HS);
  real *pc_d = dev_copy(probs, a.np);
  real *dq_d = dev_zeros(sizeof(real) * a.nq), *dk_d = dev_zeros(sizeof(real) * a.nk), *dv_d = dev_zeros(sizeof(real) * a.nk);
  kernel_ops_cuda.attention_backward(fixture_ctx, dq_d, dk_d, dv_d, s_d, dout_d, q_d, k_d, v_d, pc_d, m_d, B, T, NH,
                                     NKV, HS);
  double *mdS = (double *)calloc(a.np, sizeof(double)); /* |dS| on magnitudes */
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++) {
        const size_t row = ((size_t)b * NH + h) * T + t;
        const real *dot = a.dout + ((size_t)b * T + t) * NH * HS + (size_t)h * HS;
        double sdot = 0;
        for (int j = 0; j <= t; j++) {
          const real *vj = a.v + ((size_t)b * T + j) * NKV * HS + (size_t)(h / group) * HS;
          double m = 0;
          for (int d = 0; d < HS; d++) m += fabs((double)dot[d]) * fabs((double)vj[d]);
          mdS[row * T + j] = m * (a.mask ? a.mask[row * T + j] : 1.0); /* |dP| */
          sdot += probs[row * T + j] * mdS[row * T + j];
        }
        for (int j = 0; j <= t; j++) mdS[row * T + j] = probs[row * T + j] * (mdS[row * T + j] + sdot);
      }
  const double fac = 2.0 * (HS + T + (double)T * group + 8) * u;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int t = 0; t < T; t++)
        for (int d = 0; d < HS; d++) {
          const size_t row = ((size_t)b * NH + h) * T + t;
          double m = 0;
          for (int j = 0; j <= t; j++)
            m += mdS[row * T + j] * fabs((double)a.k[((size_t)b * T + j) * NKV * HS + (size_t)(h / group) * HS + d]);
          bnd[((size_t)b * T + t) * NH * HS + (size_t)h * HS + d] = fac * scale * m;
        }
  download(g, dq_d, a.nq);
  CHECK(within(g, dq, bnd, a.nq, "attention_backward dq"));
  double *bv = (double *)calloc(a.nk, sizeof(double));
  for (int b = 0; b < B; b++)
    for (int kv = 0; kv < NKV; kv++)
      for (int j = 0; j < T; j++)
        for (int d = 0; d < HS; d++) {
          double mk = 0, mv = 0;
          for (int h = kv * group; h < (kv + 1) * group; h++)
            for (int t = j; t < T; t++) {
              const size_t pj = ((size_t)b * NH + h) * TT + (size_t)t * T + j;
              const size_t qi = ((size_t)b * T + t) * NH * HS + (size_t)h * HS + d;
              mk += mdS[pj] * fabs((double)a.q[qi]);
              mv += probs[pj] * (a.mask ? a.mask[pj] : 1.0) * fabs((double)a.dout[qi]);
            }
          const size_t at = ((size_t)b * T + j) * NKV * HS + (size_t)kv * HS + d;
          bnd[at] = fac * scale * mk;
          bv[at] = fac * mv;
        }
  download(g, dk_d, a.nk);
  CHECK(within(g, dk, bnd, a.nk, "attention_backward dk"));
  download(g, dv_d, a.nk);
  CHECK(within(g, dv, bv, a.nk, "attention_backward dv"));

  /* the fused backward: the same bits in dqkv's rows; dqkv starts as garbage (assigned) */
  real *junk = host_alloc(nqkv);
  fill_uniform(junk, nqkv, seed + 9, 100.0);
  real *dqkv_d = dev_copy(junk, nqkv);
  kernel_ops_cuda.attention_backward_qkv(fixture_ctx, dqkv_d, s_d, dout_d, qkv_d, pc_d, m_d, B, T, NH, NKV, HS);
  download(g, dq_d, a.nq);
  real *gk = host_alloc(a.nk), *gv = host_alloc(a.nk);
  download(gk, dk_d, a.nk);
  download(gv, dv_d, a.nk);
  real *fused = att_fuse(&a, g, gk, gv);
  download(g2, dqkv_d, nqkv);
  CHECK_MSG(memcmp(fused, g2, sizeof(real) * nqkv) == 0, "attention_backward_qkv differs from attention_backward");
  /* the backward from the GPU's own probs runs too and is finite */
  kernel_ops_cuda.attention_backward(fixture_ctx, dq_d, dk_d, dv_d, s_d, dout_d, q_d, k_d, v_d, p_d, m_d, B, T, NH,
                                     NKV, HS);
  download(g, dq_d, a.nq);
  int finite = 1;
  for (size_t i = 0; i < a.nq; i++) finite &= isfinite(g[i]) != 0;
  CHECK(finite);
  CHECK_CUDA_OK();

  dev_free(q_d), dev_free(k_d), dev_free(v_d), dev_free(m_d), dev_free(dout_d), dev_free(out_d), dev_free(p_d);
  dev_free(s_d), dev_free(qkv_d), dev_free(out2_d), dev_free(p2_d), dev_free(pc_d), dev_free(dq_d), dev_free(dk_d);
  dev_free(dv_d), dev_free(dqkv_d);
  free(scratch), free(out), free(probs), free(dq), free(dk), free(dv), free(g), free(g2), free(bnd), free(row_es);
  free(qkv), free(mdS), free(bv), free(junk), free(gk), free(gv), free(fused);
  att_free(&a);
}

static void test_attention_small(void) { attention_case(2, 37, 4, 2, 24, 0, 41); }
static void test_attention_small_dropout(void) { attention_case(2, 37, 4, 2, 24, 1, 42); }
static void test_attention_mha(void) { attention_case(1, 45, 3, 3, 40, 1, 43); }
static void test_attention_large(void) { attention_case(1, 300, 8, 2, 64, 0, 44); }
static void test_attention_large_dropout(void) { attention_case(2, 280, 4, 1, 72, 1, 45); }

int main(void)
{
  cuda_test_open();
  static const struct test_case t[] = {
    TEST(test_linear_small),         TEST(test_linear_large),          TEST(test_linear_bf16_small),
    TEST(test_linear_bf16_large),    TEST(test_linear_bf16_error),     TEST(test_rope_table),
    TEST(test_rope_small),           TEST(test_rope_large),            TEST(test_attention_small),
    TEST(test_attention_small_dropout), TEST(test_attention_mha),      TEST(test_attention_large),
    TEST(test_attention_large_dropout),
  };
  return test_run_all(t, (int)(sizeof t / sizeof t[0]));
}
