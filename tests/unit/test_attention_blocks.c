/* The flash-style causal attention (kernels/cpu/attention.c: query rows in blocks, keys in
 * chunks with an online softmax, keys above a block's diagonal skipped, backward recomputing the
 * scores and the dropout) against a plain reference written here: the full T × T square per
 * (batch, head), every sum in double, the dropout as dropout_mask draws it for each sample's
 * (NH, T, T) block (so the kernels' kept pattern is dropout_mask's). Sequence lengths around the
 * block sizes (64 the kernel's query block, 512 its key chunk: 1, 7, 31, 32, 33, 63, 64, 65, 130
 * and 511, 513, 1100 — one row, a partial block, one and two blocks and a row either side, three
 * blocks with a two-row tail, one chunk less a row, two and three chunks), multi-head, grouped
 * and multi-query heads, with and without dropout, with 1 and 4 threads (4: parallel tasks for
 * the larger cases, threaded sgemm in turn for the smaller). Every output buffer, and the
 * scratch, starts as NaN: each element must be assigned.
 *
 * Bound, for each output X (lse, out, dq, dk, dv) over a whole case: max |X − X_ref| ≤
 * TOL_UNITS · REAL_U · max |X_ref| (normwise, so an element near 0 by cancellation does not
 * count as a relative error). The kernel rounds in `real` along chains of: a score (an HS-term
 * dot product, |score| ≤ HS · 4 / sqrt(HS) = 16 at HS 16 with inputs in [−2, 2), whose absolute
 * error γ_HS · 16 becomes the relative error of exp), the online softmax (exp, Σ in double, a
 * rescaling per chunk, 1/Σ, a product), lse (its absolute error, ≈ |lse| u, is the relative
 * error of backward's P = exp(s − lse)), up to T terms against v or dout (γ_T relative to the sum
 * of magnitudes), and backward's D = dout · out and difference before dq, dk (≤ T terms again).
 * Worst-case this is ≈ (HS · 16 + 2T + 30) u relative to the largest element; the rounding
 * errors add as a random walk, so seen errors are far lower (printed at the end). The bound, 64
 * units (the reference's share, DOUBLE_U, added), is far above what is seen and far below what
 * a real fault gives: a masked element used, a key above the diagonal leaking in, a block's or
 * chunk's row or key range off by one, a missed rescaling or a KV head read by the wrong query
 * head moves an output by the size of a term: 1e-3 or more relative here, ≥ 2^14 units in fp32. */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "cpu/gemm_bf16.h"
#include "cpu/vec.h"
#include "kernels.h"
#include "philox.h"

#define TOL_UNITS 64

static real rnd(uint32_t *state) /* xorshift32, uniform in [-1, 1) */
{
  *state ^= *state << 13;
  *state ^= *state >> 17;
  *state ^= *state << 5;
  return (real)(*state >> 8) / 8388608.0f - 1.0f;
}

static real *rand_buf(size_t n, real scale, uint32_t *state)
{
  real *x = malloc(n * sizeof(real));
  for (size_t i = 0; i < n; i++) x[i] = scale * rnd(state);
  return x;
}

static real *nan_buf(size_t n)
{
  real *x = malloc((n ? n : 1) * sizeof(real));
  for (size_t i = 0; i < n; i++) x[i] = (real)NAN;
  return x;
}

struct ref {
  double *lse, *out, *dq, *dk, *dv;
  /* Σ |terms| of the products that round P, P ⊙ M or dS to bf16 in the bf16 entries: out_t =
   * Σ_j (P M)_tj v_j, dv_j = Σ_t (P M)_tj dout_t, dq_t = scale Σ_j dS_tj k_j, dk_j = scale Σ_t
   * dS_tj q_t */
  double *mout, *mdq, *mdk, *mdv;
};

/* The dropout of a case: dropout_mask's numbers for each sample's (NH, T, T) block, and the
 * kernels' settings that draw the same. */
struct drop_case {
  real *mask; /* (B, NH, T, T) or NULL */
  uint32_t samples[4];
  struct attention_dropout d;
};

