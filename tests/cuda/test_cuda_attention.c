/* The CUDA flash-style attention (kernels/cuda/cuda_dense.cu) against the CPU table's
 * (kernel_ops_cpu, the reference): forward (out and lse) and backward (dq, dk, dv), separate and
 * fused q|k|v layouts, grouped-query heads, dropout drawn inside the kernels, T not a multiple of
 * any tile, and a real size (T = 4096, HS = 128, two query heads on one KV head). Then the bits
 * that must not depend on the launch: a tensor-parallel shard of heads of one sample gives the
 * full run's bits, and a head size the kernels do not take is refused by name.
 *
 * Bounds, per element, as tests/cuda/test_cuda_dense.c argues them: both sides compute the same
 * formulas in fp32 in different orders (the CPU's sgemm blocks, the GPU's tiles and FMAs), so
 * each is within γ_n · |the same computation on absolute values| of the exact result, n the
 * roundings along the longest path; the test computes that "magnitude" in double and allows
 * 2 n u of it (u = 2^-24), n spelled out at each comparison. The online softmax adds one
 * rescaling of the running sum and output per key block (at most T blocks on either side, each
 * an exp and a product: 2u) to every term. Bits are compared only where the operations are the
 * same: the fused and the separate entries, a shard and the full run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_fixture.h"
#include "philox.h"

static real *host_alloc(size_t n) { return (real *)calloc(n ? n : 1, sizeof(real)); }
static double *dbl_alloc(size_t n) { return (double *)calloc(n ? n : 1, sizeof(double)); }
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

static int same_bits(const real *a, const real *b, size_t n, const char *what)
{
  for (size_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof(real)) != 0) {
      fprintf(stderr, "%s: [%zu] %.9g against %.9g\n", what, i, (double)a[i], (double)b[i]);
      return 0;
    }
  return 1;
}

/* One problem's host inputs. */
struct att {
  int B, T, NH, NKV, HS;
  size_t nq, nk, nl;
  real *q, *k, *v, *dout;
  uint32_t *samples;
  struct attention_dropout drop; /* p 0: none */
};

static void att_init(struct att *a, int B, int T, int NH, int NKV, int HS, float p, uint64_t seed)
{
  a->B = B, a->T = T, a->NH = NH, a->NKV = NKV, a->HS = HS;
  a->nq = (size_t)B * T * NH * HS, a->nk = (size_t)B * T * NKV * HS, a->nl = (size_t)B * NH * T;
  a->q = host_alloc(a->nq), a->k = host_alloc(a->nk), a->v = host_alloc(a->nk), a->dout = host_alloc(a->nq);
  fill_uniform(a->q, a->nq, seed, 2.0);
  fill_uniform(a->k, a->nk, seed + 1, 2.0);
  fill_uniform(a->v, a->nk, seed + 2, 1.0);
  fill_uniform(a->dout, a->nq, seed + 3, 1.0);
  a->samples = (uint32_t *)calloc((size_t)B, sizeof(uint32_t));
  for (int b = 0; b < B; b++) a->samples[b] = 1000u + 17u * (uint32_t)b + (uint32_t)seed;
  memset(&a->drop, 0, sizeof a->drop);
  a->drop.p = p;
  a->drop.seed = 0x5eed0000ull + seed;
  a->drop.c1 = 7;
  a->drop.c3 = (3u << 8) | 1u;
  a->drop.first = 0;
  a->drop.samples = a->samples;
}

static void att_free(struct att *a) { free(a->q), free(a->k), free(a->v), free(a->dout), free(a->samples); }

static const struct attention_dropout *att_drop(const struct att *a) { return a->drop.p > 0 ? &a->drop : NULL; }

/* M_ij as the kernels draw it: 0 or 1/(1 − p), 1 without dropout. */
static double att_m(const struct att *a, int b, int h, int i, int j)
{
  const struct attention_dropout *d = &a->drop;
  if (!(d->p > 0))
    return 1.0;
  const float keep = d->p < 1.0f ? 1.0f / (1.0f - d->p) : 0.0f;
  return attention_drop_u(d->seed, d->c1, d->samples[b], d->c3, d->first, h, i, j, a->T) < d->p ? 0.0 : keep;
}

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

