/* Context parallelism's attention blocks on CUDA (kernels/cuda/cuda_attention_cp.cu) against the
 * CPU table's (kernel_ops_cpu.attention_cp_*, the reference) on the same inputs: a block's
 * forward (out, lse), the log-sum-exp merge of two partials, the row dots and the block's
 * backward (dq, dk, dv accumulated onto nonzero values). The blocks: one that straddles the
 * causal diagonal, read at a row offset inside larger buffers (q_rows, kv_rows past the block);
 * one wholly below it (every key before every row) with dropout; one with grouped heads and
 * dropout whose first rows see no key of the block (out 0, lse −∞, and the merge leaves such a
 * row's other partial as it is); and one at head size 128. Dropout is drawn at the global row,
 * key and T on both sides.
 *
 * Bounds as tests/cuda/test_cuda_attention.c argues them for the whole-sequence kernels, over the
 * block's Tk keys instead of T: per element a multiple of the "magnitude" (the same sums on
 * absolute values, in double), the multiple spelled out at each comparison; the accumulating
 * entries add the rounding of one more sum (2u of the start value and of the share). The merge
 * and the row dots compute in double on both sides and round once, so they are held to 2u of
 * their terms' magnitude. */
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

/* Every element: equal (−∞ included), or |got − want| ≤ bound[i] (+ the smallest normal). */
static int within(const real *got, const real *want, const double *bound, size_t n, const char *what)
{
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < n; i++)
    if (!(got[i] == want[i] || fabs((double)got[i] - want[i]) <= bound[i] + 1e-37)) {
      if (!bad) first = i;
      bad++;
    }
  if (bad)
    fprintf(stderr, "%s: %zu of %zu beyond the bound; first [%zu]: got %.9g, want %.9g, bound %.3g\n", what, bad,
            n, first, (double)got[first], (double)want[first], bound[first]);
  return bad == 0;
}

/* One case: a sequence's inputs and a block of it in buffers with spare rows. */
struct cpc {
  int B, T, NH, NKV, HS, group;
  struct attention_block blk;
  int qoff, koff;               /* the block's first row inside its buffers */
  size_t nq, nk, nl;            /* the buffers' elements: (B, q_rows, NH·HS), (B, kv_rows, NKV·HS), (B, NH, q_rows) */
  real *q, *k, *v, *dout;       /* the whole sequence, (B, T, ·) */
  real *out, *lse;              /* the whole sequence's attention (CPU) */
  real *bq, *bk, *bv, *bdout, *bout, *blse; /* the block's rows in their buffers */
  uint32_t *samples;
  struct attention_dropout drop;
};

/* rows [start, start + n) of src (B, T, W) → dst (B, rows, W) from row off. */
static void take_rows(real *dst, const real *src, int B, int T, int W, int start, int n, int rows, int off)
{
  for (int b = 0; b < B; b++)
    memcpy(dst + ((size_t)b * rows + off) * W, src + ((size_t)b * T + start) * W, sizeof(real) * (size_t)n * W);
}