static void drop_case_make(struct drop_case *c, int use_mask, int B, int T, int NH, float p,
                           uint64_t seed, uint32_t c1, uint32_t c3, uint64_t first)
{
  c->mask = NULL;
  for (int b = 0; b < 4; b++) c->samples[b] = 17u + 5u * (uint32_t)b;
  const struct attention_dropout d = { p, seed, c1, c3, first, c->samples };
  c->d = d;
  if (!use_mask)
    return;
  const size_t per = (size_t)NH * T * T;
  c->mask = malloc((size_t)B * per * sizeof(real));
  for (int b = 0; b < B; b++) dropout_mask(c->mask + b * per, per, p, seed, c1, c->samples[b], c3, first);
}

/* The whole attention, forward and backward, on full squares in double. */
static struct ref reference(const real *q, const real *k, const real *v, const real *dout,
                            const real *mask, int B, int T, int NH, int NKV, int HS)
{
  const size_t nq = (size_t)B * T * NH * HS, nkv = (size_t)B * T * NKV * HS, TT = (size_t)T * T;
  struct ref r = { calloc((size_t)B * NH * T, sizeof(double)), calloc(nq, sizeof(double)),
                   calloc(nq, sizeof(double)), calloc(nkv, sizeof(double)),
                   calloc(nkv, sizeof(double)), calloc(nq, sizeof(double)), calloc(nq, sizeof(double)),
                   calloc(nkv, sizeof(double)), calloc(nkv, sizeof(double)) };
  double *s = malloc(TT * sizeof(double)), *dS = malloc(TT * sizeof(double));
  double *P = malloc(TT * sizeof(double));
  const double scale = 1.0 / sqrt((double)HS);
#define Q(b, t, h, i) q[(((size_t)(b) * T + (t)) * NH + (h)) * HS + (i)]
#define K(b, t, h, i) k[(((size_t)(b) * T + (t)) * NKV + (h)) * HS + (i)]
#define V(b, t, h, i) v[(((size_t)(b) * T + (t)) * NKV + (h)) * HS + (i)]
#define DO(b, t, h, i) dout[(((size_t)(b) * T + (t)) * NH + (h)) * HS + (i)]
  for (int b = 0; b < B; b++)
    for (int h = 0; h < NH; h++) {
      const int kvh = h / (NH / NKV);
      const size_t bh = ((size_t)b * NH + h) * TT;
      const real *M = mask ? mask + bh : NULL;
      for (int t = 0; t < T; t++) { /* P over the full square: −inf above the diagonal */
        double max = -INFINITY, sum = 0.0;
        for (int j = 0; j < T; j++) {
          double d = 0.0;
          for (int i = 0; i < HS; i++) d += (double)Q(b, t, h, i) * K(b, j, kvh, i);
          s[(size_t)t * T + j] = j <= t ? d * scale : -INFINITY;
          max = fmax(max, s[(size_t)t * T + j]);
        }
        for (int j = 0; j < T; j++) sum += P[(size_t)t * T + j] = exp(s[(size_t)t * T + j] - max);
        for (int j = 0; j < T; j++) P[(size_t)t * T + j] /= sum;
        r.lse[((size_t)b * NH + h) * T + t] = max + log(sum);
      }
      for (int t = 0; t < T; t++)
        for (int i = 0; i < HS; i++) {
          double o = 0.0, mag = 0.0;
          for (int j = 0; j < T; j++) {
            const double term = P[(size_t)t * T + j] * (M ? M[(size_t)t * T + j] : 1.0) * V(b, j, kvh, i);
            o += term, mag += fabs(term);
          }
          r.out[(((size_t)b * T + t) * NH + h) * HS + i] = o;
          r.mout[(((size_t)b * T + t) * NH + h) * HS + i] = mag;
        }
      for (int t = 0; t < T; t++) { /* dA = dout·vᵀ, dP = dA ⊙ M, dS = P ⊙ (dP − Σ P dP) */
        double dot = 0.0;
        for (int j = 0; j < T; j++) {
          double dA = 0.0;
          for (int i = 0; i < HS; i++) dA += (double)DO(b, t, h, i) * V(b, j, kvh, i);
          dS[(size_t)t * T + j] = dA * (M ? M[(size_t)t * T + j] : 1.0);
          dot += P[(size_t)t * T + j] * dS[(size_t)t * T + j];
        }
        for (int j = 0; j < T; j++)
          dS[(size_t)t * T + j] = P[(size_t)t * T + j] * (dS[(size_t)t * T + j] - dot);
      }
      for (int t = 0; t < T; t++)
        for (int j = 0; j <= t; j++) {
          const double a = P[(size_t)t * T + j] * (M ? M[(size_t)t * T + j] : 1.0);
          const double g = scale * dS[(size_t)t * T + j];
          for (int i = 0; i < HS; i++) {
            r.dq[(((size_t)b * T + t) * NH + h) * HS + i] += g * K(b, j, kvh, i);
            r.dk[(((size_t)b * T + j) * NKV + kvh) * HS + i] += g * Q(b, t, h, i);
            r.dv[(((size_t)b * T + j) * NKV + kvh) * HS + i] += a * DO(b, t, h, i);
            r.mdq[(((size_t)b * T + t) * NH + h) * HS + i] += fabs(g * K(b, j, kvh, i));
            r.mdk[(((size_t)b * T + j) * NKV + kvh) * HS + i] += fabs(g * Q(b, t, h, i));
            r.mdv[(((size_t)b * T + j) * NKV + kvh) * HS + i] += fabs(a * DO(b, t, h, i));
          }
        }
    }
#undef Q
#undef K
#undef V
#undef DO
  free(s);
  free(dS);
  free(P);
  return r;
}

