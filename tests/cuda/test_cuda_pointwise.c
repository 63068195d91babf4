/* The CUDA backend's element-wise, RMSNorm, embedding and optimizer entries
 * (kernels/cuda/cuda_pointwise.cu) against the CPU table on the same inputs.
 *
 * Bit-identical by construction (compared with memcmp): vec_add, dropout (mask, forward,
 * backward), round_bf16, AdamW (both variants), the embedding's four entries and its bf16 lookup,
 * widen_bf16, accumulate_bf16. Those do the CPU's
 * operations in the CPU's order, without contraction (the CUDA file uses __fmul_rn / __fadd_rn),
 * and the sum that the CPU runs sequentially (dwte in float) runs in the same sequence on the GPU.
 * RMSNorm's dweight is a blocked sum over rows: the same bits as rmsnorm_dweight_model below (its
 * order on the host), and within a stated bound of the CPU's sequential sum. The inputs hold no
 * denormals (the CPU reference here runs without FTZ, the GPU without -ftz: both keep them, but
 * we do not rely on it).
 *
 * Within a stated bound: SwiGLU (CUDA's expf, within 2 ulp, against the CPU's exp, within 1 ulp),
 * RMSNorm's rstd, out and dinp (row sums in double in another order), sumsq (double, another
 * order). Sizes are not multiples of the block sizes (256), and each group has a larger shape;
 * RMSNorm and SwiGLU's rows also run at real sizes (4096 rows of dim 4096 and 8192, 4096 rows of
 * a 11008-wide feed-forward). */
#include <float.h>

#include "check.h"
#include "cuda_fixture.h"

#define U 0x1p-24 /* fp32 unit roundoff */

static real *host_uniform(size_t n, uint64_t seed, double scale)
{
  real *x = malloc((n ? n : 1) * sizeof *x);
  fill_uniform(x, n, seed, scale);
  return x;
}

static real *host_alloc(size_t n) { return calloc(n ? n : 1, sizeof(real)); }

static int same_bits(const void *a, const void *b, size_t n_bytes) { return memcmp(a, b, n_bytes) == 0; }

/* ---- element-wise sum ---- */

static void test_vec_add(void)
{
  const size_t sizes[] = { 1, 77, 1000003 };
  for (int s = 0; s < 3; s++) {
    const size_t n = sizes[s], nb = n * sizeof(real);
    real *a = host_uniform(n, 1 + s, 3.0), *b = host_uniform(n, 11 + s, 3.0), *ref = host_alloc(n),
         *got = host_alloc(n);
    real *da = dev_upload(a, nb), *db = dev_upload(b, nb), *dout = dev_zeros(nb);
    kernel_ops_cpu.vec_add(NULL, ref, a, b, n);
    kernel_ops_cuda.vec_add(fixture_ctx, dout, da, db, n);
    dev_download(got, dout, nb);
    CHECK_MSG(same_bits(got, ref, nb), "vec_add n %zu", n); /* one correctly rounded add */
    /* out == a (the "accumulate" use) */
    kernel_ops_cuda.vec_add(fixture_ctx, da, da, db, n);
    dev_download(got, da, nb);
    CHECK_MSG(same_bits(got, ref, nb), "vec_add in place n %zu", n);
    CHECK_CUDA_OK();
    dev_free(da), dev_free(db), dev_free(dout);
    free(a), free(b), free(ref), free(got);
  }
}

/* ---- SwiGLU ----
 * Each side against the exact value, with exp within 2 ulp ≤ 4u relative (CUDA's expf; the
 * CPU's is within 1 ulp) and u for each rounding:
 * forward: 1 + e within 5u relative, g / (1 + e) within 6u, · up within 7u: the two sides
 * differ by ≤ 14u · |out|; bound 24u · |out| (+ the smallest normal for outputs near 0).
 * backward: s = 1/(1 + e) within 6u relative; g(1 − s) within 8u·|g| absolute; t = 1 + g(1 − s)
 * within 9u·(1 + |g|); (d·up)·s within 8u relative; times t: within 18u · |d·up| · (1 + |g|)
 * since |t| ≤ 1 + |g|: the sides differ by ≤ 36u of that; bound 48u. dup = (d·g)·s: within
 * 8u · |d·g| a side; bound 24u · |d·g|. */
