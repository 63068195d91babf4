/* The CUDA losses and mixture-of-experts entries (kernels/cuda/cuda_loss_moe.cu) against the CPU
 * table's (kernel_ops_cpu, ctx NULL) on the same inputs: cross-entropy (whole vocabulary, in place
 * and not, padding columns, ignored targets), its four vocabulary-shard pieces (with a shard
 * that is all padding), and the eight MoE entries (router, routing with and without capacity,
 * dispatch, combine and their duals, the aux loss, the router's backward).
 *
 * Sizes are not multiples of the kernels' blocks (256 threads for row reductions and routing,
 * 128 for per-token kernels), and every group has one larger shape. Where both sides do the same
 * operations in the same order on the same inputs (routing: integers; dispatch, its dual, the
 * combine (fp32 products and sums rounded apart on both: the CPU builds with -std=c11, so no
 * contraction) and the crossentropy backward) the result must be the same bits; elsewhere each
 * comparison states its bound. u = REAL_U = 2^-24. The differences come from:
 *   - exp: CUDA's expf is within 2 ulp of exp, the CPU's (libm or its vector layer) within 1,
 *     so the two exp(l − max) of one element differ by at most 3u relative;
 *   - sums run in double in another order (CPU: sequential or vector lanes; CUDA: a fixed
 *     256-thread tree): a difference of N·2^-53 relative, far below u for any N here;
 *   - one final rounding to fp32 on each side (u each).
 * Output buffers are filled with a sentinel before each call, so "assigned" and "untouched" are
 * checked too. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda_fixture.h"

#define U REAL_U
#define SENTINEL 12345.0f

static uint32_t rng_state = 0x9e3779b9u;
static uint32_t rnd_u32(void)
{
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 17;
  rng_state ^= rng_state << 5;
  return rng_state;
}
static int rnd_int(int n) { return (int)(rnd_u32() % (uint32_t)n); }

static void *xmalloc(size_t n)
{
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "out of host memory\n");
    exit(1);
  }
  return p;
}

static void fill_const(real *x, size_t n, real v)
{
  for (size_t i = 0; i < n; i++) x[i] = v;
}

/* How many i have |a − b| > rel·|b| + abs_; the first is printed. */
static size_t count_far(const char *what, const real *a, const real *b, size_t n, double rel,
                        double abs_)
{
  size_t bad = 0;
  for (size_t i = 0; i < n; i++) {
    const double d = fabs((double)a[i] - b[i]);
    if (!(d <= rel * fabs((double)b[i]) + abs_)) {
      if (!bad)
        fprintf(stderr, "%s[%zu]: cuda %.9g, cpu %.9g (bound %.3g rel + %.3g)\n", what, i, (double)a[i],
                (double)b[i], rel, abs_);
      bad++;
    }
  }
  return bad;
}

static size_t count_diff_bits(const char *what, const void *a, const void *b, size_t n, size_t elem)
{
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    if (memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem)) {
      if (!bad) fprintf(stderr, "%s[%zu] differs\n", what, i);
      bad++;
    }
  return bad;
}

/* ---- cross-entropy, whole vocabulary ---- */

/* Rows with target −1 every 5th; the others random in [0, V), the last row the last real token. */
static void make_targets(int *t, int BT, int V)
{
  for (int bt = 0; bt < BT; bt++) t[bt] = bt % 5 == 3 ? -1 : rnd_int(V);
  t[BT - 1] = V - 1;
}