/* max |x − ref| / max |ref| in units of REAL_U; NaN anywhere gives infinity. */
static double normwise_units(const real *x, const double *ref, size_t n)
{
  double err = 0.0, size = 0.0;
  for (size_t i = 0; i < n; i++) {
    if (!isfinite(x[i])) return INFINITY;
    err = fmax(err, fabs(x[i] - ref[i]));
    size = fmax(size, fabs(ref[i]));
  }
  return size > 0.0 ? err / size / REAL_U : err / REAL_U;
}

static double seen_units[5]; /* the worst error of each output over the cases run, printed */

static void check_case(int B, int T, int NH, int NKV, int HS, int use_mask, int n_threads)
{
  const size_t nq = (size_t)B * T * NH * HS, nkv = (size_t)B * T * NKV * HS;
  const size_t nlse = (size_t)B * NH * T;
  uint32_t s = 1000u + (uint32_t)(T * 31 + NH * 7 + NKV * 3 + use_mask);
  real *q = rand_buf(nq, 2, &s), *k = rand_buf(nkv, 2, &s), *v = rand_buf(nkv, 1, &s);
  real *dout = rand_buf(nq, 1, &s);
  struct drop_case dc;
  drop_case_make(&dc, use_mask, B, T, NH, 0.25f, 99, (uint32_t)T, 2, 0);
  const struct attention_dropout *drop = use_mask ? &dc.d : NULL;
  real *out = nan_buf(nq), *lse = nan_buf(nlse), *dq = nan_buf(nq), *dk = nan_buf(nkv);
  real *dv = nan_buf(nkv), *scratch = nan_buf(attention_scratch_n_elems(B, T, NH, NKV, HS));
  kernels_init_cpu(n_threads);
  attention_forward(out, lse, scratch, q, k, v, drop, B, T, NH, NKV, HS);
  attention_backward(dq, dk, dv, scratch, dout, q, k, v, out, lse, drop, B, T, NH, NKV, HS);
  kernels_init_cpu(1);
  struct ref r = reference(q, k, v, dout, dc.mask, B, T, NH, NKV, HS);

  const real *got[5] = { lse, out, dq, dk, dv };
  const double *want[5] = { r.lse, r.out, r.dq, r.dk, r.dv };
  const size_t sizes[5] = { nlse, nq, nq, nkv, nkv };
  static const char *names[5] = { "lse", "out", "dq", "dk", "dv" };
  const double tol = TOL_UNITS * (1.0 + DOUBLE_U / REAL_U);
  for (int i = 0; i < 5; i++) {
    double units = normwise_units(got[i], want[i], sizes[i]);
    seen_units[i] = fmax(seen_units[i], units);
    CHECK_MSG(units <= tol, "T %d NH %d NKV %d HS %d mask %d threads %d: %s off by %.3g units "
              "of max |ref|, bound %d", T, NH, NKV, HS, use_mask, n_threads, names[i], units,
              TOL_UNITS);
  }
  free(q); free(k); free(v); free(dout); free(dc.mask); free(out); free(lse); free(dq);
  free(dk); free(dv); free(scratch);
  free(r.lse); free(r.out); free(r.dq); free(r.dk); free(r.dv);
  free(r.mout); free(r.mdq); free(r.mdk); free(r.mdv);
}