static int swiglu_fwd_ok(const real *got, const real *ref, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (!(fabs((double)got[i] - ref[i]) <= 24 * U * fabs((double)ref[i]) + FLT_MIN)) {
      fprintf(stderr, "swiglu forward [%zu]: %.9g vs %.9g\n", i, got[i], ref[i]);
      return 0;
    }
  return 1;
}

static int swiglu_bwd_ok(const real *dg, const real *du, const real *rdg, const real *rdu,
                         const real *d, const real *g, const real *u, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    const double tg = 48 * U * fabs((double)d[i] * u[i]) * (1 + fabs((double)g[i])) + FLT_MIN;
    const double tu = 24 * U * fabs((double)d[i] * g[i]) + FLT_MIN;
    if (!(fabs((double)dg[i] - rdg[i]) <= tg) || !(fabs((double)du[i] - rdu[i]) <= tu)) {
      fprintf(stderr, "swiglu backward [%zu]: dgate %.9g vs %.9g, dup %.9g vs %.9g\n", i, dg[i],
              rdg[i], du[i], rdu[i]);
      return 0;
    }
  }
  return 1;
}

/* bf16 outputs: the fp32 values differ by ≤ 24u relative (above), so their roundings to bf16
 * are equal or one bf16 ulp apart (2^-7 relative to the binade, ≤ 2^-7 · |ref| + tiny). */
static int bf16_close(const bf16 *got, const bf16 *ref, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    const double a = bf16_to_float(got[i]), b = bf16_to_float(ref[i]);
    if (!(fabs(a - b) <= 0x1p-7 * fabs(b) + FLT_MIN)) {
      fprintf(stderr, "bf16 [%zu]: %.9g vs %.9g\n", i, a, b);
      return 0;
    }
  }
  return 1;
}

static void test_swiglu(void)
{
  const size_t sizes[] = { 77, 1000003 };
  for (int s = 0; s < 2; s++) {
    const size_t n = sizes[s], nb = n * sizeof(real);
    real *g = host_uniform(n, 21 + s, 6.0), *u = host_uniform(n, 31 + s, 2.0),
         *d = host_uniform(n, 41 + s, 1.0);
    real *ref = host_alloc(n), *got = host_alloc(n), *rdg = host_alloc(n), *rdu = host_alloc(n),
         *gdg = host_alloc(n), *gdu = host_alloc(n);
    real *dgt = dev_upload(g, nb), *dup_ = dev_upload(u, nb), *dd = dev_upload(d, nb),
         *dout = dev_zeros(nb), *ddg = dev_zeros(nb), *ddu = dev_zeros(nb);
    kernel_ops_cpu.swiglu_forward(NULL, ref, g, u, n);
    kernel_ops_cuda.swiglu_forward(fixture_ctx, dout, dgt, dup_, n);
    dev_download(got, dout, nb);
    CHECK_MSG(swiglu_fwd_ok(got, ref, n), "n %zu", n);
    /* the per-element bound implies both summaries (the FLT_MIN terms are below 1e-30 here) */
    CHECK(rel_l2(got, ref, n) <= 24 * U && max_rel(got, ref, n) <= 24 * U + 1e-30);
    kernel_ops_cpu.swiglu_backward(NULL, rdg, rdu, d, g, u, n);
    kernel_ops_cuda.swiglu_backward(fixture_ctx, ddg, ddu, dd, dgt, dup_, n);
    dev_download(gdg, ddg, nb);
    dev_download(gdu, ddu, nb);
    CHECK_MSG(swiglu_bwd_ok(gdg, gdu, rdg, rdu, d, g, u, n), "n %zu", n);
    /* bf16 */
    bf16 *rb = calloc(n, sizeof *rb), *gb = calloc(n, sizeof *gb);
    bf16 *db16 = dev_zeros(n * sizeof(bf16));
    kernel_ops_cpu.swiglu_forward_bf16(NULL, rb, g, u, n);
    kernel_ops_cuda.swiglu_forward_bf16(fixture_ctx, db16, dgt, dup_, n);
    dev_download(gb, db16, n * sizeof(bf16));
    CHECK_MSG(bf16_close(gb, rb, n), "n %zu", n);
    /* last, as it writes over gate and up: in place (dgate on gate, dup on up: a bf16
     * model's experts, model_moe.c): the same bits */
    kernel_ops_cuda.swiglu_backward(fixture_ctx, dgt, dup_, dd, dgt, dup_, n);
    real *idg = calloc(n, sizeof *idg), *idu = calloc(n, sizeof *idu);
    dev_download(idg, dgt, nb);
    dev_download(idu, dup_, nb);
    CHECK_MSG(!memcmp(idg, gdg, nb) && !memcmp(idu, gdu, nb), "in place, n %zu", n);
    free(idg), free(idu);
    CHECK_CUDA_OK();
    dev_free(dgt), dev_free(dup_), dev_free(dd), dev_free(dout), dev_free(ddg), dev_free(ddu);
    dev_free(db16);
    free(g), free(u), free(d), free(ref), free(got), free(rdg), free(rdu), free(gdg), free(gdu);
    free(rb), free(gb);
  }
}