static void ce_case(int BT, int V, int Vp, int in_place)
{
  const size_t n = (size_t)BT * Vp;
  real *logits = xmalloc(n * sizeof(real)), *probs_cpu = xmalloc(n * sizeof(real));
  real *probs_gpu = xmalloc(n * sizeof(real)), *loss_cpu = xmalloc(BT * sizeof(real));
  real *loss_gpu = xmalloc(BT * sizeof(real)), *d_cpu = xmalloc(n * sizeof(real));
  real *d_gpu = xmalloc(n * sizeof(real));
  int *targets = xmalloc(BT * sizeof(int));
  fill_uniform(logits, n, (uint64_t)BT * 7 + V, 4.0);
  for (int bt = 0; bt < BT; bt++) /* padding logits large: a kernel that read them would fail */
    for (int i = V; i < Vp; i++) logits[(size_t)bt * Vp + i] = 50.0f;
  make_targets(targets, BT, V);

  int *d_t = dev_upload(targets, BT * sizeof(int));
  real *d_logits = dev_upload(logits, n * sizeof(real));
  real *d_probs = in_place ? d_logits : dev_zeros(n * sizeof(real));
  real *d_loss = dev_zeros(BT * sizeof(real));
  if (!in_place) { /* a sentinel in probs: every element must be assigned */
    fill_const(probs_gpu, n, SENTINEL);
    kernel_ops_cuda.from_host(fixture_ctx, d_probs, probs_gpu, n * sizeof(real));
  }
  kernel_ops_cpu.crossentropy_forward(NULL, loss_cpu, probs_cpu, logits, targets, BT, V, Vp);
  kernel_ops_cuda.crossentropy_forward(fixture_ctx, d_loss, d_probs, d_logits, d_t, BT, V, Vp);
  dev_download(probs_gpu, d_probs, n * sizeof(real));
  dev_download(loss_gpu, d_loss, BT * sizeof(real));
  CHECK_CUDA_OK();
  /* Σ: the CPU's terms are exp(fl(l − max)), the GPU's exp(fl(l − m)) · exp(m − max) for a
   * thread's running max m ≤ max (the rescale in double, ~2^-52). Rounding the argument moves a
   * term by ≤ u·|l − m| ≤ u·x relative, x = max − l, on each side, and the exps are 3u apart, so
   * the two Σ differ by ≤ (3 + 2·x̄)u relative, x̄ = Σ p·x the row's mean distance below its
   * max under p, plus N·2^-53. Logits uniform on a width-8 interval give x̄ ≈ 1; held ≤ 1.5 here
   * (the bounds below assume it): Σ within 6u.
   * probs = exp(l − max) · (1/Σ), the same argument on both sides: exp 3u apart, Σ 6u, 1/Σ
   * rounded (u each side), the product rounded (u each side): 3 + 6 + 2 + 2 = 13u relative,
   * bounded by 16u; padding must be exactly 0 (abs 0 there: the reference is 0, the bound
   * rel·0 + 0). */
  double worst_xbar = 0;
  for (int bt = 0; bt < BT; bt++) {
    const real *l = logits + (size_t)bt * Vp, *pr = probs_cpu + (size_t)bt * Vp;
    double mx = -INFINITY, xbar = 0;
    for (int i = 0; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    for (int i = 0; i < V; i++) xbar += pr[i] * (mx - l[i]);
    worst_xbar = xbar > worst_xbar ? xbar : worst_xbar;
  }
  CHECK_MSG(worst_xbar <= 1.5, "mean distance below the max %.3g > 1.5: the bounds do not hold", worst_xbar);
  CHECK(count_far("probs", probs_gpu, probs_cpu, n, 16 * U, 0) == 0);
  /* and so in norm: ‖Δ‖ ≤ 16u·‖ref‖ and max |Δ| ≤ 16u·max |ref| (the fixture's summaries) */
  CHECK(rel_l2(probs_gpu, probs_cpu, n) <= 16 * U && max_rel(probs_gpu, probs_cpu, n) <= 16 * U);
  /* loss = log Σ − (l_t − max): Σ 6u apart relatively gives log Σ 6u apart absolutely; l_t − max
   * exact in double; one rounding each side: |Δ| ≤ 6u + 2u·|loss| ≤ 8u·(1 + |loss|). Ignored
   * rows exactly 0. */
  size_t bad = 0;
  for (int bt = 0; bt < BT; bt++) {
    const double ref = loss_cpu[bt], got = loss_gpu[bt];
    if (targets[bt] < 0 ? got != 0.0 : !(fabs(got - ref) <= 8 * U * (1 + fabs(ref)))) {
      if (!bad) fprintf(stderr, "loss[%d]: cuda %.9g, cpu %.9g\n", bt, got, ref);
      bad++;
    }
  }
  CHECK_MSG(bad == 0, "%zu losses out of bound (BT %d V %d Vp %d)", bad, BT, V, Vp);

  /* backward on the CPU's probs (the same input on both sides): (p − onehot) · s is one subtract
   * and one multiply, each rounded, on both sides: the same bits. In place (dlogits = probs) on
   * the device when in_place; else into a sentinel-filled buffer (assigned: padding and ignored
   * rows become exactly 0). */
  const real scale = 1.0f / 37.0f;
  kernel_ops_cuda.from_host(fixture_ctx, d_probs, probs_cpu, n * sizeof(real));
  real *d_d = d_probs;
  if (!in_place) {
    fill_const(d_gpu, n, SENTINEL);
    d_d = dev_upload(d_gpu, n * sizeof(real));
  }
  kernel_ops_cpu.crossentropy_backward(NULL, d_cpu, probs_cpu, targets, scale, BT, V, Vp);
  kernel_ops_cuda.crossentropy_backward(fixture_ctx, d_d, d_probs, d_t, scale, BT, V, Vp);
  dev_download(d_gpu, d_d, n * sizeof(real));
  CHECK_CUDA_OK();
  CHECK(count_diff_bits("dlogits", d_gpu, d_cpu, n, sizeof(real)) == 0);

  if (!in_place) {
    dev_free(d_d);
    dev_free(d_probs);
  }
  dev_free(d_logits);
  dev_free(d_loss);
  dev_free(d_t);
  free(logits), free(probs_cpu), free(probs_gpu), free(loss_cpu), free(loss_gpu), free(d_cpu),
      free(d_gpu), free(targets);
}

static void test_crossentropy(void)
{
  ce_case(37, 1001, 1024, 0); /* rows not a multiple of anything; 1001 columns: 3.9 blocks */
  ce_case(37, 1001, 1024, 1); /* in place: probs = logits, dlogits = probs */
  ce_case(5, 7, 7, 0);        /* fewer columns than threads, no padding */
  ce_case(64, 50257, 50304, 1); /* the GPT-2 vocabulary, padded to 128 */
  ce_case(4096, 32000, 32000, 0); /* a real size: seq 4096 of Llama's vocabulary */
}

/* ---- cross-entropy, vocabulary shards ---- */

static int shard_valid(int V, int v0, int Vl)
{
  const int n = V - v0;
  return n < 0 ? 0 : n > Vl ? Vl : n;
}

/* tp shards of Vl = Vp / tp columns each; each piece runs on both sides with the same inputs
 * (the stats reduced on the host from the CPU's, then given to both). */
static void shard_case(int BT, int V, int Vp, int tp)
{
  const int Vl = Vp / tp;
  const size_t nl = (size_t)BT * Vl;
  real *logits = xmalloc(nl * sizeof(real) * tp), *stats = xmalloc(3 * BT * sizeof(real) * tp);
  real *stats_gpu = xmalloc(3 * BT * sizeof(real)), *red = xmalloc(3 * BT * sizeof(real));
  real *p_cpu = xmalloc(nl * sizeof(real)), *p_gpu = xmalloc(nl * sizeof(real));
  real *l_cpu = xmalloc(BT * sizeof(real)), *l_gpu = xmalloc(BT * sizeof(real));
  real *d_cpu = xmalloc(nl * sizeof(real)), *d_gpu = xmalloc(nl * sizeof(real));
  int *targets = xmalloc(BT * sizeof(int));
  fill_uniform(logits, nl * tp, (uint64_t)V * 31 + tp, 4.0);
  make_targets(targets, BT, V);
  int *d_t = dev_upload(targets, BT * sizeof(int));
  real *d_stats = dev_zeros(3 * BT * sizeof(real)), *d_l = dev_zeros(nl * sizeof(real));
  real *d_p = dev_zeros(nl * sizeof(real)), *d_loss = dev_zeros(BT * sizeof(real));
  size_t bad_max = 0, bad_sum = 0, bad_tl = 0, bad_p = 0, bad_loss = 0, bad_d = 0;

  for (int r = 0; r < tp; r++) { /* pass 1: each shard's max, exact (a max is any order's) */
    const int v0 = r * Vl, Vv = shard_valid(V, v0, Vl);
    real *l = logits + nl * r, *st = stats + 3 * (size_t)BT * r;
    for (int bt = 0; bt < BT; bt++)
      for (int i = Vv; i < Vl; i++) l[(size_t)bt * Vl + i] = 50.0f;
    kernel_ops_cuda.from_host(fixture_ctx, d_l, l, nl * sizeof(real));
    kernel_ops_cpu.crossentropy_shard_max(NULL, st, l, BT, Vv, Vl);
    kernel_ops_cuda.crossentropy_shard_max(fixture_ctx, d_stats, d_l, BT, Vv, Vl);
    dev_download(stats_gpu, d_stats, BT * sizeof(real));
    bad_max += count_diff_bits("shard max", stats_gpu, st, BT, sizeof(real));
  }
  for (int bt = 0; bt < BT; bt++) { /* the max reduction */
    red[bt] = -INFINITY;
    for (int r = 0; r < tp; r++) red[bt] = fmaxf(red[bt], stats[3 * (size_t)BT * r + bt]);
  }
  for (int bt = 0; bt < BT; bt++) red[BT + bt] = red[2 * BT + bt] = 0;
  for (int r = 0; r < tp; r++) { /* pass 2: Σ exp and the target's logit */
    const int v0 = r * Vl, Vv = shard_valid(V, v0, Vl);
    real *l = logits + nl * r, *st = stats + 3 * (size_t)BT * r;
    memcpy(st, red, BT * sizeof(real));
    fill_const(stats_gpu, 3 * (size_t)BT, SENTINEL);
    memcpy(stats_gpu, red, BT * sizeof(real));
    kernel_ops_cuda.from_host(fixture_ctx, d_stats, stats_gpu, 3 * BT * sizeof(real));
    kernel_ops_cuda.from_host(fixture_ctx, d_l, l, nl * sizeof(real));
    kernel_ops_cpu.crossentropy_shard_sums(NULL, st, l, targets, v0, BT, Vv, Vl);
    kernel_ops_cuda.crossentropy_shard_sums(fixture_ctx, d_stats, d_l, d_t, v0, BT, Vv, Vl);
    dev_download(stats_gpu, d_stats, 3 * BT * sizeof(real));
    /* Σ of Vv exps each 3u apart, in double, rounded once each side: 3u + 2u ≤ 6u relative (a
     * shard of padding only: both exactly 0) */
    bad_sum += count_far("shard sum", stats_gpu + BT, st + BT, BT, 6 * U, 0);
    /* the target's logit is a copy: the same bits */
    bad_tl += count_diff_bits("shard target logit", stats_gpu + 2 * BT, st + 2 * BT, BT, sizeof(real));
    for (int bt = 0; bt < BT; bt++) red[BT + bt] += st[BT + bt], red[2 * BT + bt] += st[2 * BT + bt];
  }
  for (int r = 0; r < tp; r++) { /* pass 3 and the backward, on the reduced stats */
    const int v0 = r * Vl, Vv = shard_valid(V, v0, Vl);
    real *l = logits + nl * r;
    kernel_ops_cuda.from_host(fixture_ctx, d_stats, red, 3 * BT * sizeof(real));
    kernel_ops_cuda.from_host(fixture_ctx, d_l, l, nl * sizeof(real));
    /* in place on even shards (probs = logits), into a sentinel-filled buffer on odd ones */
    real *dp = r % 2 ? d_p : d_l;
    if (r % 2) {
      fill_const(p_gpu, nl, SENTINEL);
      kernel_ops_cuda.from_host(fixture_ctx, d_p, p_gpu, nl * sizeof(real));
    }
    kernel_ops_cpu.crossentropy_shard_finish(NULL, l_cpu, p_cpu, l, red, targets, BT, Vv, Vl);
    kernel_ops_cuda.crossentropy_shard_finish(fixture_ctx, d_loss, dp, d_l, d_stats, d_t, BT, Vv, Vl);
    dev_download(p_gpu, dp, nl * sizeof(real));
    dev_download(l_gpu, d_loss, BT * sizeof(real));
    /* exp(l − max) 3u apart, times the same 1/Σ (computed from the same bits), rounded once each
     * side: ≤ 5u relative, bounded by 6u; padding exactly 0 */
    bad_p += count_far("shard probs", p_gpu, p_cpu, nl, 6 * U, 0);
    /* the same inputs; only log (double, ≤ 1 double ulp each side) and the fp32 rounding differ:
     * |Δ| ≤ u·|loss| + 2^-50, bounded by 2u·(1 + |loss|); ignored rows exactly 0 */
    bad_loss += count_far("shard loss", l_gpu, l_cpu, BT, 2 * U, 2 * U);
    for (int bt = 0; bt < BT; bt++) bad_loss += targets[bt] < 0 && l_gpu[bt] != 0.0f;
    /* backward on the CPU's probs: the same subtract and multiply, the same bits */
    kernel_ops_cuda.from_host(fixture_ctx, dp, p_cpu, nl * sizeof(real));
    real *dd = r % 2 ? d_l : dp; /* in place (dlogits = probs) on even shards */
    if (r % 2) {
      fill_const(d_gpu, nl, SENTINEL);
      kernel_ops_cuda.from_host(fixture_ctx, dd, d_gpu, nl * sizeof(real));
    }
    const real scale = 0.25f;
    kernel_ops_cpu.crossentropy_shard_backward(NULL, d_cpu, p_cpu, targets, v0, scale, BT, Vv, Vl);
    kernel_ops_cuda.crossentropy_shard_backward(fixture_ctx, dd, dp, d_t, v0, scale, BT, Vv, Vl);
    dev_download(d_gpu, dd, nl * sizeof(real));
    bad_d += count_diff_bits("shard dlogits", d_gpu, d_cpu, nl, sizeof(real));
  }
  CHECK_CUDA_OK();
  CHECK_MSG(bad_max == 0 && bad_sum == 0 && bad_tl == 0, "BT %d V %d Vp %d tp %d: max %zu sum %zu tl %zu",
            BT, V, Vp, tp, bad_max, bad_sum, bad_tl);
  CHECK_MSG(bad_p == 0 && bad_loss == 0 && bad_d == 0, "BT %d V %d Vp %d tp %d: probs %zu loss %zu d %zu",
            BT, V, Vp, tp, bad_p, bad_loss, bad_d);
  dev_free(d_t), dev_free(d_stats), dev_free(d_l), dev_free(d_p), dev_free(d_loss);
  free(logits), free(stats), free(stats_gpu), free(red), free(p_cpu), free(p_gpu), free(l_cpu),
      free(l_gpu), free(d_cpu), free(d_gpu), free(targets);
}

static void test_crossentropy_shards(void)
{
  shard_case(7, 13, 16, 4);        /* last real shard has 1 real column */
  shard_case(9, 11, 16, 4);        /* shard 3 (v0 = 12) is all padding: max −inf, Σ 0 */
  shard_case(41, 1000, 1026, 3);   /* odd tp, columns not a multiple of 256 */
  shard_case(33, 50257, 50304, 2); /* the larger shape */
}

/* ---- mixture of experts ---- */

/* Router logits on a grid of 1/8: exact ties within a row are common (they test "the lower index
 * first") and distinct logits are ≥ 1/8 apart, so their probabilities differ by a factor ≥ 1.13,
 * far beyond the two sides' few-ulp differences: top-k must then agree exactly. */
static void router_logits(real *l, size_t n, int spread)
{
  for (size_t i = 0; i < n; i++) l[i] = (real)(rnd_int(spread) - spread / 2) / 8.0f;
}

static void router_case(int N, int E, int K)
{
  const size_t ne = (size_t)N * E, nk = (size_t)N * K;
  real *logits = xmalloc(ne * sizeof(real)), *p_cpu = xmalloc(ne * sizeof(real));
  real *p_gpu = xmalloc(ne * sizeof(real)), *w_cpu = xmalloc(nk * sizeof(real));
  real *w_gpu = xmalloc(nk * sizeof(real)), *lse_cpu = xmalloc(N * sizeof(real));
  real *lse_gpu = xmalloc(N * sizeof(real));
  int *ti_cpu = xmalloc(nk * sizeof(int)), *ti_gpu = xmalloc(nk * sizeof(int));
  router_logits(logits, ne, E / 2 + 2);
  real *d_logits = dev_upload(logits, ne * sizeof(real)), *d_p = dev_zeros(ne * sizeof(real));
  real *d_w = dev_zeros(nk * sizeof(real)), *d_lse = dev_zeros(N * sizeof(real));
  int *d_ti = dev_zeros(nk * sizeof(int));
  kernel_ops_cpu.moe_router_forward(NULL, p_cpu, ti_cpu, w_cpu, lse_cpu, logits, N, E, K);
  kernel_ops_cuda.moe_router_forward(fixture_ctx, d_p, d_ti, d_w, d_lse, d_logits, N, E, K);
  dev_download(p_gpu, d_p, ne * sizeof(real));
  dev_download(ti_gpu, d_ti, nk * sizeof(int));
  dev_download(w_gpu, d_w, nk * sizeof(real));
  dev_download(lse_gpu, d_lse, N * sizeof(real));
  CHECK_CUDA_OK();
  /* p = exp(l − max) / Σ in double: exps 3u apart, Σ 3u, the quotient rounded once each side:
   * ≤ 8u relative. Identical logits give identical exps on each side, so ties stay ties. */
  CHECK(count_far("router probs", p_gpu, p_cpu, ne, 8 * U, 0) == 0);
  CHECK(count_diff_bits("router topi", ti_gpu, ti_cpu, nk, sizeof(int)) == 0);
  /* topw = p / Σ_k p, in double from fp32 probs each 8u apart: ≤ 16u + 2u, bounded by 20u */
  CHECK(count_far("router topw", w_gpu, w_cpu, nk, 20 * U, 0) == 0);
  /* lse = max + log Σ: log Σ 3u apart absolutely, one rounding each side */
  CHECK(count_far("router lse", lse_gpu, lse_cpu, N, 2 * U, 4 * U) == 0);
  dev_free(d_logits), dev_free(d_p), dev_free(d_w), dev_free(d_lse), dev_free(d_ti);
  free(logits), free(p_cpu), free(p_gpu), free(w_cpu), free(w_gpu), free(lse_cpu), free(lse_gpu),
      free(ti_cpu), free(ti_gpu);
}

static void test_moe_router_forward(void)
{
  router_case(203, 8, 2);  /* 203 tokens: 1.6 blocks of 128 */
  router_case(37, 5, 5);   /* K = E */
  router_case(4099, 64, 6);
}

/* K distinct experts per token, favouring low indices so that capacity drops happen. */
static void random_topi(int *topi, int N, int E, int K)
{
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) {
      int e, dup;
      do {
        e = rnd_int(2) ? rnd_int(E) : rnd_int((E + 1) / 2);
        dup = 0;
        for (int j = 0; j < k; j++) dup |= topi[(size_t)n * K + j] == e;
      } while (dup);
      topi[(size_t)n * K + k] = e;
    }
}