#if !REAL_IS_DOUBLE
/* The bf16 mode's entries (attention_*_bf16): the same walk with each product's operands rounded
 * to bf16. Here q, k, v and dout are bf16 numbers already (rounded before the call), and
 * backward is given the reference's out and lse, so what the entries round beyond fp32 is the
 * probabilities (P ⊙ M, before P·v and Pᵀ·dout) and dS (before dS·k and dSᵀ·q), each to within
 * 2^-8 of itself (nearest with 8 significant bits: unit roundoff 2^-8). An output that sums such
 * products is then off by at most 2^-8 · Σ |terms| (the reference's m* sums) beyond fp32
 * rounding; 2^-6 more of it covers the fp32 error of the P and dS that get rounded and the fp32
 * sum of up to 1,024 terms (γ_1024 = 2^-14 = 2^-6 · 2^-8). So each element is held to
 * 2^-8 (1 + 2^-6) Σ|terms| + TOL_UNITS fp32 units of the output's largest; lse, which no
 * rounded probability reaches, to the fp32 bound alone. The worst seen is printed: a single
 * dominant term rounded by nearly 2^-8 comes close to the bound, as it may. A fault (a task's pack
 * buffer shared with another's, a product on the wrong rows) moves outputs by whole terms.
 * The bits do not depend on the thread count, and they differ from the fp32 entries' (the
 * rounding happened). */
static double seen_bf16[5]; /* the worst error of each output as a fraction of its bound */