/* The fused rows: the same per-element bounds, on gu (rows, 2F). */
static void test_swiglu_rows(void)
{
  const int shapes[3][2] = { { 3, 77 }, { 301, 2053 }, { 4096, 11008 } };
  for (int s = 0; s < 3; s++) {
    const int rows = shapes[s][0], F = shapes[s][1];
    const size_t n = (size_t)rows * F, nb = n * sizeof(real);
    real *gu = host_uniform(2 * n, 51 + s, 6.0), *d = host_uniform(n, 61 + s, 1.0);
    real *ref = host_alloc(n), *got = host_alloc(n), *rdgu = host_alloc(2 * n),
         *gdgu = host_alloc(2 * n);
    real *dgu = dev_upload(gu, 2 * nb), *dd = dev_upload(d, nb), *dout = dev_zeros(nb),
         *ddgu = dev_zeros(2 * nb);
    kernel_ops_cpu.swiglu_forward_rows(NULL, ref, gu, rows, F);
    kernel_ops_cuda.swiglu_forward_rows(fixture_ctx, dout, dgu, rows, F);
    dev_download(got, dout, nb);
    CHECK_MSG(swiglu_fwd_ok(got, ref, n), "rows %d F %d", rows, F);
    kernel_ops_cpu.swiglu_backward_rows(NULL, rdgu, d, gu, rows, F);
    kernel_ops_cuda.swiglu_backward_rows(fixture_ctx, ddgu, dd, dgu, rows, F);
    dev_download(gdgu, ddgu, 2 * nb);
    int ok = 1;
    for (int r = 0; r < rows && ok; r++) {
      const size_t o = (size_t)r * 2 * F;
      ok = swiglu_bwd_ok(gdgu + o, gdgu + o + F, rdgu + o, rdgu + o + F, d + (size_t)r * F,
                         gu + o, gu + o + F, (size_t)F);
    }
    CHECK_MSG(ok, "rows %d F %d", rows, F);
    bf16 *rb = calloc(n, sizeof *rb), *gb = calloc(n, sizeof *gb);
    bf16 *db16 = dev_zeros(n * sizeof(bf16));
    kernel_ops_cpu.swiglu_forward_rows_bf16(NULL, rb, gu, rows, F);
    kernel_ops_cuda.swiglu_forward_rows_bf16(fixture_ctx, db16, dgu, rows, F);
    dev_download(gb, db16, n * sizeof(bf16));
    CHECK_MSG(bf16_close(gb, rb, n), "rows %d F %d", rows, F);
    CHECK_CUDA_OK();
    dev_free(dgu), dev_free(dd), dev_free(dout), dev_free(ddgu), dev_free(db16);
    free(gu), free(d), free(ref), free(got), free(rdgu), free(gdgu), free(rb), free(gb);
  }
}

/* ---- dropout: the mask bit for bit (Philox by logical index), then exact multiplies ---- */