static void cpc_init(struct cpc *c, int B, int T, int NH, int NKV, int HS, float p, uint64_t seed, int q0, int Tq,
                     int k0, int Tk, int qoff, int koff)
{
  memset(c, 0, sizeof *c);
  c->B = B, c->T = T, c->NH = NH, c->NKV = NKV, c->HS = HS, c->group = NH / NKV;
  c->qoff = qoff, c->koff = koff;
  const struct attention_block blk = { T, q0, Tq, k0, Tk, Tq + qoff + 2, Tk + koff + 3 };
  c->blk = blk;
  const size_t C = (size_t)NH * HS, CK = (size_t)NKV * HS, nqw = (size_t)B * T * C, nkw = (size_t)B * T * CK;
  c->q = host_alloc(nqw), c->k = host_alloc(nkw), c->v = host_alloc(nkw), c->dout = host_alloc(nqw);
  fill_uniform(c->q, nqw, seed, 2.0);
  fill_uniform(c->k, nkw, seed + 1, 2.0);
  fill_uniform(c->v, nkw, seed + 2, 1.0);
  fill_uniform(c->dout, nqw, seed + 3, 1.0);
  c->samples = (uint32_t *)calloc((size_t)B, sizeof(uint32_t));
  for (int b = 0; b < B; b++) c->samples[b] = 2000u + 13u * (uint32_t)b + (uint32_t)seed;
  c->drop.p = p, c->drop.seed = 0xc0de0000ull + seed, c->drop.c1 = 5, c->drop.c3 = (2u << 8) | 1u;
  c->drop.first = 0, c->drop.samples = c->samples;
  const struct attention_dropout *drop = p > 0 ? &c->drop : NULL;
  c->out = host_alloc(nqw), c->lse = host_alloc((size_t)B * NH * T);
  real *scratch = host_alloc(kernel_ops_cpu.attention_scratch_n_elems(NULL, B, T, NH, NKV, HS));
  kernel_ops_cpu.attention_forward(NULL, c->out, c->lse, scratch, c->q, c->k, c->v, drop, B, T, NH, NKV, HS);
  free(scratch);
  c->nq = (size_t)B * blk.q_rows * C, c->nk = (size_t)B * blk.kv_rows * CK, c->nl = (size_t)B * NH * blk.q_rows;
  c->bq = host_alloc(c->nq), c->bdout = host_alloc(c->nq), c->bout = host_alloc(c->nq), c->blse = host_alloc(c->nl);
  c->bk = host_alloc(c->nk), c->bv = host_alloc(c->nk);
  take_rows(c->bq, c->q, B, T, (int)C, q0, Tq, blk.q_rows, qoff);
  take_rows(c->bdout, c->dout, B, T, (int)C, q0, Tq, blk.q_rows, qoff);
  take_rows(c->bout, c->out, B, T, (int)C, q0, Tq, blk.q_rows, qoff);
  take_rows(c->bk, c->k, B, T, (int)CK, k0, Tk, blk.kv_rows, koff);
  take_rows(c->bv, c->v, B, T, (int)CK, k0, Tk, blk.kv_rows, koff);
  take_rows(c->blse, c->lse, B * NH, T, 1, q0, Tq, blk.q_rows, qoff);
}

static void cpc_free(struct cpc *c)
{
  free(c->q), free(c->k), free(c->v), free(c->dout), free(c->out), free(c->lse), free(c->samples);
  free(c->bq), free(c->bk), free(c->bv), free(c->bdout), free(c->bout), free(c->blse);
}

static const struct attention_dropout *cpc_drop(const struct cpc *c) { return c->drop.p > 0 ? &c->drop : NULL; }

static double cpc_m(const struct cpc *c, int b, int h, int i, int j)
{
  const struct attention_dropout *d = &c->drop;
  if (!(d->p > 0))
    return 1.0;
  const float keep = d->p < 1.0f ? 1.0f / (1.0f - d->p) : 0.0f;
  return attention_drop_u(d->seed, d->c1, d->samples[b], d->c3, d->first, h, i, j, c->T) < d->p ? 0.0 : keep;
}

/* The block's magnitudes (buffer layouts), with lse the given per-row values (the block's partial
 * for forward, the final for backward; −∞: the row has no term), as test_cuda_attention.c's:
 * mo Σ_j P M |v|, mq scale Σ_j mdS |k|, mk scale Σ_h Σ_i mdS |q|, mv Σ_h Σ_i P M |dout|, smax the
 * row's largest scaled |q|·|k|, e_p the largest relative error of a recomputed P. */
struct mags {
  double *mo, *mq, *mk, *mv, *smax, e_p;
};