static void check_case_bf16(int B, int T, int NH, int NKV, int HS, int use_mask)
{
  const size_t nq = (size_t)B * T * NH * HS, nkv = (size_t)B * T * NKV * HS, nlse = (size_t)B * NH * T;
  uint32_t s = 2000u + (uint32_t)(T * 31 + NH * 7 + NKV * 3 + use_mask);
  real *q = rand_buf(nq, 2, &s), *k = rand_buf(nkv, 2, &s), *v = rand_buf(nkv, 1, &s);
  real *dout = rand_buf(nq, 1, &s);
  real *bufs[4] = { q, k, v, dout };
  const size_t lens[4] = { nq, nkv, nkv, nq };
  for (int b = 0; b < 4; b++)
    for (size_t i = 0; i < lens[b]; i++) bufs[b][i] = bf16_to_float(bf16_from_float(bufs[b][i]));
  struct drop_case dc;
  drop_case_make(&dc, use_mask, B, T, NH, 0.25f, 99, (uint32_t)T, 2, 0);
  const struct attention_dropout *drop = use_mask ? &dc.d : NULL;
  struct ref r = reference(q, k, v, dout, dc.mask, B, T, NH, NKV, HS);
  real *out_ref = malloc(nq * sizeof(real)), *lse_ref = malloc(nlse * sizeof(real));
  for (size_t i = 0; i < nq; i++) out_ref[i] = (real)r.out[i];
  for (size_t i = 0; i < nlse; i++) lse_ref[i] = (real)r.lse[i];
  real *got[5], *first[5];
  const size_t sizes[5] = { nlse, nq, nq, nkv, nkv };
  for (int th = 1; th <= 4; th += 3) {
    for (int i = 0; i < 5; i++) got[i] = nan_buf(sizes[i]);
    real *scratch = nan_buf(attention_scratch_n_elems_bf16(B, T, NH, NKV, HS));
    kernels_init_cpu(th);
    attention_forward_bf16(got[1], got[0], scratch, q, k, v, drop, B, T, NH, NKV, HS);
    attention_backward_bf16(got[2], got[3], got[4], scratch, dout, q, k, v, out_ref, lse_ref, drop, B, T, NH,
                            NKV, HS);
    kernels_init_cpu(1);
    free(scratch);
    if (th == 1) {
      for (int i = 0; i < 5; i++) first[i] = got[i];
      continue;
    }
    for (int i = 0; i < 5; i++) {
      CHECK_MSG(memcmp(got[i], first[i], sizes[i] * sizeof(real)) == 0, "bf16 T %d NH %d NKV %d HS %d mask %d: "
                "output %d differs at 4 threads", T, NH, NKV, HS, use_mask, i);
      free(got[i]);
    }
  }
  /* the fp32 entries' out differs (beyond one key, P is not 1 and its rounding shows) */
  if (T >= 7) {
    real *out32 = nan_buf(nq), *lse32 = nan_buf(nlse), *scr = nan_buf(attention_scratch_n_elems(B, T, NH, NKV, HS));
    attention_forward(out32, lse32, scr, q, k, v, drop, B, T, NH, NKV, HS);
    CHECK_MSG(memcmp(out32, first[1], nq * sizeof(real)) != 0, "bf16 T %d: the bf16 entries gave the fp32 bits", T);
    free(out32), free(lse32), free(scr);
  }
  const double *want[5] = { r.lse, r.out, r.dq, r.dk, r.dv }, *mag[5] = { NULL, r.mout, r.mdq, r.mdk, r.mdv };
  static const char *names[5] = { "lse", "out", "dq", "dk", "dv" };
  const double tol = TOL_UNITS * (1.0 + DOUBLE_U / REAL_U);
  for (int o = 0; o < 5; o++) {
    double size = 0.0;
    for (size_t i = 0; i < sizes[o]; i++) size = fmax(size, fabs(want[o][i]));
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < sizes[o]; i++) {
      /* an output that cancels to 0 everywhere (dq, dk at T 1) is held in absolute units, as
       * normwise_units holds it */
      const double bound = (mag[o] ? 0x1p-8 * (1 + 0x1p-6) * mag[o][i] : 0.0) + tol * REAL_U * (size > 0 ? size : 1);
      const double err = fabs(first[o][i] - want[o][i]);
      const double frac = !isfinite(first[o][i]) ? INFINITY : err == 0.0 ? 0.0 : err / bound;
      if (!(frac <= worst)) worst = frac, at = i;
    }
    seen_bf16[o] = fmax(seen_bf16[o], worst);
    CHECK_MSG(worst <= 1.0, "bf16 T %d NH %d NKV %d HS %d mask %d: %s[%zu] %.9g, reference %.9g: %.3g of its "
              "bound", T, NH, NKV, HS, use_mask, names[o], at, (double)first[o][at], want[o][at], worst);
  }
  for (int i = 0; i < 5; i++) free(first[i]);
  free(q), free(k), free(v), free(dout), free(dc.mask), free(out_ref), free(lse_ref);
  free(r.lse), free(r.out), free(r.dq), free(r.dk), free(r.dv), free(r.mout), free(r.mdq), free(r.mdk), free(r.mdv);
}
#endif

static void bf16_entries_round_only_the_products(void)
{
#if REAL_IS_DOUBLE
  printf("the float64 build has no bf16 entries\n");
  CHECK(kernel_ops_cpu.attention_forward_bf16 == NULL);
#else
  static const int Ts[] = { 1, 7, 33, 64, 65, 130 };
  for (size_t i = 0; i < sizeof Ts / sizeof *Ts; i++)
    for (int use_mask = 0; use_mask < 2; use_mask++) check_case_bf16(2, Ts[i], 4, 2, 16, use_mask);
  check_case_bf16(1, 513, 2, 1, 32, 1); /* two key chunks */
  check_case_bf16(1, 65, 1, 1, 12, 0);  /* one task: the products' rows shared by the threads */
  check_case_bf16(1, 40, 2, 2, 128, 0); /* wide heads */
  printf("bf16 entries (products on %s): worst error as a fraction of the bound: lse %.3g, out %.3g, "
         "dq %.3g, dk %.3g, dv %.3g\n", gemm_bf16_path(), seen_bf16[0], seen_bf16[1], seen_bf16[2],
         seen_bf16[3], seen_bf16[4]);
#endif
}

static const int lengths[] = { 1, 7, 31, 32, 33, 63, 64, 65, 130 };
enum { N_LENGTHS = sizeof lengths / sizeof lengths[0] };

static void run_heads(int NH, int NKV)
{
  for (int i = 0; i < N_LENGTHS; i++)
    for (int use_mask = 0; use_mask < 2; use_mask++)
      for (int threads = 1; threads <= 4; threads += 3)
        check_case(2, lengths[i], NH, NKV, 16, use_mask, threads);
}