static void test_dropout(void)
{
  const size_t n = 100003, nb = n * sizeof(real);
  const float ps[] = { 0.0f, 1.0f, 0.5f, 0.1f }; /* the last one's mask stays for backward */
  real *x = host_uniform(n, 71, 2.0), *ref = host_alloc(n), *got = host_alloc(n),
       *refo = host_alloc(n);
  real *dx = dev_upload(x, nb), *dmask = dev_zeros(nb), *dout = dev_zeros(nb);
  for (int k = 0; k < 4; k++) {
    const uint64_t first = 12345 + (uint64_t)k * 3; /* not a multiple of 4: mid-block words */
    kernel_ops_cpu.dropout_mask(NULL, ref, n, ps[k], 0x1234567890abcdefull + k, 3, 5, 7, first);
    kernel_ops_cuda.dropout_mask(fixture_ctx, dmask, n, ps[k], 0x1234567890abcdefull + k, 3, 5, 7,
                                 first);
    dev_download(got, dmask, nb);
    CHECK_MSG(same_bits(got, ref, nb), "mask p %g", ps[k]);
    kernel_ops_cpu.dropout_forward(NULL, refo, x, ref, n);
    kernel_ops_cuda.dropout_forward(fixture_ctx, dout, dx, dmask, n);
    dev_download(got, dout, nb);
    CHECK_MSG(same_bits(got, refo, nb), "forward p %g", ps[k]);
  }
  /* backward in place (dinp == dout) with the last mask */
  kernel_ops_cpu.dropout_backward(NULL, refo, x, ref, n);
  kernel_ops_cuda.dropout_backward(fixture_ctx, dx, dx, dmask, n);
  dev_download(got, dx, nb);
  CHECK(same_bits(got, refo, nb));
  /* a slice [a, n) drawn with first_elem + a is the whole draw's tail */
  const size_t a = 777;
  kernel_ops_cuda.dropout_mask(fixture_ctx, dout, n, 0.3f, 99, 1, 2, 3, 0);
  kernel_ops_cuda.dropout_mask(fixture_ctx, dmask, n - a, 0.3f, 99, 1, 2, 3, a);
  dev_download(ref, dout, nb);
  dev_download(got, dmask, (n - a) * sizeof(real));
  CHECK(same_bits(got, ref + a, (n - a) * sizeof(real)));
  CHECK_CUDA_OK();
  dev_free(dx), dev_free(dmask), dev_free(dout);
  free(x), free(ref), free(got), free(refo);
}

/* ---- sumsq ----
 * Both sum the same squares (each exact in double: a float squared has 48 bits) in double in
 * different orders; each order's error is ≤ (n − 1) · 2^-53 · Σx², so |Δ| ≤ 2n · 2^-53 · Σx².
 * The GPU's value is also the same bits on a second call. */
static void test_sumsq(void)
{
  const size_t sizes[] = { 0, 1, 1000, 3000017 };
  for (int s = 0; s < 4; s++) {
    const size_t n = sizes[s];
    real *x = host_uniform(n, 81 + s, 5.0);
    real *dx = dev_upload(x, n * sizeof(real));
    const double ref = kernel_ops_cpu.sumsq(NULL, x, n);
    const double got = kernel_ops_cuda.sumsq(fixture_ctx, dx, n);
    const double again = kernel_ops_cuda.sumsq(fixture_ctx, dx, n);
    CHECK_NEAR(got, ref, 2.0 * (double)n * DOUBLE_U * ref);
    CHECK(memcmp(&got, &again, sizeof got) == 0);
    CHECK_CUDA_OK();
    dev_free(dx);
    free(x);
  }
}

/* ---- AdamW: the CPU's operations in its order, so its bits, over three steps ---- */

static void test_adamw(void)
{
  const size_t sizes[] = { 77, 1000003 };
  for (int s = 0; s < 2; s++) {
    const size_t n = sizes[s], nb = n * sizeof(real);
    real *p = host_uniform(n, 91 + s, 1.0), *m = host_uniform(n, 92 + s, 0.01),
         *v = host_alloc(n), *g = host_uniform(n, 93 + s, 0.1);
    real *gp = host_alloc(n), *gm = host_alloc(n), *gv = host_alloc(n);
    for (size_t i = 0; i < n; i++) v[i] = 1e-4f + 1e-3f * fabsf(m[i]);
    real *dp = dev_upload(p, nb), *dm = dev_upload(m, nb), *dv = dev_upload(v, nb),
         *dg = dev_upload(g, nb);
    bf16 *rb = calloc(n, sizeof *rb), *gb = calloc(n, sizeof *gb);
    bf16 *db16 = dev_zeros(n * sizeof(bf16));
    for (int t = 1; t <= 3; t++) {
      const real gs = t == 2 ? 0.5f : 1.0f;
      if (t < 3) {
        kernel_ops_cpu.adamw_update(NULL, p, g, m, v, n, 1e-3, 0.9, 0.999, 1e-8, 0.1, t, gs);
        kernel_ops_cuda.adamw_update(fixture_ctx, dp, dg, dm, dv, n, 1e-3, 0.9, 0.999, 1e-8, 0.1,
                                     t, gs);
      } else {
        kernel_ops_cpu.adamw_update_bf16(NULL, p, rb, g, m, v, n, 3e-4, 0.9, 0.95, 1e-8, 0.0, t, gs);
        kernel_ops_cuda.adamw_update_bf16(fixture_ctx, dp, db16, dg, dm, dv, n, 3e-4, 0.9, 0.95,
                                          1e-8, 0.0, t, gs);
      }
      dev_download(gp, dp, nb), dev_download(gm, dm, nb), dev_download(gv, dv, nb);
      CHECK_MSG(same_bits(gp, p, nb) && same_bits(gm, m, nb) && same_bits(gv, v, nb),
                "n %zu step %d", n, t);
    }
    dev_download(gb, db16, n * sizeof(bf16));
    CHECK(same_bits(gb, rb, n * sizeof(bf16)));
    CHECK_CUDA_OK();
    dev_free(dp), dev_free(dm), dev_free(dv), dev_free(dg), dev_free(db16);
    free(p), free(m), free(v), free(g), free(gp), free(gm), free(gv), free(rb), free(gb);
  }
}