static void block_mags(struct mags *g, const struct cpc *c, const real *lse)
{
  const struct attention_block *s = &c->blk;
  const int HS = c->HS, NH = c->NH;
  const size_t C = (size_t)NH * HS, CK = (size_t)c->NKV * HS;
  const double u = REAL_U, scale = 1.0 / sqrt((double)HS);
  g->mo = dbl_alloc(c->nq), g->mq = dbl_alloc(c->nq), g->mk = dbl_alloc(c->nk), g->mv = dbl_alloc(c->nk);
  g->smax = dbl_alloc(c->nl), g->e_p = 0;
  for (int b = 0; b < c->B; b++)
    for (int h = 0; h < NH; h++)
      for (int il = 0; il < s->Tq; il++) {
        const size_t qi = ((size_t)b * s->q_rows + c->qoff + il) * C + (size_t)h * HS;
        const size_t row = ((size_t)b * NH + h) * s->q_rows + c->qoff + il;
        const double l = lse[row];
        double dm = 0, smax = 0;
        for (int d = 0; d < HS; d++) dm += fabs((double)c->bdout[qi + d] * c->bout[qi + d]);
        for (int jl = 0; jl < s->Tk && s->k0 + jl <= s->q0 + il; jl++) {
          const size_t kj = ((size_t)b * s->kv_rows + c->koff + jl) * CK + (size_t)(h / c->group) * HS;
          double sc = 0, sa = 0, dpa = 0;
          for (int d = 0; d < HS; d++) {
            sc += (double)c->bq[qi + d] * c->bk[kj + d];
            sa += fabs((double)c->bq[qi + d] * c->bk[kj + d]);
            dpa += fabs((double)c->bdout[qi + d] * c->bv[kj + d]);
          }
          sc *= scale, sa *= scale;
          smax = sa > smax ? sa : smax;
          const double ep = 2.0 * ((HS + 2) * u * sa + u * (fabs(sc) + fabs(l)) + 2.0 * u);
          g->e_p = ep > g->e_p ? ep : g->e_p;
          const double P = exp(sc - l), m = cpc_m(c, b, h, s->q0 + il, s->k0 + jl), pm = P * m;
          const double mds = P * (dpa * m + dm);
          for (int d = 0; d < HS; d++) {
            g->mo[qi + d] += pm * fabs((double)c->bv[kj + d]);
            g->mq[qi + d] += scale * mds * fabs((double)c->bk[kj + d]);
            g->mk[kj + d] += scale * mds * fabs((double)c->bq[qi + d]);
            g->mv[kj + d] += pm * fabs((double)c->bdout[qi + d]);
          }
        }
        g->smax[row] = smax;
      }
}

static void mags_free(struct mags *g) { free(g->mo), free(g->mq), free(g->mk), free(g->mv), free(g->smax); }