static void multi_head_matches_full_square_reference(void)
{
  run_heads(4, 4);
}

static void grouped_heads_match_full_square_reference(void)
{
  run_heads(6, 2); /* 3 query heads per KV head */
}

static void multi_query_matches_full_square_reference(void)
{
  run_heads(4, 1);
}

/* Sequences of more than one key chunk: the online softmax's rescaling across chunks. */
static void several_key_chunks_match_full_square_reference(void)
{
  static const int longer[] = { 511, 513, 1100 };
  for (int i = 0; i < 3; i++)
    for (int use_mask = 0; use_mask < 2; use_mask++)
      check_case(1, longer[i], 4, 2, 16, use_mask, i == 1 ? 4 : 1);
}

static void one_head_odd_head_size_matches_full_square_reference(void)
{
  /* B 1, one head: a single task, so 4 threads run it on threaded sgemm; HS 12 (not a power
   * of 2) and HS 1. */
  for (int i = 0; i < N_LENGTHS; i++)
    for (int use_mask = 0; use_mask < 2; use_mask++) {
      check_case(1, lengths[i], 1, 1, 12, use_mask, 4);
      check_case(1, lengths[i], 1, 1, 1, use_mask, 1);
    }
  printf("worst errors seen, units of REAL_U (bound %d): lse %.3g, out %.3g, dq %.3g, dk %.3g, "
         "dv %.3g\n", TOL_UNITS, seen_units[0], seen_units[1], seen_units[2], seen_units[3],
         seen_units[4]);
}

/* The fused q|k|v layout (rows of [q | k | v], kernels/ops.h attention_*_qkv, rope_*_qkv) gives
 * the separate buffers' results bit for bit, in the fp32 and the bf16 entries: the same products on the same numbers, read through
 * another row stride. */