/* ---- round_bf16: exact, ties to even, NaN quiet, infinities kept ---- */

static void test_round_bf16(void)
{
  const size_t n = 70001;
  real *x = host_uniform(n, 101, 100.0);
  const uint32_t special[] = { 0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x7f800000u, 0xff800000u,
                               0x7fc00001u, 0xff800001u, 0x7f7fffffu, 0x80000000u, 0x00000001u };
  for (size_t k = 0; k < sizeof special / sizeof special[0]; k++) memcpy(&x[k], &special[k], 4);
  bf16 *rb = calloc(n, sizeof *rb), *gb = calloc(n, sizeof *gb);
  real *dx = dev_upload(x, n * sizeof(real));
  bf16 *db = dev_zeros(n * sizeof(bf16));
  kernel_ops_cpu.round_bf16(NULL, rb, x, n);
  kernel_ops_cuda.round_bf16(fixture_ctx, db, dx, n);
  dev_download(gb, db, n * sizeof(bf16));
  CHECK(same_bits(gb, rb, n * sizeof(bf16)));
  CHECK_CUDA_OK();
  dev_free(dx), dev_free(db);
  free(x), free(rb), free(gb);
}

/* ---- accumulate_bf16: the CPU's bits (one fp32 add, one rounding), on sums near ties ---- */

static void test_accumulate_bf16(void)
{
  const size_t n = 70001;
  real *x = host_uniform(n, 103, 10.0), *y = host_uniform(n, 107, 10.0);
  bf16 *a = calloc(n, sizeof *a), *b = calloc(n, sizeof *b), *ga = calloc(n, sizeof *ga);
  kernel_ops_cpu.round_bf16(NULL, a, x, n);
  kernel_ops_cpu.round_bf16(NULL, b, y, n);
  bf16 *da = dev_upload(a, n * sizeof(bf16)), *dbb = dev_upload(b, n * sizeof(bf16));
  kernel_ops_cpu.accumulate_bf16(NULL, a, b, n);
  kernel_ops_cuda.accumulate_bf16(fixture_ctx, da, dbb, n);
  dev_download(ga, da, n * sizeof(bf16));
  CHECK(same_bits(ga, a, n * sizeof(bf16)));
  CHECK_CUDA_OK();
  dev_free(da), dev_free(dbb);
  free(x), free(y), free(a), free(b), free(ga);
}

/* ---- RMSNorm ----
 * rstd: Σx² in double in another order (relative difference ≤ 2C · 2^-53), then 1/sqrt in
 * double rounded to float: equal, or one float rounding apart: |Δ| ≤ 2u · rstd.
 * out = (x · r) · w: r ≤ 2u apart plus two roundings each side: |Δ| ≤ 6u · |out|; bound 8u.
 * dinp = r·w·dy − k·x with k from a double dot (another order) rounded to float (≤ 2u apart):
 * |Δ| ≤ 4u · (|r w dy| + |k x|); bound 8u · the same.
 * dweight, accumulated onto a nonzero start: the bits of rmsnorm_dweight_model (the kernels'
 * order), and against the CPU: the same terms (each (dy·x)·rstd rounded once in double on both
 * sides) summed in another order, each order within (BT − 1)·2^-53·S of the exact sum,
 * S = Σ|term|, so the double sums are 2·BT·2^-53·S apart; each is rounded to float (u·S each)
 * and added to dw0 (u·(|dw0| + S) each): |Δ| ≤ 2·BT·2^-53·S + 4u·(S + |dw0|). */
#define DW_ROWS 128 /* cuda_pointwise.cu's kDwRows and kDwLanes */
#define DW_LANES 8