static void block_case(int B, int T, int NH, int NKV, int HS, float p, uint64_t seed, int q0, int Tq, int k0, int Tk,
                       int qoff, int koff)
{
  struct cpc c;
  cpc_init(&c, B, T, NH, NKV, HS, p, seed, q0, Tq, k0, Tk, qoff, koff);
  const struct attention_dropout *drop = cpc_drop(&c);
  const struct attention_block *blk = &c.blk;
  const size_t C = (size_t)NH * HS, CK = (size_t)NKV * HS, oq = (size_t)qoff * C, ok = (size_t)koff * CK;
  const double u = REAL_U;
  char what[160];
  const size_t big = c.nq > c.nk ? c.nq : c.nk;
  real *got = host_alloc(big);
  double *bnd = dbl_alloc(big);

  /* forward: the CPU's partial, then the GPU's into zeroed buffers */
  const size_t ns = kernel_ops_cpu.attention_cp_scratch_n_elems(NULL, B, Tq, Tk, NH, NKV, HS);
  real *scratch = host_alloc(ns), *out = host_alloc(c.nq), *lse = host_alloc(c.nl);
  kernel_ops_cpu.attention_cp_forward(NULL, out + oq, lse + qoff, scratch, c.bq + oq, c.bk + ok, c.bv + ok, drop,
                                      blk, B, NH, NKV, HS);
  const size_t ns_d = kernel_ops_cuda.attention_cp_scratch_n_elems(NULL, B, Tq, Tk, NH, NKV, HS);
  real *q_d = dev_copy(c.bq, c.nq), *k_d = dev_copy(c.bk, c.nk), *v_d = dev_copy(c.bv, c.nk);
  real *dout_d = dev_copy(c.bdout, c.nq), *s_d = dev_zeros(sizeof(real) * ns_d);
  real *out_d = dev_zeros(sizeof(real) * c.nq), *lse_d = dev_zeros(sizeof(real) * c.nl);
  kernel_ops_cuda.attention_cp_forward(fixture_ctx, out_d + oq, lse_d + qoff, s_d, q_d + oq, k_d + ok, v_d + ok, drop,
                                       blk, B, NH, NKV, HS);
  struct mags g;
  block_mags(&g, &c, lse);
  /* out: (2 e_s + 2 (2 Tk + 6) u + 2 (Tk + 2) u) · mo, e_s = 2 (HS + 4) u · smax (the whole
   * sequence's argument over the block's Tk keys); the spare rows stay 0 on both sides */
  for (size_t e = 0; e < c.nq; e++) {
    const size_t bt = e / C, b = bt / blk->q_rows, t = bt % blk->q_rows, h = (e % C) / HS;
    const double e_s = 2.0 * (HS + 4) * u * g.smax[(b * NH + h) * blk->q_rows + t];
    bnd[e] = (2.0 * e_s + 2.0 * (2.0 * Tk + 6) * u + 2.0 * (Tk + 2) * u) * g.mo[e];
  }
  download(got, out_d, c.nq);
  snprintf(what, sizeof what, "attention_cp_forward out (T %d, rows %d+%d, keys %d+%d, p %g)", T, q0, Tq, k0, Tk,
           (double)p);
  CHECK(within(got, out, bnd, c.nq, what));
  for (size_t r = 0; r < c.nl; r++)
    bnd[r] = 2.0 * (HS + 4) * u * g.smax[r] + 2.0 * (2.0 * Tk + 6) * u +
             2.0 * u * (fabs((double)lse[r]) + g.smax[r] + log((double)Tk) + 1);
  download(got, lse_d, c.nl);
  snprintf(what, sizeof what, "attention_cp_forward lse (T %d, rows %d+%d, keys %d+%d)", T, q0, Tq, k0, Tk);
  CHECK(within(got, lse, bnd, c.nl, what));
  mags_free(&g);

  /* merge: the whole sequence's rows (out, lse) with the block's partial, the same inputs on both
   * sides; both in double, rounded once: 2u of |ca · out| + |cb · out_b| ≤ |out| + |out_b| */
  real *m_out = host_alloc(c.nq), *m_lse = host_alloc(c.nl);
  memcpy(m_out, c.bout, sizeof(real) * c.nq), memcpy(m_lse, c.blse, sizeof(real) * c.nl);
  real *mo_d = dev_copy(m_out, c.nq), *ml_d = dev_copy(m_lse, c.nl), *pb_d = dev_copy(out, c.nq);
  real *lb_d = dev_copy(lse, c.nl);
  kernel_ops_cpu.attention_cp_merge(NULL, m_out + oq, m_lse + qoff, out + oq, lse + qoff, B, Tq, blk->q_rows, NH, HS);
  kernel_ops_cuda.attention_cp_merge(fixture_ctx, mo_d + oq, ml_d + qoff, pb_d + oq, lb_d + qoff, B, Tq, blk->q_rows,
                                     NH, HS);
  for (size_t e = 0; e < c.nq; e++) bnd[e] = 2.0 * u * (fabs((double)c.bout[e]) + fabs((double)out[e]));
  download(got, mo_d, c.nq);
  CHECK(within(got, m_out, bnd, c.nq, "attention_cp_merge out"));
  for (size_t r = 0; r < c.nl; r++) bnd[r] = 2.0 * u * (fabs((double)m_lse[r]) + 1.0);
  download(got, ml_d, c.nl);
  CHECK(within(got, m_lse, bnd, c.nl, "attention_cp_merge lse"));

  /* row dots of the final out: double on both sides, 2u of Σ |dout · out| */
  real *D = host_alloc(c.nl);
  real *fo_d = dev_copy(c.bout, c.nq), *D_d = dev_zeros(sizeof(real) * c.nl);
  kernel_ops_cpu.attention_cp_row_dots(NULL, D + qoff, c.bdout + oq, c.bout + oq, B, Tq, blk->q_rows, NH, HS);
  kernel_ops_cuda.attention_cp_row_dots(fixture_ctx, D_d + qoff, dout_d + oq, fo_d + oq, B, Tq, blk->q_rows, NH, HS);
  for (size_t r = 0; r < c.nl; r++) {
    const size_t b = r / ((size_t)NH * blk->q_rows), h = (r / blk->q_rows) % NH, t = r % blk->q_rows;
    double m = 0;
    for (int d = 0; d < HS; d++) {
      const size_t at = (b * blk->q_rows + t) * C + h * HS + (size_t)d;
      m += fabs((double)c.bdout[at] * c.bout[at]);
    }
    bnd[r] = 2.0 * u * m;
  }
  download(got, D_d, c.nl);
  CHECK(within(got, D, bnd, c.nl, "attention_cp_row_dots"));

  /* backward from the final lse and the CPU's D on both sides, onto the same nonzero starts:
   * (e_p + 2 (HS + Tk · group + 8) u) · the magnitude (test_cuda_attention.c's, over Tk keys),
   * plus 2u (|start| + magnitude) for the accumulation */
  real *dq = host_alloc(c.nq), *dk = host_alloc(c.nk), *dv = host_alloc(c.nk);
  fill_uniform(dq, c.nq, seed + 7, 0.5), fill_uniform(dk, c.nk, seed + 8, 0.5), fill_uniform(dv, c.nk, seed + 9, 0.5);
  real *dq_d = dev_copy(dq, c.nq), *dk_d = dev_copy(dk, c.nk), *dv_d = dev_copy(dv, c.nk);
  real *fl_d = dev_copy(c.blse, c.nl), *Dc_d = dev_copy(D, c.nl);
  real *dq0 = host_alloc(c.nq), *dk0 = host_alloc(c.nk), *dv0 = host_alloc(c.nk);
  memcpy(dq0, dq, sizeof(real) * c.nq), memcpy(dk0, dk, sizeof(real) * c.nk), memcpy(dv0, dv, sizeof(real) * c.nk);
  kernel_ops_cpu.attention_cp_backward(NULL, dq + oq, dk + ok, dv + ok, scratch, c.bdout + oq, c.bq + oq, c.bk + ok,
                                       c.bv + ok, c.blse + qoff, D + qoff, drop, blk, B, NH, NKV, HS);
  kernel_ops_cuda.attention_cp_backward(fixture_ctx, dq_d + oq, dk_d + ok, dv_d + ok, s_d, dout_d + oq, q_d + oq,
                                        k_d + ok, v_d + ok, fl_d + qoff, Dc_d + qoff, drop, blk, B, NH, NKV, HS);
  block_mags(&g, &c, c.blse);
  const double fac = g.e_p + 2.0 * (HS + (double)Tk * c.group + 8) * u;
  for (size_t e = 0; e < c.nq; e++) bnd[e] = (fac + 2.0 * u) * g.mq[e] + 2.0 * u * fabs((double)dq0[e]);
  download(got, dq_d, c.nq);
  snprintf(what, sizeof what, "attention_cp_backward dq (T %d, rows %d+%d, keys %d+%d)", T, q0, Tq, k0, Tk);
  CHECK(within(got, dq, bnd, c.nq, what));
  for (size_t e = 0; e < c.nk; e++) bnd[e] = (fac + 2.0 * u) * g.mk[e] + 2.0 * u * fabs((double)dk0[e]);
  download(got, dk_d, c.nk);
  CHECK(within(got, dk, bnd, c.nk, "attention_cp_backward dk"));
  for (size_t e = 0; e < c.nk; e++) bnd[e] = (fac + 2.0 * u) * g.mv[e] + 2.0 * u * fabs((double)dv0[e]);
  download(got, dv_d, c.nk);
  CHECK(within(got, dv, bnd, c.nk, "attention_cp_backward dv"));
  mags_free(&g);
  CHECK_CUDA_OK();

  real *devs[] = { q_d, k_d, v_d, dout_d, s_d, out_d, lse_d, mo_d, ml_d, pb_d, lb_d, fo_d, D_d, dq_d, dk_d, dv_d,
                   fl_d, Dc_d };
  for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) dev_free(devs[i]);
  free(got), free(bnd), free(scratch), free(out), free(lse), free(m_out), free(m_lse), free(D);
  free(dq), free(dk), free(dv), free(dq0), free(dk0), free(dv0);
  cpc_free(&c);
}