static void fused_qkv_layout_gives_the_separate_bits(void)
{
  static const int cases[][5] = { { 2, 33, 4, 2, 8 }, { 1, 130, 4, 4, 16 }, { 3, 7, 6, 1, 4 } };
  uint32_t st = 99;
  for (int lowp = 0; lowp < (REAL_IS_DOUBLE ? 1 : 2); lowp++) /* and the bf16 entries */
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
    for (int use_mask = 0; use_mask < 2; use_mask++) {
      const int B = cases[ci][0], T = cases[ci][1], NH = cases[ci][2], NKV = cases[ci][3], HS = cases[ci][4];
      const size_t N = (size_t)B * T, Dq = (size_t)NH * HS, Dkv = (size_t)NKV * HS, D = Dq + 2 * Dkv;
      const size_t TT = (size_t)B * NH * T; /* lse */
      real *q = rand_buf(N * Dq, 1, &st), *k = rand_buf(N * Dkv, 1, &st), *v = rand_buf(N * Dkv, 1, &st);
      real *dout = rand_buf(N * Dq, 1, &st), *qkv = malloc(N * D * sizeof(real));
      real *cosT = malloc((size_t)T * HS / 2 * sizeof(real)), *sinT = malloc((size_t)T * HS / 2 * sizeof(real));
      rope_table(cosT, sinT, T, HS, 10000.0, 0);
      for (size_t t = 0; t < N; t++) {
        memcpy(qkv + t * D, q + t * Dq, Dq * sizeof(real));
        memcpy(qkv + t * D + Dq, k + t * Dkv, Dkv * sizeof(real));
        memcpy(qkv + t * D + Dq + Dkv, v + t * Dkv, Dkv * sizeof(real));
      }
      struct drop_case dc;
      drop_case_make(&dc, 0, B, T, NH, 0.2f, 7, 1, 3, 0);
      const struct attention_dropout *mask = use_mask ? &dc.d : NULL;
#if REAL_IS_DOUBLE
      const size_t ns = attention_scratch_n_elems(B, T, NH, NKV, HS);
#else
      const size_t ns = (lowp ? attention_scratch_n_elems_bf16 : attention_scratch_n_elems)(B, T, NH, NKV, HS);
#endif
      real *scratch = malloc(ns * sizeof(real)), *out1 = malloc(N * Dq * sizeof(real));
      real *out2 = malloc(N * Dq * sizeof(real)), *p1 = malloc(TT * sizeof(real)), *p2 = malloc(TT * sizeof(real));
      real *dq = malloc(N * Dq * sizeof(real)), *dk = malloc(N * Dkv * sizeof(real));
      real *dv = malloc(N * Dkv * sizeof(real)), *dqkv = malloc(N * D * sizeof(real));
      rope_forward(q, q, cosT, sinT, B, T, NH, HS);
      rope_forward(k, k, cosT, sinT, B, T, NKV, HS);
      rope_forward_qkv(qkv, cosT, sinT, B, T, NH, NKV, HS);
      (lowp ? attention_forward_bf16 : attention_forward)(out1, p1, scratch, q, k, v, mask, B, T, NH, NKV, HS);
      (lowp ? attention_forward_qkv_bf16 : attention_forward_qkv)(out2, p2, scratch, qkv, mask, B, T, NH, NKV, HS);
      CHECK(memcmp(out1, out2, N * Dq * sizeof(real)) == 0 && memcmp(p1, p2, TT * sizeof(real)) == 0);
      (lowp ? attention_backward_bf16 : attention_backward)(dq, dk, dv, scratch, dout, q, k, v, out1, p1, mask, B,
                                                            T, NH, NKV, HS);
      rope_backward(dq, dq, cosT, sinT, B, T, NH, HS);
      rope_backward(dk, dk, cosT, sinT, B, T, NKV, HS);
      (lowp ? attention_backward_qkv_bf16 : attention_backward_qkv)(dqkv, scratch, dout, qkv, out2, p2, mask, B, T,
                                                                    NH, NKV, HS);
      rope_backward_qkv(dqkv, cosT, sinT, B, T, NH, NKV, HS);
      int same = 1;
      for (size_t t = 0; t < N; t++)
        same &= !memcmp(qkv + t * D, q + t * Dq, Dq * sizeof(real)) &&
                !memcmp(qkv + t * D + Dq, k + t * Dkv, Dkv * sizeof(real)) &&
                !memcmp(dqkv + t * D, dq + t * Dq, Dq * sizeof(real)) &&
                !memcmp(dqkv + t * D + Dq, dk + t * Dkv, Dkv * sizeof(real)) &&
                !memcmp(dqkv + t * D + Dq + Dkv, dv + t * Dkv, Dkv * sizeof(real));
      CHECK_MSG(same, "B %d T %d NH %d NKV %d HS %d mask %d bf16 %d: the fused layout differs", B, T, NH, NKV, HS,
                use_mask, lowp);
      free(q), free(k), free(v), free(dout), free(qkv), free(cosT), free(sinT), free(scratch);
      free(out1), free(out2), free(p1), free(p2), free(dq), free(dk), free(dv), free(dqkv);
    }
}

/* The vector layer's dropout draw (vec.h, dropout_keep: 8 or 16 Philox blocks at a time) gives
 * philox_uniform's numbers, element by element, bit for bit: every length 0 .. 200 (whole
 * groups, a last short group and the tails) from starts at every offset within a block, and
 * rows whose counter (elem / 4, its low 32 bits) crosses 2^32 and 2^33 or sits at the top of
 * the 64-bit range, for keys with both words set; nothing is written past n. */