/* The magnitudes every bound is a multiple of, from the CPU's lse (both sides' P = exp(s − lse)
 * in backward; in forward the same numbers to first order), in one pass over the causal pairs:
 *   mo (out's shape)  Σ_j P_ij M_ij |v_jd|
 *   mq (q's shape)    scale · Σ_j mdS_ij |k_jd|,  mdS_ij = P_ij (Σ_d |dout_id v_jd| M_ij + Σ_d |dout_id out_id|)
 *   mk (k's shape)    scale · Σ_{h in group} Σ_{i ≥ j} mdS_ij |q_id|
 *   mv (k's shape)    Σ_{h in group} Σ_{i ≥ j} P_ij M_ij |dout_id|
 * and per row the largest scaled |q|·|k| (smax) and, over all rows, the largest relative error
 * of a recomputed P on either side (e_p, below). */
struct mags {
  double *mo, *mq, *mk, *mv, *smax, e_p;
};

static void magnitudes(struct mags *g, const struct att *a, const real *out, const real *lse)
{
  const int B = a->B, T = a->T, NH = a->NH, NKV = a->NKV, HS = a->HS, group = NH / NKV;
  const double u = REAL_U, scale = 1.0 / sqrt((double)HS);
  g->mo = dbl_alloc(a->nq), g->mq = dbl_alloc(a->nq), g->mk = dbl_alloc(a->nk), g->mv = dbl_alloc(a->nk);
  g->smax = dbl_alloc(a->nl), g->e_p = 0;
  double *aq = dbl_alloc(a->nq), *ak = dbl_alloc(a->nk), *av = dbl_alloc(a->nk), *ado = dbl_alloc(a->nq);
  for (size_t e = 0; e < a->nq; e++) aq[e] = fabs((double)a->q[e]), ado[e] = fabs((double)a->dout[e]);
  for (size_t e = 0; e < a->nk; e++) ak[e] = fabs((double)a->k[e]), av[e] = fabs((double)a->v[e]);
  const size_t ldq = (size_t)NH * HS, ldk = (size_t)NKV * HS;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const size_t qi = ((size_t)b * T + i) * ldq + (size_t)h * HS, row = ((size_t)b * NH + h) * T + i;
        const double l = lse[row];
        double dm = 0, smax = 0;
        for (int d = 0; d < HS; d++) dm += ado[qi + d] * fabs((double)out[qi + d]);
        for (int j = 0; j <= i; j++) {
          const size_t kj = ((size_t)b * T + j) * ldk + (size_t)(h / group) * HS;
          double s = 0, sa = 0, dpa = 0;
          for (int d = 0; d < HS; d++) {
            s += (double)a->q[qi + d] * a->k[kj + d];
            sa += aq[qi + d] * ak[kj + d];
            dpa += ado[qi + d] * av[kj + d];
          }
          s *= scale, sa *= scale;
          smax = sa > smax ? sa : smax;
          /* P on either side: the score's dot (HS roundings) and scaling, s − lse, exp (≤ 2 ulp):
           * relative (HS + 2) u · sa + u (|s| + |lse|) + 2u a side */
          const double ep = 2.0 * ((HS + 2) * u * sa + u * (fabs(s) + fabs(l)) + 2.0 * u);
          g->e_p = ep > g->e_p ? ep : g->e_p;
          const double P = exp(s - l), m = att_m(a, b, h, i, j), pm = P * m;
          const double mds = P * (dpa * m + dm);
          for (int d = 0; d < HS; d++) {
            g->mo[qi + d] += pm * av[kj + d];
            g->mq[qi + d] += scale * mds * ak[kj + d];
            g->mk[kj + d] += scale * mds * aq[qi + d];
            g->mv[kj + d] += pm * ado[qi + d];
          }
        }
        g->smax[row] = smax;
      }
  free(aq), free(ak), free(av), free(ado);
}

static void mags_free(struct mags *g) { free(g->mo), free(g->mq), free(g->mk), free(g->mv), free(g->smax); }