static void block_straddling_the_diagonal_matches_the_cpu(void)
{
  /* rows 64..133 against keys 40..129, at offsets 3 and 5 inside their buffers; grouped heads */
  block_case(2, 200, 4, 2, 32, 0.0f, 11, 64, 70, 40, 90, 3, 5);
}

static void block_below_the_diagonal_with_dropout_matches_the_cpu(void)
{
  /* rows 150..199 against keys 0..99: every key before every row */
  block_case(2, 200, 2, 2, 64, 0.1f, 12, 150, 50, 0, 100, 0, 0);
}

static void block_with_empty_rows_grouped_heads_and_dropout_matches_the_cpu(void)
{
  /* rows 10..69 against keys 40..89: rows 10..39 see none of the block's keys */
  block_case(1, 120, 8, 2, 16, 0.2f, 13, 10, 60, 40, 50, 1, 2);
}

static void block_at_head_size_128_matches_the_cpu(void)
{
  /* a diagonal block (rows and keys 67..196) of a sequence's second half */
  block_case(1, 260, 2, 1, 128, 0.1f, 14, 67, 130, 67, 130, 0, 0);
}

int main(void)
{
  cuda_test_open();
  const struct test_case tests[] = {
    TEST(block_straddling_the_diagonal_matches_the_cpu),
    TEST(block_below_the_diagonal_with_dropout_matches_the_cpu),
    TEST(block_with_empty_rows_grouped_heads_and_dropout_matches_the_cpu),
    TEST(block_at_head_size_128_matches_the_cpu),
  };
  const int status = test_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
  cuda_ctx_destroy(fixture_ctx);
  return status;
}