static void vector_dropout_draw_gives_the_scalar_numbers(void)
{
  static const uint64_t starts[] = { 0, 1, 2, 3, 4, 61, (1ull << 34) - 70, (1ull << 34) - 69,
                                     (1ull << 34) - 66, (1ull << 34) - 3, (1ull << 35) - 37,
                                     3ull << 34, UINT64_MAX - 300 };
  static const float ps[] = { 0.25f, 0.5f, 1.0f };
  const uint64_t seed = 0x9E3779B97F4A7C15ull;
  float got[208], want[208];
  int paths = 0;
  for (int isa = VEC_AVX2; isa <= VEC_AVX512; isa++) {
    const struct vec_ops *v = vec_ops_of((enum vec_isa)isa);
    if (!v)
      continue;
    paths++;
    for (size_t si = 0; si < sizeof starts / sizeof starts[0]; si++)
      for (int pi = 0; pi < 3; pi++) {
        const float p = ps[pi], keep = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
        const uint32_t c1 = 7, c2 = 0xFFFFFFF0u + (uint32_t)si, c3 = 3;
        struct vec_dropout d;
        vec_dropout_stream(&d, seed + si, c1, c2, c3, p, keep);
        for (size_t j = 0; j < 200; j++)
          want[j] = philox_uniform(seed + si, c1, c2, c3, starts[si] + j) < p ? 0.0f : keep;
        int same = 1;
        for (size_t n = 0; n <= 200; n++) {
          for (size_t j = 0; j < 208; j++) got[j] = -1.0f;
          v->dropout_keep(got, &d, starts[si], n);
          same &= memcmp(got, want, n * sizeof(float)) == 0;
          for (size_t j = n; j < 208; j++) same &= got[j] == -1.0f;
        }
        CHECK_MSG(same, "%s: start %llu p %g: the vector draw differs from philox_uniform",
                  v->name, (unsigned long long)starts[si], p);
      }
  }
  printf("dropout draw checked on %d vector path%s\n", paths, paths == 1 ? "" : "s");
}

/* The attention with dropout on every path of the vector layer this CPU has (the scalar path,
 * which the float64 build always takes, included) against the reference; AVX2 and AVX-512
 * give the same bits as each other (vec.h). */
static void dropout_on_every_simd_path_matches_full_square_reference(void)
{
  const enum vec_isa was = vec_current();
  for (int isa = VEC_SCALAR; isa < VEC_N_ISAS; isa++) {
    if (vec_select((enum vec_isa)isa) != 0)
      continue;
    check_case(2, 65, 4, 2, 16, 1, 1);
    check_case(1, 513, 2, 1, 8, 1, 1);
  }
  if (vec_supported(VEC_AVX2) && vec_supported(VEC_AVX512)) {
    const int B = 2, T = 77, NH = 4, NKV = 2, HS = 8;
    const size_t nq = (size_t)B * T * NH * HS, nkv = (size_t)B * T * NKV * HS;
    uint32_t st = 5;
    real *q = rand_buf(nq, 2, &st), *k = rand_buf(nkv, 2, &st), *v = rand_buf(nkv, 1, &st);
    real *dout = rand_buf(nq, 1, &st), *scratch = nan_buf(attention_scratch_n_elems(B, T, NH, NKV, HS));
    struct drop_case dc;
    drop_case_make(&dc, 0, B, T, NH, 0.3f, 0x123456789ull, 5, 6, (1ull << 34) - 1000);
    real *r[2][5];
    for (int i = 0; i < 2; i++) {
      real *out = nan_buf(nq), *lse = nan_buf((size_t)B * NH * T), *dq = nan_buf(nq);
      real *dk = nan_buf(nkv), *dv = nan_buf(nkv);
      vec_select(i == 0 ? VEC_AVX2 : VEC_AVX512);
      attention_forward(out, lse, scratch, q, k, v, &dc.d, B, T, NH, NKV, HS);
      attention_backward(dq, dk, dv, scratch, dout, q, k, v, out, lse, &dc.d, B, T, NH, NKV, HS);
      r[i][0] = out, r[i][1] = lse, r[i][2] = dq, r[i][3] = dk, r[i][4] = dv;
    }
    const size_t sizes[5] = { nq, (size_t)B * NH * T, nq, nkv, nkv };
    for (int o = 0; o < 5; o++) {
      CHECK_MSG(memcmp(r[0][o], r[1][o], sizes[o] * sizeof(real)) == 0,
                "output %d: AVX2 and AVX-512 differ with dropout", o);
      free(r[0][o]), free(r[1][o]);
    }
    free(q), free(k), free(v), free(dout), free(scratch);
  }
  vec_select(was);
}

TEST_MAIN(TEST(fused_qkv_layout_gives_the_separate_bits),
          TEST(bf16_entries_round_only_the_products),
          TEST(vector_dropout_draw_gives_the_scalar_numbers),
          TEST(dropout_on_every_simd_path_matches_full_square_reference),
          TEST(multi_head_matches_full_square_reference),
          TEST(grouped_heads_match_full_square_reference),
          TEST(multi_query_matches_full_square_reference),
          TEST(several_key_chunks_match_full_square_reference),
          TEST(one_head_odd_head_size_matches_full_square_reference))