static void attention_case(int B, int T, int NH, int NKV, int HS, float p, uint64_t seed)
{
  struct att a;
  att_init(&a, B, T, NH, NKV, HS, p, seed);
  const struct attention_dropout *drop = att_drop(&a);
  const int group = NH / NKV;
  const size_t ld = (size_t)(NH + 2 * NKV) * HS, nqkv = (size_t)B * T * ld, big = nqkv > a.nq ? nqkv : a.nq;
  const double u = REAL_U;

  /* the reference */
  const size_t ns_cpu = kernel_ops_cpu.attention_scratch_n_elems(NULL, B, T, NH, NKV, HS);
  const size_t ns_cuda = kernel_ops_cuda.attention_scratch_n_elems(NULL, B, T, NH, NKV, HS);
  CHECK_MSG(ns_cuda == (size_t)B * NH * T, "scratch %zu elements, not B · NH · T", ns_cuda);
  real *scratch = host_alloc(ns_cpu), *out = host_alloc(a.nq), *lse = host_alloc(a.nl);
  real *dq = host_alloc(a.nq), *dk = host_alloc(a.nk), *dv = host_alloc(a.nk);
  kernel_ops_cpu.attention_forward(NULL, out, lse, scratch, a.q, a.k, a.v, drop, B, T, NH, NKV, HS);
  kernel_ops_cpu.attention_backward(NULL, dq, dk, dv, scratch, a.dout, a.q, a.k, a.v, out, lse, drop, B, T, NH, NKV,
                                    HS);
  struct mags g;
  magnitudes(&g, &a, out, lse);

  /* forward */
  real *q_d = dev_copy(a.q, a.nq), *k_d = dev_copy(a.k, a.nk), *v_d = dev_copy(a.v, a.nk);
  real *dout_d = dev_copy(a.dout, a.nq), *out_d = dev_zeros(sizeof(real) * a.nq);
  real *lse_d = dev_zeros(sizeof(real) * a.nl), *s_d = dev_zeros(sizeof(real) * ns_cuda);
  kernel_ops_cuda.attention_forward(fixture_ctx, out_d, lse_d, s_d, q_d, k_d, v_d, drop, B, T, NH, NKV, HS);
  real *got = host_alloc(big), *got2 = host_alloc(big);
  double *bnd = dbl_alloc(big);

  /* e_s: the two sides' scores apart by ≤ 2 (HS + 4) u · smax (a dot of HS terms, the scaling and
   * s − max, each side). out_d = Σ_j P_j M_j v_jd / 1: log P moves by ≤ 2 e_s; exp (2u), the
   * block rescalings (≤ 2T u), the final 1/l and product (4u), a side; T products and adds a
   * side: (2 e_s + 2 (2T + 6) u + 2 (T + 2) u) · mo. */
  const size_t ldq = (size_t)NH * HS;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < T; i++) {
        const size_t row = ((size_t)b * NH + h) * T + i, qi = ((size_t)b * T + i) * ldq + (size_t)h * HS;
        const double e_s = 2.0 * (HS + 4) * u * g.smax[row];
        for (int d = 0; d < HS; d++)
          bnd[qi + d] = (2.0 * e_s + 2.0 * (2.0 * T + 6) * u + 2.0 * (T + 2) * u) * g.mo[qi + d];
      }
  download(got, out_d, a.nq);
  CHECK(within(got, out, bnd, a.nq, "attention_forward out"));
  /* lse = m + log l: the scores' shift (≤ e_s, a smooth max), l's relative error (its T terms,
   * their exp and rescalings: (2T + 6) u a side), the roundings of log and of the sum
   * (u (|lse| + smax + log T + 1) a side) */
  for (size_t row = 0; row < a.nl; row++) {
    const double e_s = 2.0 * (HS + 4) * u * g.smax[row];
    bnd[row] = e_s + 2.0 * (2.0 * T + 6) * u + 2.0 * u * (fabs((double)lse[row]) + g.smax[row] + log((double)T) + 1);
  }
  download(got, lse_d, a.nl);
  CHECK(within(got, lse, bnd, a.nl, "attention_forward lse"));

  /* the fused forward: the same bits as the separate one */
  real *qkv = att_fuse(&a, a.q, a.k, a.v);
  real *qkv_d = dev_copy(qkv, nqkv), *out2_d = dev_zeros(sizeof(real) * a.nq), *lse2_d = dev_zeros(sizeof(real) * a.nl);
  kernel_ops_cuda.attention_forward_qkv(fixture_ctx, out2_d, lse2_d, s_d, qkv_d, drop, B, T, NH, NKV, HS);
  download(got, out_d, a.nq);
  download(got2, out2_d, a.nq);
  CHECK(same_bits(got2, got, a.nq, "attention_forward_qkv out against attention_forward's"));
  download(got, lse_d, a.nl);
  download(got2, lse2_d, a.nl);
  CHECK(same_bits(got2, got, a.nl, "attention_forward_qkv lse against attention_forward's"));

  /* backward from the CPU's out and lse on both sides (the same inputs). Each recomputed P is
   * within e_p of the other side's (magnitudes); dP and D are dots of HS terms, dS two more
   * operations; dq sums T terms, dk and dv T · group; the scalings: a bound of
   * (e_p + 2 (HS + T · group + 8) u) · the magnitude, for all three. */
  real *outc_d = dev_copy(out, a.nq), *lsec_d = dev_copy(lse, a.nl);
  real *dq_d = dev_zeros(sizeof(real) * a.nq), *dk_d = dev_zeros(sizeof(real) * a.nk), *dv_d = dev_zeros(sizeof(real) * a.nk);
  kernel_ops_cuda.attention_backward(fixture_ctx, dq_d, dk_d, dv_d, s_d, dout_d, q_d, k_d, v_d, outc_d, lsec_d, drop,
                                     B, T, NH, NKV, HS);
  const double fac = g.e_p + 2.0 * (HS + (double)T * group + 8) * u;
  for (size_t e = 0; e < a.nq; e++) bnd[e] = fac * g.mq[e];
  download(got, dq_d, a.nq);
  CHECK(within(got, dq, bnd, a.nq, "attention_backward dq"));
  for (size_t e = 0; e < a.nk; e++) bnd[e] = fac * g.mk[e];
  download(got, dk_d, a.nk);
  CHECK(within(got, dk, bnd, a.nk, "attention_backward dk"));
  for (size_t e = 0; e < a.nk; e++) bnd[e] = fac * g.mv[e];
  download(got, dv_d, a.nk);
  CHECK(within(got, dv, bnd, a.nk, "attention_backward dv"));

  /* the fused backward: the same bits in dqkv's rows; dqkv starts as garbage (assigned) */
  real *junk = host_alloc(nqkv);
  fill_uniform(junk, nqkv, seed + 9, 100.0);
  real *dqkv_d = dev_copy(junk, nqkv);
  kernel_ops_cuda.attention_backward_qkv(fixture_ctx, dqkv_d, s_d, dout_d, qkv_d, outc_d, lsec_d, drop, B, T, NH, NKV,
                                         HS);
  real *gq = host_alloc(a.nq), *gk = host_alloc(a.nk), *gv = host_alloc(a.nk);
  download(gq, dq_d, a.nq);
  download(gk, dk_d, a.nk);
  download(gv, dv_d, a.nk);
  real *fused = att_fuse(&a, gq, gk, gv);
  download(got, dqkv_d, nqkv);
  CHECK(same_bits(got, fused, nqkv, "attention_backward_qkv against attention_backward"));

  /* the backward from the GPU's own out and lse runs too and is finite */
  kernel_ops_cuda.attention_backward(fixture_ctx, dq_d, dk_d, dv_d, s_d, dout_d, q_d, k_d, v_d, out_d, lse_d, drop, B,
                                     T, NH, NKV, HS);
  download(got, dq_d, a.nq);
  int finite = 1;
  for (size_t e = 0; e < a.nq; e++) finite &= isfinite(got[e]) != 0;
  download(got, dk_d, a.nk);
  for (size_t e = 0; e < a.nk; e++) finite &= isfinite(got[e]) != 0;
  CHECK_MSG(finite, "dq or dk from the GPU's own forward not finite");
  CHECK_CUDA_OK();

  dev_free(q_d), dev_free(k_d), dev_free(v_d), dev_free(dout_d), dev_free(out_d), dev_free(lse_d), dev_free(s_d);
  dev_free(qkv_d), dev_free(out2_d), dev_free(lse2_d), dev_free(outc_d), dev_free(lsec_d), dev_free(dq_d);
  dev_free(dk_d), dev_free(dv_d), dev_free(dqkv_d);
  free(scratch), free(out), free(lse), free(dq), free(dk), free(dv), free(got), free(got2), free(bnd), free(qkv);
  free(junk), free(gq), free(gk), free(gv), free(fused);
  mags_free(&g);
  att_free(&a);
}