/* Routing is integer work: the same slots, counts and routed exactly. */
static void route_case(int N, int T, int E, int K, int capacity)
{
  const size_t nk = (size_t)N * K;
  int *topi = xmalloc(nk * sizeof(int)), *slot_cpu = xmalloc(nk * sizeof(int));
  int *slot_gpu = xmalloc(nk * sizeof(int)), *c_cpu = xmalloc(E * sizeof(int));
  int *c_gpu = xmalloc(E * sizeof(int)), *r_cpu = xmalloc(E * sizeof(int)), *r_gpu = xmalloc(E * sizeof(int));
  random_topi(topi, N, E, K);
  for (size_t i = 0; i < nk; i++) slot_gpu[i] = 77; /* all assigned */
  for (int e = 0; e < E; e++) c_gpu[e] = r_gpu[e] = 77;
  int *d_topi = dev_upload(topi, nk * sizeof(int)), *d_slot = dev_upload(slot_gpu, nk * sizeof(int));
  int *d_c = dev_upload(c_gpu, E * sizeof(int)), *d_r = dev_upload(r_gpu, E * sizeof(int));
  kernel_ops_cpu.moe_route(NULL, slot_cpu, c_cpu, r_cpu, topi, N, T, E, K, capacity);
  kernel_ops_cuda.moe_route(fixture_ctx, d_slot, d_c, d_r, d_topi, N, T, E, K, capacity);
  dev_download(slot_gpu, d_slot, nk * sizeof(int));
  dev_download(c_gpu, d_c, E * sizeof(int));
  dev_download(r_gpu, d_r, E * sizeof(int));
  CHECK_CUDA_OK();
  size_t dropped = 0;
  for (size_t i = 0; i < nk; i++) dropped += slot_cpu[i] < 0;
  CHECK_MSG(count_diff_bits("slot", slot_gpu, slot_cpu, nk, sizeof(int)) == 0 &&
                count_diff_bits("counts", c_gpu, c_cpu, E, sizeof(int)) == 0 &&
                count_diff_bits("routed", r_gpu, r_cpu, E, sizeof(int)) == 0,
            "N %d T %d E %d K %d capacity %d", N, T, E, K, capacity);
  /* the case does what it claims: drops when capacity binds, none without it */
  CHECK(capacity == 0 ? dropped == 0 : dropped > 0);
  dev_free(d_topi), dev_free(d_slot), dev_free(d_c), dev_free(d_r);
  free(topi), free(slot_cpu), free(slot_gpu), free(c_cpu), free(c_gpu), free(r_cpu), free(r_gpu);
}