/* dweight[c] += Σ (dy·x)·rstd in the CUDA kernels' order: per block of DW_ROWS rows, lane k
 * the rows ≡ k mod DW_LANES in order, lanes summed 0, 1, ...; then the blocks in order. */
static void rmsnorm_dweight_model(real *dw, const real *dy, const real *x, const real *rstd, int BT,
                                  int C)
{
  for (int c = 0; c < C; c++) {
    double total = 0;
    for (int r0 = 0; r0 < BT; r0 += DW_ROWS) {
      const int r1 = r0 + DW_ROWS < BT ? r0 + DW_ROWS : BT;
      double lane[DW_LANES];
      for (int k = 0; k < DW_LANES; k++) {
        double acc = 0.0;
        for (int bt = r0 + k; bt < r1; bt += DW_LANES) {
          const size_t i = (size_t)bt * C + c;
          acc = acc + ((double)dy[i] * (double)x[i]) * (double)rstd[bt];
        }
        lane[k] = acc;
      }
      double part = lane[0];
      for (int k = 1; k < DW_LANES; k++) part = part + lane[k];
      total = r0 == 0 ? part : total + part;
    }
    dw[c] = dw[c] + (real)total;
  }
}

static void test_rmsnorm(void)
{
  const int shapes[5][2] = { { 1, 5 }, { 37, 1000 }, { 513, 4099 }, { 4096, 4096 }, { 4096, 8192 } };
  for (int s = 0; s < 5; s++) {
    const int BT = shapes[s][0], C = shapes[s][1];
    const size_t n = (size_t)BT * C, nb = n * sizeof(real), cb = (size_t)C * sizeof(real);
    const real eps = 1e-5f;
    real *x = host_uniform(n, 111 + s, 2.0), *w = host_uniform(C, 112 + s, 1.5),
         *dy = host_uniform(n, 113 + s, 1.0), *dw = host_uniform(C, 114 + s, 0.5);
    real *ref = host_alloc(n), *got = host_alloc(n), *rr = host_alloc(BT), *gr = host_alloc(BT),
         *rdx = host_alloc(n), *gdw = host_alloc(C);
    real *dx_ = dev_upload(x, nb), *dwt = dev_upload(w, cb), *ddy = dev_upload(dy, nb),
         *ddw = dev_upload(dw, cb), *dout = dev_zeros(nb), *drstd = dev_zeros(BT * sizeof(real));
    kernel_ops_cpu.rmsnorm_forward(NULL, ref, rr, x, w, BT, C, eps);
    kernel_ops_cuda.rmsnorm_forward(fixture_ctx, dout, drstd, dx_, dwt, BT, C, eps);
    dev_download(got, dout, nb), dev_download(gr, drstd, BT * sizeof(real));
    int ok = 1;
    for (int b = 0; b < BT; b++) ok &= fabs((double)gr[b] - rr[b]) <= 2 * U * rr[b];
    CHECK_MSG(ok, "rstd BT %d C %d", BT, C);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= fabs((double)got[i] - ref[i]) <= 8 * U * fabs((double)ref[i]);
    CHECK_MSG(ok, "out BT %d C %d", BT, C);
    /* in place (out == inp) on a copy */
    real *dcopy = dev_upload(x, nb);
    kernel_ops_cuda.rmsnorm_forward(fixture_ctx, dcopy, drstd, dcopy, dwt, BT, C, eps);
    real *got2 = host_alloc(n);
    dev_download(got2, dcopy, nb);
    CHECK_MSG(same_bits(got2, got, nb), "in place BT %d C %d", BT, C);
    /* bf16: the fp32 outputs are ≤ 8u apart, so one bf16 ulp at most */
    bf16 *rb = calloc(n, sizeof *rb), *gb = calloc(n, sizeof *gb);
    bf16 *db = dev_zeros(n * sizeof(bf16));
    kernel_ops_cpu.rmsnorm_forward_bf16(NULL, rb, rr, x, w, BT, C, eps);
    kernel_ops_cuda.rmsnorm_forward_bf16(fixture_ctx, db, drstd, dx_, dwt, BT, C, eps);
    dev_download(gb, db, n * sizeof(bf16));
    CHECK_MSG(bf16_close(gb, rb, n), "bf16 BT %d C %d", BT, C);
    /* backward from the same (CPU) rstd on both sides; dinp in place over a copy of dy */
    real *drr = dev_upload(rr, BT * sizeof(real));
    real *dw0 = host_alloc(C), *mdw = host_alloc(C);
    memcpy(dw0, dw, cb);
    memcpy(mdw, dw, cb);
    rmsnorm_dweight_model(mdw, dy, x, rr, BT, C);
    kernel_ops_cpu.rmsnorm_backward(NULL, rdx, dw, dy, x, w, rr, BT, C);
    kernel_ops_cuda.rmsnorm_backward(fixture_ctx, ddy, ddw, ddy, dx_, dwt, drr, BT, C);
    dev_download(got, ddy, nb), dev_download(gdw, ddw, cb);
    CHECK_MSG(same_bits(gdw, mdw, cb), "dweight (the blocked order) BT %d C %d", BT, C);
    ok = 1;
    for (int c = 0; c < C && ok; c++) {
      double S = 0;
      for (int b = 0; b < BT; b++)
        S += fabs((double)dy[(size_t)b * C + c] * x[(size_t)b * C + c] * rr[b]);
      const double tol = 2.0 * BT * DOUBLE_U * S + 4 * U * (S + fabs((double)dw0[c]));
      if (!(fabs((double)gdw[c] - dw[c]) <= tol)) {
        fprintf(stderr, "dweight [%d]: %.9g vs %.9g (bound %.3g)\n", c, gdw[c], dw[c], tol);
        ok = 0;
      }
    }
    CHECK_MSG(ok, "dweight against the CPU BT %d C %d", BT, C);
    ok = 1;
    for (int b = 0; b < BT && ok; b++) {
      double dot = 0;
      for (int c = 0; c < C; c++) dot += (double)dy[(size_t)b * C + c] * w[c] * x[(size_t)b * C + c];
      const double r = rr[b], k = r * r * r * dot / C;
      for (int c = 0; c < C; c++) {
        const size_t i = (size_t)b * C + c;
        const double tol = 8 * U * (fabs(r * w[c] * dy[i]) + fabs(k * x[i])) + FLT_MIN;
        if (!(fabs((double)got[i] - rdx[i]) <= tol)) {
          fprintf(stderr, "dinp [%d, %d]: %.9g vs %.9g\n", b, c, got[i], rdx[i]);
          ok = 0;
          break;
        }
      }
    }
    CHECK_MSG(ok, "dinp BT %d C %d", BT, C);
    CHECK_CUDA_OK();
    dev_free(dx_), dev_free(dwt), dev_free(ddy), dev_free(ddw), dev_free(dout), dev_free(drstd);
    dev_free(dcopy), dev_free(db), dev_free(drr);
    free(x), free(w), free(dy), free(dw), free(ref), free(got), free(rr), free(gr), free(rdx);
    free(gdw), free(got2), free(rb), free(gb), free(dw0), free(mdw);
  }
}