/* T = 37, 45, 300, 280, 100: never a multiple of the 64- or 32-row tiles. */
static void test_attention_small(void) { attention_case(2, 37, 4, 2, 24, 0.0f, 41); }
static void test_attention_small_dropout(void) { attention_case(2, 37, 4, 2, 24, 0.25f, 42); }
static void test_attention_mha_dropout(void) { attention_case(1, 45, 3, 3, 40, 0.25f, 43); }
static void test_attention_large(void) { attention_case(1, 300, 8, 2, 64, 0.0f, 44); }
static void test_attention_large_dropout(void) { attention_case(2, 280, 4, 1, 72, 0.1f, 45); }
static void test_attention_hs256(void) { attention_case(1, 100, 2, 1, 256, 0.1f, 46); }
/* a real size: Llama's head size at seq 4096, two query heads sharing one KV head */
static void test_attention_real_size(void) { attention_case(1, 4096, 2, 1, 128, 0.0f, 47); }

/* Query heads [h0, h0 + n) of sample b of x (B, T, NHx, HS), as a (1, T, n, HS) buffer. */
static real *heads_of(const real *x, int b, int T, int NHx, int HS, int h0, int n)
{
  real *r = host_alloc((size_t)T * n * HS);
  for (int t = 0; t < T; t++)
    memcpy(r + (size_t)t * n * HS, x + (((size_t)b * T + t) * NHx + h0) * HS, sizeof(real) * (size_t)n * HS);
  return r;
}