static void test_moe_route(void)
{
  route_case(300, 75, 7, 2, 0);
  route_case(300, 75, 7, 2, 20);    /* 4 groups of 75; 21 a group per expert on average */
  route_case(263, 263, 5, 3, 90);   /* one group; priority over 789 > 256 entries */
  route_case(77, 7, 4, 1, 1);       /* top-1, capacity 1 */
  route_case(8192, 1024, 64, 2, 40); /* the larger shape: 1.25 × the balanced 32 */
}

/* The routing (the CPU's) and random data for the dispatch and combine tests. */
struct moe_data {
  int N, K, C, R;
  int *slot;
  real *x, *topw;
};

static struct moe_data moe_data_make(int N, int T, int E, int K, int C, int capacity)
{
  struct moe_data d = { N, K, C, 0, NULL, NULL, NULL };
  int *topi = xmalloc((size_t)N * K * sizeof(int)), *counts = xmalloc(E * sizeof(int));
  int *routed = xmalloc(E * sizeof(int));
  d.slot = xmalloc((size_t)N * K * sizeof(int));
  random_topi(topi, N, E, K);
  kernel_ops_cpu.moe_route(NULL, d.slot, counts, routed, topi, N, T, E, K, capacity);
  for (int e = 0; e < E; e++) d.R += counts[e];
  d.x = xmalloc((size_t)N * C * sizeof(real));
  d.topw = xmalloc((size_t)N * K * sizeof(real));
  fill_uniform(d.x, (size_t)N * C, (uint64_t)N * 3 + C, 1.0);
  fill_uniform(d.topw, (size_t)N * K, (uint64_t)N * 5 + K, 1.0);
  free(topi), free(counts), free(routed);
  return d;
}