/* ---- embedding: copies, and float adds per dwte element in token order (the CPU's) ---- */

static void test_encoder(void)
{
  const int shapes[2][3] = { { 7, 33, 5 }, { 1031, 777, 300 } }; /* BT, C, Vp */
  for (int s = 0; s < 2; s++) {
    const int BT = shapes[s][0], C = shapes[s][1], Vp = shapes[s][2];
    const size_t n = (size_t)BT * C, nb = n * sizeof(real), wn = (size_t)Vp * C,
                 wb = wn * sizeof(real);
    int *tok = malloc(BT * sizeof *tok);
    uint64_t st = 5 + s;
    for (int b = 0; b < BT; b++) {
      st = st * 6364136223846793005ull + 1442695040888963407ull;
      tok[b] = (int)((st >> 33) % (uint64_t)(b % 3 == 0 ? 4 : Vp)); /* many repeats of 0..3 */
    }
    real *wte = host_uniform(wn, 121 + s, 1.0), *dy = host_uniform(n, 122 + s, 1.0),
         *dwte = host_uniform(wn, 123 + s, 0.1);
    real *ref = host_alloc(n), *got = host_alloc(n), *gw = host_alloc(wn);
    int *dtok = dev_upload(tok, BT * sizeof *tok);
    real *dwt = dev_upload(wte, wb), *ddy = dev_upload(dy, nb), *ddw = dev_upload(dwte, wb),
         *dout = dev_zeros(nb);
    kernel_ops_cpu.encoder_forward(NULL, ref, tok, wte, BT, C);
    kernel_ops_cuda.encoder_forward(fixture_ctx, dout, dtok, dwt, BT, C);
    dev_download(got, dout, nb);
    CHECK_MSG(same_bits(got, ref, nb), "forward BT %d C %d", BT, C);
    kernel_ops_cpu.encoder_backward(NULL, dwte, dy, tok, BT, C);
    kernel_ops_cuda.encoder_backward(fixture_ctx, ddw, ddy, dtok, BT, C);
    dev_download(gw, ddw, wb);
    CHECK_MSG(same_bits(gw, dwte, wb), "backward BT %d C %d", BT, C);
    /* shards: rows [v0, v0 + Vl) of the same table and gradient */
    const int v0 = 2, Vl = Vp / 2;
    const real *wsh = wte + (size_t)v0 * C;
    real *dwsh = dev_upload(wsh, (size_t)Vl * C * sizeof(real));
    kernel_ops_cpu.encoder_forward_shard(NULL, ref, tok, wsh, v0, Vl, BT, C);
    kernel_ops_cuda.encoder_forward_shard(fixture_ctx, dout, dtok, dwsh, v0, Vl, BT, C);
    dev_download(got, dout, nb);
    CHECK_MSG(same_bits(got, ref, nb), "forward shard BT %d C %d", BT, C);
    real *gsh = dwte + (size_t)v0 * C; /* the CPU's gradient so far, its rows of the shard */
    real *dgsh = dev_upload(gsh, (size_t)Vl * C * sizeof(real));
    kernel_ops_cpu.encoder_backward_shard(NULL, gsh, dy, tok, v0, Vl, BT, C);
    kernel_ops_cuda.encoder_backward_shard(fixture_ctx, dgsh, ddy, dtok, v0, Vl, BT, C);
    dev_download(gw, dgsh, (size_t)Vl * C * sizeof(real));
    CHECK_MSG(same_bits(gw, gsh, (size_t)Vl * C * sizeof(real)), "backward shard BT %d C %d", BT, C);
    /* the bf16 mode's lookup: the rows of the table's bf16 copy widened, the whole table and the
     * shard (and widen_bf16 on the same copy) */
    bf16 *wcopy = calloc(wn, sizeof *wcopy);
    kernel_ops_cpu.round_bf16(NULL, wcopy, wte, wn);
    bf16 *dwb = dev_upload(wcopy, wn * sizeof(bf16));
    kernel_ops_cpu.encoder_forward_bf16(NULL, ref, tok, wcopy, 0, Vp, BT, C);
    kernel_ops_cuda.encoder_forward_bf16(fixture_ctx, dout, dtok, dwb, 0, Vp, BT, C);
    dev_download(got, dout, nb);
    CHECK_MSG(same_bits(got, ref, nb), "forward bf16 BT %d C %d", BT, C);
    kernel_ops_cpu.encoder_forward_bf16(NULL, ref, tok, wcopy + (size_t)v0 * C, v0, Vl, BT, C);
    kernel_ops_cuda.encoder_forward_bf16(fixture_ctx, dout, dtok, dwb + (size_t)v0 * C, v0, Vl, BT, C);
    dev_download(got, dout, nb);
    CHECK_MSG(same_bits(got, ref, nb), "forward bf16 shard BT %d C %d", BT, C);
    real *wide = host_alloc(wn), *dwide = dev_zeros(wb);
    kernel_ops_cpu.widen_bf16(NULL, wide, wcopy, wn);
    kernel_ops_cuda.widen_bf16(fixture_ctx, dwide, dwb, wn);
    real *gwide = host_alloc(wn);
    dev_download(gwide, dwide, wb);
    CHECK_MSG(same_bits(gwide, wide, wb), "widen_bf16 of %zu", wn);
    dev_free(dwb), dev_free(dwide);
    free(wcopy), free(wide), free(gwide);
    CHECK_CUDA_OK();
    dev_free(dtok), dev_free(dwt), dev_free(ddy), dev_free(ddw), dev_free(dout), dev_free(dwsh);
    dev_free(dgsh);
    free(tok), free(wte), free(dy), free(dwte), free(ref), free(got), free(gw);
  }
}

int main(void)
{
  cuda_test_open();
  static const struct test_case t[] = {
    TEST(test_vec_add), TEST(test_swiglu), TEST(test_swiglu_rows), TEST(test_dropout),
    TEST(test_sumsq), TEST(test_adamw), TEST(test_round_bf16), TEST(test_accumulate_bf16), TEST(test_rmsnorm),
    TEST(test_encoder),
  };
  return test_run_all(t, (int)(sizeof t / sizeof t[0]));
}