/* The second tensor-parallel rank's shard (query heads 2, 3 on KV head 1, its dropout at
 * first = 2 · T · T) of sample 1 alone gives the bits of the full run (B = 2, NH = 4, NKV = 2):
 * nothing in a (sample, head) depends on the launch, on B or on the other heads. */
static void test_attention_shard_bits(void)
{
  const int B = 2, T = 150, NH = 4, NKV = 2, HS = 64, b = 1, h0 = 2, n = 2;
  struct att a;
  att_init(&a, B, T, NH, NKV, HS, 0.2f, 48);
  const size_t ns = kernel_ops_cuda.attention_scratch_n_elems(NULL, B, T, NH, NKV, HS);
  real *q_d = dev_copy(a.q, a.nq), *k_d = dev_copy(a.k, a.nk), *v_d = dev_copy(a.v, a.nk);
  real *dout_d = dev_copy(a.dout, a.nq), *out_d = dev_zeros(sizeof(real) * a.nq), *lse_d = dev_zeros(sizeof(real) * a.nl);
  real *dq_d = dev_zeros(sizeof(real) * a.nq), *dk_d = dev_zeros(sizeof(real) * a.nk), *dv_d = dev_zeros(sizeof(real) * a.nk);
  real *s_d = dev_zeros(sizeof(real) * ns);
  kernel_ops_cuda.attention_forward(fixture_ctx, out_d, lse_d, s_d, q_d, k_d, v_d, &a.drop, B, T, NH, NKV, HS);
  kernel_ops_cuda.attention_backward(fixture_ctx, dq_d, dk_d, dv_d, s_d, dout_d, q_d, k_d, v_d, out_d, lse_d, &a.drop,
                                     B, T, NH, NKV, HS);
  real *out = host_alloc(a.nq), *lse = host_alloc(a.nl), *dq = host_alloc(a.nq), *dk = host_alloc(a.nk);
  real *dv = host_alloc(a.nk);
  download(out, out_d, a.nq), download(lse, lse_d, a.nl), download(dq, dq_d, a.nq);
  download(dk, dk_d, a.nk), download(dv, dv_d, a.nk);

  /* the shard: its q, k, v, dout; its sample's c2; its heads' dropout offset */
  struct attention_dropout sd = a.drop;
  uint32_t c2 = a.samples[b];
  sd.samples = &c2;
  sd.first = (uint64_t)h0 * T * T;
  real *sq = heads_of(a.q, b, T, NH, HS, h0, n), *sk = heads_of(a.k, b, T, NKV, HS, 1, 1);
  real *sv = heads_of(a.v, b, T, NKV, HS, 1, 1), *sdo = heads_of(a.dout, b, T, NH, HS, h0, n);
  const size_t nq = (size_t)T * n * HS, nk = (size_t)T * HS;
  const size_t ns1 = kernel_ops_cuda.attention_scratch_n_elems(NULL, 1, T, n, 1, HS);
  real *sq_d = dev_copy(sq, nq), *sk_d = dev_copy(sk, nk), *sv_d = dev_copy(sv, nk), *sdo_d = dev_copy(sdo, nq);
  real *so_d = dev_zeros(sizeof(real) * nq), *sl_d = dev_zeros(sizeof(real) * (size_t)n * T);
  real *sdq_d = dev_zeros(sizeof(real) * nq), *sdk_d = dev_zeros(sizeof(real) * nk), *sdv_d = dev_zeros(sizeof(real) * nk);
  real *ss_d = dev_zeros(sizeof(real) * ns1);
  kernel_ops_cuda.attention_forward(fixture_ctx, so_d, sl_d, ss_d, sq_d, sk_d, sv_d, &sd, 1, T, n, 1, HS);
  kernel_ops_cuda.attention_backward(fixture_ctx, sdq_d, sdk_d, sdv_d, ss_d, sdo_d, sq_d, sk_d, sv_d, so_d, sl_d, &sd,
                                     1, T, n, 1, HS);
  real *got = host_alloc(nq);
  real *want = heads_of(out, b, T, NH, HS, h0, n);
  download(got, so_d, nq);
  CHECK(same_bits(got, want, nq, "shard out against the full run's"));
  free(want);
  download(got, sl_d, (size_t)n * T);
  CHECK(same_bits(got, lse + ((size_t)b * NH + h0) * T, (size_t)n * T, "shard lse against the full run's"));
  want = heads_of(dq, b, T, NH, HS, h0, n);
  download(got, sdq_d, nq);
  CHECK(same_bits(got, want, nq, "shard dq against the full run's"));
  free(want);
  want = heads_of(dk, b, T, NKV, HS, 1, 1);
  download(got, sdk_d, nk);
  CHECK(same_bits(got, want, nk, "shard dk against the full run's"));
  free(want);
  want = heads_of(dv, b, T, NKV, HS, 1, 1);
  download(got, sdv_d, nk);
  CHECK(same_bits(got, want, nk, "shard dv against the full run's"));
  free(want);
  CHECK_CUDA_OK();

  dev_free(q_d), dev_free(k_d), dev_free(v_d), dev_free(dout_d), dev_free(out_d), dev_free(lse_d), dev_free(dq_d);
  dev_free(dk_d), dev_free(dv_d), dev_free(s_d), dev_free(sq_d), dev_free(sk_d), dev_free(sv_d), dev_free(sdo_d);
  dev_free(so_d), dev_free(sl_d), dev_free(sdq_d), dev_free(sdk_d), dev_free(sdv_d), dev_free(ss_d);
  free(out), free(lse), free(dq), free(dk), free(dv), free(sq), free(sk), free(sv), free(sdo), free(got);
  att_free(&a);
}

/* A head size over the kernels' largest tile is the context's failure, by name, before any
 * memory is touched (a context of its own: the failure stays recorded). */
static void test_attention_head_size_refused(void)
{
  char err[512];
  void *ctx = cuda_ctx_create(0, err, sizeof err);
  CHECK_MSG(ctx != NULL, "%s", err);
  if (!ctx)
    return;
  kernel_ops_cuda.attention_forward(ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 8, 1, 1, 264);
  CHECK_STR_CONTAINS(cuda_ctx_error(ctx), "attention: head size 264: the CUDA attention takes at most 256");
  cuda_ctx_destroy(ctx);
}

int main(void)
{
  cuda_test_open();
  static const struct test_case t[] = {
    TEST(test_attention_small),       TEST(test_attention_small_dropout), TEST(test_attention_mha_dropout),
    TEST(test_attention_large),       TEST(test_attention_large_dropout), TEST(test_attention_hs256),
    TEST(test_attention_real_size),   TEST(test_attention_shard_bits),    TEST(test_attention_head_size_refused),
  };
  return test_run_all(t, (int)(sizeof t / sizeof t[0]));
}