static void moe_data_free(struct moe_data *d) { free(d->slot), free(d->x), free(d->topw); }

static void dispatch_combine_case(int N, int T, int E, int K, int C, int capacity)
{
  struct moe_data m = moe_data_make(N, T, E, K, C, capacity);
  const size_t nc = (size_t)N * C, nk = (size_t)N * K;
  /* xe and dye one row larger than R: a row no slot names, which must stay the sentinel */
  const size_t rc = (size_t)(m.R + 1) * C;
  real *a_cpu = xmalloc((rc > nc ? rc : nc) * sizeof(real)), *a_gpu = xmalloc((rc > nc ? rc : nc) * sizeof(real));
  real *ye = xmalloc(rc * sizeof(real)), *dout = xmalloc(nc * sizeof(real));
  real *w_cpu = xmalloc(nk * sizeof(real)), *w_gpu = xmalloc(nk * sizeof(real));
  fill_uniform(ye, rc, (uint64_t)E * 11 + C, 1.0);
  fill_uniform(dout, nc, (uint64_t)E * 13 + C, 1.0);
  int *d_slot = dev_upload(m.slot, nk * sizeof(int));
  real *d_x = dev_upload(m.x, nc * sizeof(real)), *d_ye = dev_upload(ye, rc * sizeof(real));
  real *d_dout = dev_upload(dout, nc * sizeof(real)), *d_w = dev_upload(m.topw, nk * sizeof(real));
  real *d_a = dev_zeros((rc > nc ? rc : nc) * sizeof(real)), *d_dw = dev_zeros(nk * sizeof(real));

  /* dispatch: copies, the same bits; rows no slot names untouched (the sentinel) */
  fill_const(a_cpu, rc, SENTINEL);
  kernel_ops_cuda.from_host(fixture_ctx, d_a, a_cpu, rc * sizeof(real));
  kernel_ops_cpu.moe_dispatch(NULL, a_cpu, m.x, m.slot, N, K, C);
  kernel_ops_cuda.moe_dispatch(fixture_ctx, d_a, d_x, d_slot, N, K, C);
  dev_download(a_gpu, d_a, rc * sizeof(real));
  CHECK_CUDA_OK();
  CHECK(count_diff_bits("xe", a_gpu, a_cpu, rc, sizeof(real)) == 0);

  /* dispatch backward: Σ over kept k ascending, the same fp32 adds in the same order from 0:
   * the same bits; assigned over a sentinel (0 for a token with nothing kept) */
  fill_const(a_gpu, nc, SENTINEL);
  kernel_ops_cuda.from_host(fixture_ctx, d_a, a_gpu, nc * sizeof(real));
  kernel_ops_cpu.moe_dispatch_backward(NULL, a_cpu, ye, m.slot, N, K, C);
  kernel_ops_cuda.moe_dispatch_backward(fixture_ctx, d_a, d_ye, d_slot, N, K, C);
  dev_download(a_gpu, d_a, nc * sizeof(real));
  CHECK_CUDA_OK();
  CHECK(count_diff_bits("dx", a_gpu, a_cpu, nc, sizeof(real)) == 0);

  /* combine: Σ over kept k ascending of w · y, each product and sum rounded apart on both sides
   * (no contraction: __fmul_rn/__fadd_rn there, -std=c11 here): the same bits */
  fill_const(a_gpu, nc, SENTINEL);
  kernel_ops_cuda.from_host(fixture_ctx, d_a, a_gpu, nc * sizeof(real));
  kernel_ops_cpu.moe_combine(NULL, a_cpu, ye, m.slot, m.topw, N, K, C);
  kernel_ops_cuda.moe_combine(fixture_ctx, d_a, d_ye, d_slot, d_w, N, K, C);
  dev_download(a_gpu, d_a, nc * sizeof(real));
  CHECK_CUDA_OK();
  CHECK(count_diff_bits("combine", a_gpu, a_cpu, nc, sizeof(real)) == 0);

  /* combine backward: dye = w · dout (one rounded product: the same bits; rows no slot names
   * untouched); dtopw = Σ_c dout·y in double (exact products, sums in another order: C·2^-53
   * relative to Σ|dout·y|), rounded once each side: |Δ| ≤ u·|ref| + u·|ref| + 2C·2^-53·Σ|d y|,
   * and Σ|d y| ≤ C (|dout|, |y| ≤ 1): bounded by 2u·|ref| + 2C²·2^-53 (1.3e-10 at C = 777, far
   * under u·|ref| for a typical |ref| ~ √C/3); dropped assignments exactly 0 */
  fill_const(a_cpu, rc, SENTINEL);
  kernel_ops_cuda.from_host(fixture_ctx, d_a, a_cpu, rc * sizeof(real));
  fill_const(w_gpu, nk, SENTINEL);
  kernel_ops_cuda.from_host(fixture_ctx, d_dw, w_gpu, nk * sizeof(real));
  kernel_ops_cpu.moe_combine_backward(NULL, a_cpu, w_cpu, dout, ye, m.slot, m.topw, N, K, C);
  kernel_ops_cuda.moe_combine_backward(fixture_ctx, d_a, d_dw, d_dout, d_ye, d_slot, d_w, N, K, C);
  dev_download(a_gpu, d_a, rc * sizeof(real));
  dev_download(w_gpu, d_dw, nk * sizeof(real));
  CHECK_CUDA_OK();
  CHECK(count_diff_bits("dye", a_gpu, a_cpu, rc, sizeof(real)) == 0);
  CHECK(count_far("dtopw", w_gpu, w_cpu, nk, 2 * U, 2.0 * C * C * DOUBLE_U) == 0);
  size_t bad = 0;
  for (size_t i = 0; i < nk; i++) bad += m.slot[i] < 0 && w_gpu[i] != 0.0f;
  CHECK(bad == 0);

  dev_free(d_slot), dev_free(d_x), dev_free(d_ye), dev_free(d_dout), dev_free(d_w), dev_free(d_a),
      dev_free(d_dw);
  free(a_cpu), free(a_gpu), free(ye), free(dout), free(w_cpu), free(w_gpu);
  moe_data_free(&m);
}

