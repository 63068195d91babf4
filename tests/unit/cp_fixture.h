/* Context parallelism's test data, shared by test_attention_cp.c (the ring simulated in one
 * process) and tests/mpi/mpi_cp_ring.c (the ring over ranks): a whole sequence's q, k, v and
 * dout with the whole-sequence kernels' outputs on them (the reference: attention_forward and
 * attention_backward), a cp rank's rows (its chunk pair, kernels.h: attention_cp_chunk) gathered
 * from a whole tensor, and the normwise error the tests bound.
 *
 * The bound, for each output X over a rank's rows: max |X − X_ref| ≤ CP_TOL · max |X_ref|.
 * Both sides are the same kernel's loops, products and dropout draws; they differ in the order
 * of the sums over keys only: the reference's online softmax runs over all of a row's keys in
 * chunks of 512, the ring's over each block, then merges at most 2·cp partials per row (each
 * merge: two exps of an lse difference, a division and a product in double, rounded once to
 * `real`: ≤ 2 units of `real` relative, plus the lse's own absolute error ≈ |lse| · u, which is
 * the relative error of its weight: |lse| ≤ 16 + log T ≈ 25 here, inputs in [−1, 1) and HS ≤ 32)
 * and backward adds dq over cp blocks and dk, dv over the ranks in ring order. Each side's error
 * against the exact result is what test_attention_blocks bounds at 64 units (HS · 16 + 2T + 30
 * worst case, a random walk in fact); the merges add ≤ 2·cp · (2 + 25) units. So fp32: (2 · 64 +
 * 8 · 27) · 2^-24 ≈ 2.1e-5 at cp 4, taken as 2^-15 = 3.1e-5 — the errors seen are ~20x lower
 * (printed), while a fault (a block skipped or met twice, a key of the wrong chunk, a merge
 * weighting the wrong partial, a dropout draw at a local instead of a global index) moves an
 * output by a whole term, 1e-3 or more. Float64: 1e-10, which the same argument puts ~1e5 above
 * the rounding. */
#ifndef TYCHO_TEST_CP_FIXTURE_H
#define TYCHO_TEST_CP_FIXTURE_H
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define CP_TOL TOL(0x1p-15, 1e-10)

struct cp_case {
  int B, T, NH, NKV, HS;
  uint32_t samples[4];
  struct attention_dropout d; /* p 0: none */
  real *q, *k, *v, *dout;     /* the whole sequence's */
  real *out, *lse, *dq, *dk, *dv; /* the reference */
};

static inline real cp_rnd(uint32_t *state) /* xorshift32, uniform in [-1, 1) */
{
  *state ^= *state << 13;
  *state ^= *state >> 17;
  *state ^= *state << 5;
  return (real)(*state >> 8) / 8388608.0f - 1.0f;
}

static inline real *cp_rand(size_t n, uint32_t *state)
{
  real *x = malloc(n * sizeof(real));
  for (size_t i = 0; i < n; i++) x[i] = cp_rnd(state);
  return x;
}

static inline void cp_case_make(struct cp_case *c, int B, int T, int NH, int NKV, int HS, float p, uint32_t seed)
{
  memset(c, 0, sizeof *c);
  c->B = B, c->T = T, c->NH = NH, c->NKV = NKV, c->HS = HS;
  for (int b = 0; b < 4; b++) c->samples[b] = 31u + 7u * (uint32_t)b;
  const struct attention_dropout d = { p, 0x5eedull + seed, 4, (3u << 8) | 1u, 12345, c->samples };
  c->d = d;
  uint32_t st = seed;
  const size_t nq = (size_t)B * T * NH * HS, nkv = (size_t)B * T * NKV * HS;
  c->q = cp_rand(nq, &st), c->k = cp_rand(nkv, &st), c->v = cp_rand(nkv, &st), c->dout = cp_rand(nq, &st);
  c->out = malloc(nq * sizeof(real)), c->lse = malloc((size_t)B * NH * T * sizeof(real));
  c->dq = malloc(nq * sizeof(real)), c->dk = malloc(nkv * sizeof(real)), c->dv = malloc(nkv * sizeof(real));
  real *scratch = malloc(attention_scratch_n_elems(B, T, NH, NKV, HS) * sizeof(real));
  const struct attention_dropout *drop = p > 0 ? &c->d : NULL;
  attention_forward(c->out, c->lse, scratch, c->q, c->k, c->v, drop, B, T, NH, NKV, HS);
  attention_backward(c->dq, c->dk, c->dv, scratch, c->dout, c->q, c->k, c->v, c->out, c->lse, drop, B, T, NH,
                     NKV, HS);
  free(scratch);
}

static inline void cp_case_free(struct cp_case *c)
{
  free(c->q), free(c->k), free(c->v), free(c->dout);
  free(c->out), free(c->lse), free(c->dq), free(c->dk), free(c->dv);
}

/* dst (B, Tl, X) ← rank r's chunk pair's rows of src (B, T, X). */
static inline void cp_gather_rows(real *dst, const real *src, int B, int T, int X, int cp, int r)
{
  const int Tl = attention_cp_rank_tokens(T, cp, r);
  for (int b = 0; b < B; b++) {
    int row = 0;
    for (int i = 0; i < 2; i++) {
      int s, n;
      attention_cp_chunk(T, cp, i == 0 ? r : 2 * cp - 1 - r, &s, &n);
      memcpy(dst + ((size_t)b * Tl + row) * X, src + ((size_t)b * T + s) * X, (size_t)n * X * sizeof(real));
      row += n;
    }
  }
}

/* dst (B, NH, Tl) ← rank r's rows of src (B, NH, T) (an lse). */
static inline void cp_gather_lse(real *dst, const real *src, int B, int T, int NH, int cp, int r)
{
  cp_gather_rows(dst, src, B * NH, T, 1, cp, r);
}

/* max |got − want| / max |want| over n elements (0 when both are 0). */
static inline double cp_err(const real *got, const real *want, size_t n)
{
  double e = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = fabs((double)got[i] - (double)want[i]);
    e = d > e || d != d ? d : e;
    m = fabs((double)want[i]) > m ? fabs((double)want[i]) : m;
  }
  return m > 0 ? e / m : e;
}
#endif