static void test_moe_dispatch_combine(void)
{
  dispatch_combine_case(150, 50, 6, 2, 37, 12);    /* drops; C = 37 under one block */
  dispatch_combine_case(60, 60, 4, 3, 300, 0);     /* no drops, K = 3, C over one block */
  dispatch_combine_case(2048, 512, 16, 2, 777, 40); /* the larger shape */
}

/* The CPU router's outputs on grid logits, then aux loss and router backward on both sides. */
static void aux_backward_case(int G, int T, int E, int K, real aux_scale, real z_scale)
{
  const int N = G * T;
  const size_t ne = (size_t)N * E, nk = (size_t)N * K;
  real *logits = xmalloc(ne * sizeof(real)), *probs = xmalloc(ne * sizeof(real));
  real *topw = xmalloc(nk * sizeof(real)), *lse = xmalloc(N * sizeof(real));
  real *dtopw = xmalloc(nk * sizeof(real)), *aux_cpu = xmalloc(G * sizeof(real));
  real *aux_gpu = xmalloc(G * sizeof(real)), *dl_cpu = xmalloc(ne * sizeof(real));
  real *dl_gpu = xmalloc(ne * sizeof(real));
  int *topi = xmalloc(nk * sizeof(int));
  router_logits(logits, ne, E + 3);
  kernel_ops_cpu.moe_router_forward(NULL, probs, topi, topw, lse, logits, N, E, K);
  fill_uniform(dtopw, nk, (uint64_t)N + E, 1.0);
  real *d_probs = dev_upload(probs, ne * sizeof(real)), *d_topw = dev_upload(topw, nk * sizeof(real));
  real *d_lse = dev_upload(lse, N * sizeof(real)), *d_dtopw = dev_upload(dtopw, nk * sizeof(real));
  int *d_topi = dev_upload(topi, nk * sizeof(int));
  fill_const(aux_gpu, G, SENTINEL);
  fill_const(dl_gpu, ne, SENTINEL);
  real *d_aux = dev_upload(aux_gpu, G * sizeof(real)), *d_dl = dev_upload(dl_gpu, ne * sizeof(real));

  kernel_ops_cpu.moe_aux_loss(NULL, aux_cpu, probs, topi, N, T, E, K);
  kernel_ops_cuda.moe_aux_loss(fixture_ctx, d_aux, d_probs, d_topi, N, T, E, K);
  dev_download(aux_gpu, d_aux, G * sizeof(real));
  CHECK_CUDA_OK();
  /* the CPU's sums in the CPU's order on the same inputs (each P_e over tokens in order, then
   * Σ_e in order): only the fp32 rounding at the end, u each side */
  CHECK(count_far("aux", aux_gpu, aux_cpu, G, 2 * U, 0) == 0);

  kernel_ops_cpu.moe_router_backward(NULL, dl_cpu, dtopw, probs, topi, topw, lse, N, T, E, K, aux_scale,
                                     z_scale);
  kernel_ops_cuda.moe_router_backward(fixture_ctx, d_dl, d_dtopw, d_probs, d_topi, d_topw, d_lse, N, T, E,
                                      K, aux_scale, z_scale);
  dev_download(dl_gpu, d_dl, ne * sizeof(real));
  CHECK_CUDA_OK();
  /* the CPU's row formula, in double, in its order, on the same inputs; the device may contract
   * a double multiply-add into an FMA (a difference of 2^-53 relative to the term), over the
   * row's Σ_e of E terms each below M = 1000 (dp ≤ 2/S with S = Σ_k p ≥ K/E, so ≤ E = 300):
   * E·2^-53·M ≤ 3.4e-11 before one fp32 rounding each side: |Δ| ≤ 2u·|ref| + 1e-10 */
  CHECK_MSG(count_far("dlogits", dl_gpu, dl_cpu, ne, 2 * U, 1e-10) == 0, "G %d T %d E %d K %d", G, T, E, K);

  dev_free(d_probs), dev_free(d_topw), dev_free(d_lse), dev_free(d_dtopw), dev_free(d_topi),
      dev_free(d_aux), dev_free(d_dl);
  free(logits), free(probs), free(topw), free(lse), free(dtopw), free(aux_cpu), free(aux_gpu),
      free(dl_cpu), free(dl_gpu), free(topi);
}

static void test_moe_aux_router_backward(void)
{
  aux_backward_case(3, 45, 6, 2, 0.01f, 0.001f);
  aux_backward_case(1, 7, 3, 1, 1.0f, 0.0f);     /* top-1: topw ≡ 1 */
  aux_backward_case(5, 17, 300, 2, 0.1f, 0.01f); /* E over the aux kernel's 256 threads */
  aux_backward_case(8, 512, 64, 2, 0.01f, 0.001f); /* the larger shape */
}

int main(void)
{
  cuda_test_open();
  static const struct test_case t[] = {
    TEST(test_crossentropy),         TEST(test_crossentropy_shards),
    TEST(test_moe_router_forward),   TEST(test_moe_route),
    TEST(test_moe_dispatch_combine), TEST(test_moe_aux_router_backward),
  };
  return test_run_all(t, (int)(sizeof t / sizeof t[0]));
}
