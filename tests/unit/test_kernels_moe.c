/* The mixture-of-experts kernels (ops.h, kernels/cpu/moe.c) against what they promise:
 *   - the router's softmax, top-k (order, ties), renormalised weights and logsumexp against a
 *     direct computation in double;
 *   - routing against hand-made cases whose slots, counts and routed numbers are worked out in
 *     the comments (capacity 0, 1 and 2, two groups, GShard's k-major priority), and the
 *     layout's invariants on a random case;
 *   - dispatch and combine against their backwards as exact adjoints, and combine's topw
 *     gradient against finite differences;
 *   - the router's backward against central finite differences of
 *     Σ dtopw·topw + aux_scale·Σ aux + z_scale·Σ lse², with the top-k held fixed;
 *   - the load-balancing loss: K for a balanced router, and a hand value;
 *   - the same bits with 1 and 4 threads.
 * Outputs that are assigned start from garbage; rows the contract leaves untouched hold a
 * sentinel that must survive. Finite differences follow test_kernels_grad.c: h = 1e-2 in fp32,
 * 1e-5 in float64, bound FD_ABS_TOL + FD_REL_TOL·|fd| (the argument for those numbers is there;
 * the router's objective is of the same size, a few units per token). */
#include <stdint.h>
#include <stdlib.h>

#include "check.h"
#include "kernels.h"

#define FD_EPS TOL(1e-2f, 1e-5)
#define FD_ABS_TOL TOL(1e-4, 2e-9)
#define FD_REL_TOL TOL(1e-3, 1e-8)
#define GARBAGE 1e3f
#define SENTINEL_SLOT 777

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

static real *filled(size_t n, real value)
{
  real *x = malloc(n * sizeof(real));
  for (size_t i = 0; i < n; i++) x[i] = value;
  return x;
}

static int *filled_int(size_t n, int value)
{
  int *x = malloc(n * sizeof(int));
  for (size_t i = 0; i < n; i++) x[i] = value;
  return x;
}

/* Σ a·b and Σ |a·b| in double. */
static double dot(const real *a, const real *b, size_t n, double *abs_sum)
{
  double s = 0.0, t = 0.0;
  for (size_t i = 0; i < n; i++) {
    s += (double)a[i] * b[i];
    t += fabs((double)a[i] * b[i]);
  }
  if (abs_sum) *abs_sum = t;
  return s;
}

/* Logits whose experts are ≥ 0.4 apart within a row (a shuffled ladder of steps of 0.6, jittered
 * by ±0.1, the row shifted by up to ±2): no perturbation of FD_EPS reorders the top-k. */
static void gapped_logits(real *logits, int N, int E, uint32_t *s)
{
  for (int n = 0; n < N; n++) {
    real *l = logits + (size_t)n * E;
    for (int e = 0; e < E; e++) l[e] = (real)e;
    for (int e = E - 1; e > 0; e--) { /* Fisher-Yates */
      int j = (int)((rnd(s) + 1.0f) * 0.5f * (real)(e + 1));
      j = j > e ? e : j;
      real t = l[e]; l[e] = l[j]; l[j] = t;
    }
    const real shift = 2 * rnd(s);
    for (int e = 0; e < E; e++) l[e] = 0.6f * l[e] + 0.1f * rnd(s) + shift;
  }
}

typedef double (*objective_fn)(void *ctx);

/* grad (n) against central differences of objective with respect to x (n). */
static void check_grad(const char *what, real *x, size_t n, const real *grad,
                       objective_fn objective, void *ctx)
{
  double worst = 0.0, worst_fd = 0.0, worst_an = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < n; i++) {
    real saved = x[i];
    x[i] = saved + FD_EPS;
    real up = x[i];
    double l_up = objective(ctx);
    x[i] = saved - FD_EPS;
    real down = x[i];
    double l_down = objective(ctx);
    x[i] = saved;
    double fd = (l_up - l_down) / ((double)up - down);
    double err = fabs(grad[i] - fd) / (FD_ABS_TOL + FD_REL_TOL * fabs(fd));
    if (!(err <= worst)) { worst = err; worst_i = i; worst_fd = fd; worst_an = grad[i]; }
  }
  objective(ctx); /* leave the outputs as they were */
  CHECK_MSG(worst <= 1.0, "%s[%zu]: analytic %.7g, finite difference %.7g (%.2f of the bound)",
            what, worst_i, worst_an, worst_fd, worst);
  printf("     %s: worst %.3f of the bound\n", what, worst);
}

/* ---- router forward ---- */

/* probs: the exponent's argument l − max is rounded (≤ u·|l − max| ≤ 6u relative on exp here),
 * exp itself (≤ 1u), the sum in double of rounded terms (≤ 1u) and the division's rounding
 * (1u): ≤ 9u, bound 16u relative; Σ probs the same. lse = max + log Σ: bound 8u·(1 + |lse|).
 * topw = p / Σ_k p: the probs' 9u twice plus a rounding, bound 32u relative. */
static void router_forward_case(const real *logits, int N, int E, int K)
{
  real *probs = filled((size_t)N * E, GARBAGE), *topw = filled((size_t)N * K, GARBAGE);
  real *lse = filled(N, GARBAGE);
  int *topi = filled_int((size_t)N * K, SENTINEL_SLOT);
  moe_router_forward(probs, topi, topw, lse, logits, N, E, K);
  int order_ok = 1;
  for (int n = 0; n < N; n++) {
    const real *l = logits + (size_t)n * E;
    const real *p = probs + (size_t)n * E;
    double max = -INFINITY, sum = 0.0, psum = 0.0;
    for (int e = 0; e < E; e++) max = fmax(max, l[e]);
    for (int e = 0; e < E; e++) sum += exp((double)l[e] - max);
    for (int e = 0; e < E; e++) {
      const double ref = exp((double)l[e] - max) / sum;
      CHECK_NEAR(p[e], ref, 16 * REAL_U * ref);
      psum += p[e];
    }
    CHECK_NEAR(psum, 1.0, 16 * REAL_U);
    const double lse_ref = max + log(sum);
    CHECK_NEAR(lse[n], lse_ref, 8 * REAL_U * (1 + fabs(lse_ref)));
    /* The reference order: larger logit first (probabilities follow logits; equal logits give
     * bitwise equal probabilities), the lower index on a tie, by counting who comes before. */
    double wsum = 0.0, pref = 0.0;
    for (int k = 0; k < K; k++) pref += exp((double)l[topi[(size_t)n * K + k]] - max) / sum;
    for (int e = 0; e < E; e++) {
      int rank = 0;
      for (int j = 0; j < E; j++) rank += l[j] > l[e] || (l[j] == l[e] && j < e);
      if (rank < K) order_ok &= topi[(size_t)n * K + rank] == e;
    }
    for (int k = 0; k < K; k++) {
      const int e = topi[(size_t)n * K + k];
      if (e < 0 || e >= E) { order_ok = 0; continue; }
      const double ref = exp((double)l[e] - max) / sum / pref;
      CHECK_NEAR(topw[(size_t)n * K + k], ref, 32 * REAL_U * ref);
      wsum += topw[(size_t)n * K + k];
    }
    CHECK_NEAR(wsum, 1.0, 32 * REAL_U);
  }
  CHECK(order_ok);
  free(probs); free(topw); free(lse); free(topi);
}

static void router_forward_matches_direct_computation(void)
{
  enum { N = 6, E = 5 };
  uint32_t s = 41;
  real logits[N * E];
  gapped_logits(logits, 4, E, &s);
  /* Row 4: experts 1, 2 and 4 tie at the top (bitwise equal probabilities): the top-3 is
   * 1, 2, 4. Row 5: all equal: 0, 1, 2, weights 1/3 each. */
  static const real tied[2 * E] = { 1.0f, 2.0f, 2.0f, 0.5f, 2.0f, 0.3f, 0.3f, 0.3f, 0.3f, 0.3f };
  memcpy(logits + 4 * E, tied, sizeof tied);
  router_forward_case(logits, N, E, 3);
  router_forward_case(logits, N, E, 1);
  router_forward_case(logits, N, E, E); /* K = E: a full sort */

  /* The ties by name, not only through the reference. */
  real probs[N * E], topw[N * 3], lse[N];
  int topi[N * 3];
  moe_router_forward(probs, topi, topw, lse, logits, N, E, 3);
  CHECK(topi[12] == 1 && topi[13] == 2 && topi[14] == 4);
  CHECK(topi[15] == 0 && topi[16] == 1 && topi[17] == 2);
  CHECK(probs[4 * E + 1] == probs[4 * E + 2] && probs[4 * E + 2] == probs[4 * E + 4]);
  CHECK(topw[12] == topw[13] && topw[13] == topw[14]);
  CHECK_NEAR(topw[15], 1.0 / 3, 2 * REAL_U);
}

/* ---- routing ---- */

/* Two groups of T = 4 tokens, E = 3, K = 2. topi rows (first choice, second choice): */
enum { RT_N = 8, RT_T = 4, RT_E = 3, RT_K = 2 };
static const int route_topi[RT_N * RT_K] = {
  0, 1,   0, 2,   1, 0,   0, 1, /* group 0: tokens 0..3 */
  2, 0,   2, 1,   1, 2,   2, 0, /* group 1: tokens 4..7 */
};
/* routed: expert 0 is chosen by tokens 0, 1, 2, 3, 4, 7 (6), expert 1 by 0, 2, 3, 5, 6 (5),
 * expert 2 by 1, 4, 5, 6, 7 (5), whatever the capacity. */
static const int route_routed[RT_E] = { 6, 5, 5 };

static void check_route(int capacity, const int *want_slot, const int *want_counts)
{
  int *slot = filled_int(RT_N * RT_K, SENTINEL_SLOT);
  int *counts = filled_int(RT_E, SENTINEL_SLOT), *routed = filled_int(RT_E, SENTINEL_SLOT);
  moe_route(slot, counts, routed, route_topi, RT_N, RT_T, RT_E, RT_K, capacity);
  for (int i = 0; i < RT_N * RT_K; i++)
    CHECK_MSG(slot[i] == want_slot[i], "capacity %d: slot[%d, %d] = %d, expected %d", capacity,
              i / RT_K, i % RT_K, slot[i], want_slot[i]);
  for (int e = 0; e < RT_E; e++) {
    CHECK_MSG(counts[e] == want_counts[e], "capacity %d: counts[%d] = %d, expected %d", capacity,
              e, counts[e], want_counts[e]);
    CHECK_MSG(routed[e] == route_routed[e], "capacity %d: routed[%d] = %d, expected %d",
              capacity, e, routed[e], route_routed[e]);
  }
  free(slot); free(counts); free(routed);
}

static void route_keeps_the_hand_worked_slots_and_counts(void)
{
  /* Capacity 0 keeps all 16: expert 0's rows 0..5, expert 1's 6..10, expert 2's 11..15, each
   * expert's in token order: e0 ← t0 t1 t2 t3 t4 t7, e1 ← t0 t2 t3 t5 t6, e2 ← t1 t4 t5 t6 t7. */
  static const int slot0[RT_N * RT_K] = { 0, 6,  1, 11,  7, 2,  3, 8,
                                          12, 4,  13, 9,  10, 14,  15, 5 };
  static const int counts0[RT_E] = { 6, 5, 5 };
  check_route(0, slot0, counts0);
  /* Capacity 1, priority first choices then second choices, per group:
   *   group 0, first choices: t0→e0 kept, t1→e0 dropped, t2→e1 kept, t3→e0 dropped;
   *            second choices: t0→e1 dropped (e1 is full with t2's FIRST choice, although t0
   *            comes before t2: the k-major order), t1→e2 kept, t2→e0 and t3→e1 dropped;
   *   group 1 (its own capacity): t4→e2 kept, t5→e2 dropped, t6→e1 kept, t7→e2 dropped;
   *            t4→e0 kept, t5→e1, t6→e2, t7→e0 dropped.
   * Kept: e0 ← t0 t4 (rows 0, 1), e1 ← t2 t6 (2, 3), e2 ← t1 t4 (4, 5); t3, t5, t7 keep none. */
  static const int slot1[RT_N * RT_K] = { 0, -1,  -1, 4,  2, -1,  -1, -1,
                                          5, 1,  -1, -1,  3, -1,  -1, -1 };
  static const int counts1[RT_E] = { 2, 2, 2 };
  check_route(1, slot1, counts1);
  /* Capacity 2: group 0: e0 ← t0, t1 (t3's first choice and t2's second drop), e1 ← t2 (first),
   *   t0 (second) (t3's second drops), e2 ← t1; group 1: e2 ← t4, t5 (t7's FIRST choice drops,
   *   third in line), e1 ← t6, t5, e0 ← t4, t7 (t6's second, to e2, drops).
   * Rows: e0 ← t0 t1 t4 t7 (0..3), e1 ← t0 t2 t5 t6 (4..7), e2 ← t1 t4 t5 (8..10). */
  static const int slot2[RT_N * RT_K] = { 0, 4,  1, 8,  5, -1,  -1, -1,
                                          9, 2,  10, 6,  7, -1,  -1, 3 };
  static const int counts2[RT_E] = { 4, 4, 3 };
  check_route(2, slot2, counts2);
  /* A capacity no group reaches keeps everything, as capacity 0 does. */
  check_route(100, slot0, counts0);
}

/* The layout's invariants on a random routing of G groups: rows unique and in [0, Σ counts),
 * expert-major in token order, each (group, expert) keeping min(chosen, capacity), and a drop
 * only behind `capacity` kept assignments of higher priority (k-major, then token order). */
static void check_route_invariants(const int *topi, int N, int T, int E, int K, int capacity)
{
  int *slot = filled_int((size_t)N * K, SENTINEL_SLOT);
  int *counts = filled_int(E, SENTINEL_SLOT), *routed = filled_int(E, SENTINEL_SLOT);
  moe_route(slot, counts, routed, topi, N, T, E, K, capacity);
  int total = 0, kept = 0, ok = 1;
  for (int e = 0; e < E; e++) total += counts[e];
  int *seen = filled_int(total > 0 ? total : 1, 0);
  for (int e = 0; e < E; e++) {
    int chosen = 0;
    for (int i = 0; i < N * K; i++) chosen += topi[i] == e;
    ok &= routed[e] == chosen;
  }
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) {
      const int i = n * K + k, e = topi[i], s = slot[i], g0 = n - n % T;
      int before = 0; /* kept assignments of expert e in this group with higher priority */
      for (int k2 = 0; k2 <= k; k2++)
        for (int n2 = g0; n2 < (k2 < k ? g0 + T : n); n2++)
          before += topi[n2 * K + k2] == e && slot[n2 * K + k2] >= 0;
      if (s < 0) {
        ok &= s == -1 && capacity > 0 && before == capacity;
        continue;
      }
      kept++;
      ok &= capacity == 0 || before < capacity;
      ok &= s < total && seen[s] == 0;
      if (s >= total) continue;
      seen[s] = 1;
      int off = 0;
      for (int e2 = 0; e2 < e; e2++) off += counts[e2];
      ok &= s >= off && s < off + counts[e];
      /* token order within the expert: its row is the number of earlier tokens it keeps */
      int earlier = 0;
      for (int n2 = 0; n2 < n; n2++)
        for (int k2 = 0; k2 < K; k2++) earlier += topi[n2 * K + k2] == e && slot[n2 * K + k2] >= 0;
      ok &= s == off + earlier;
    }
  CHECK_MSG(ok, "capacity %d: the layout's invariants", capacity);
  CHECK(kept == total);
  if (capacity == 0) CHECK(total == N * K);
  free(slot); free(counts); free(routed); free(seen);
}

static void route_layout_invariants_on_random_choices(void)
{
  enum { N = 48, T = 12, E = 5, K = 3 };
  uint32_t s = 43;
  real logits[N * E], probs[N * E], topw[N * K], lse[N];
  int topi[N * K];
  for (int i = 0; i < N * E; i++) logits[i] = rnd(&s);
  for (int i = 0; i < 2 * E; i++) logits[i] += 2.0f * (real)(i % E == 1); /* a popular expert */
  for (int n = 0; n < N; n++) logits[n * E + 1] += 0.8f;
  moe_router_forward(probs, topi, topw, lse, logits, N, E, K);
  for (int capacity = 0; capacity <= 8; capacity++)
    check_route_invariants(topi, N, T, E, K, capacity);
}

/* ---- dispatch and combine ---- */

/* Routes the hand case with `capacity`; R = Σ counts. */
static int route_hand(int *slot, int capacity)
{
  int counts[RT_E], routed[RT_E];
  moe_route(slot, counts, routed, route_topi, RT_N, RT_T, RT_E, RT_K, capacity);
  return counts[0] + counts[1] + counts[2];
}

/* The identities compare two sums of the same products, each side rounded in `real` once per
 * product and per term of a K-long sum: bound 8u·Σ|terms|. */
static void dispatch_is_the_adjoint_of_its_backward(void)
{
  enum { C = 5, SPARE = 2 }; /* SPARE rows past R that nothing may write */
  for (int capacity = 0; capacity <= 1; capacity++) {
    int slot[RT_N * RT_K];
    const int R = route_hand(slot, capacity);
    uint32_t s = 44 + capacity;
    real *x = rand_buf(RT_N * C, 1, &s), *dxe = rand_buf((size_t)(R + SPARE) * C, 1, &s);
    real *xe = filled((size_t)(R + SPARE) * C, GARBAGE), *dx = filled(RT_N * C, GARBAGE);
    moe_dispatch(xe, x, slot, RT_N, RT_K, C);
    moe_dispatch_backward(dx, dxe, slot, RT_N, RT_K, C);
    int copied = 1, untouched = 1, zero = 1;
    for (int i = 0; i < RT_N * RT_K; i++)
      if (slot[i] >= 0)
        copied &= memcmp(xe + (size_t)slot[i] * C, x + (size_t)(i / RT_K) * C,
                         C * sizeof(real)) == 0;
    for (int i = R * C; i < (R + SPARE) * C; i++) untouched &= xe[i] == GARBAGE;
    for (int n = 0; n < RT_N; n++)
      if (slot[n * RT_K] < 0 && slot[n * RT_K + 1] < 0)
        for (int c = 0; c < C; c++) zero &= dx[n * C + c] == 0.0f;
    CHECK(copied);
    CHECK(untouched);
    CHECK(zero); /* capacity 1: tokens 3, 5 and 7 keep no assignment */
    double abs_a, abs_b;
    const double a = dot(xe, dxe, (size_t)R * C, &abs_a), b = dot(x, dx, RT_N * C, &abs_b);
    CHECK_NEAR(a, b, 8 * REAL_U * (abs_a + abs_b));
    free(x); free(dxe); free(xe); free(dx);
  }
}

enum { CB_C = 6 };
struct combine_ctx { real *out, *ye, *topw, *dout; const int *slot; };
static double combine_objective(void *p)
{
  struct combine_ctx *c = p;
  moe_combine(c->out, c->ye, c->slot, c->topw, RT_N, RT_K, CB_C);
  return dot(c->out, c->dout, RT_N * CB_C, NULL);
}

static void combine_is_the_adjoint_of_its_backward(void)
{
  enum { SPARE = 2 };
  for (int capacity = 0; capacity <= 2; capacity++) {
    int slot[RT_N * RT_K];
    const int R = route_hand(slot, capacity);
    uint32_t s = 47 + capacity;
    struct combine_ctx c = { filled(RT_N * CB_C, GARBAGE), rand_buf((size_t)R * CB_C, 1, &s),
                             rand_buf(RT_N * RT_K, 1, &s), rand_buf(RT_N * CB_C, 1, &s), slot };
    real *dye = filled((size_t)(R + SPARE) * CB_C, GARBAGE);
    real *dtopw = filled(RT_N * RT_K, GARBAGE);
    const double l = combine_objective(&c);
    moe_combine_backward(dye, dtopw, c.dout, c.ye, slot, c.topw, RT_N, RT_K, CB_C);
    /* ⟨combine(ye), dout⟩ = ⟨ye, dye⟩ (linear in ye) = Σ topw·dtopw (linear in topw). */
    double abs_l, abs_y, abs_w;
    dot(c.out, c.dout, RT_N * CB_C, &abs_l);
    const double y = dot(c.ye, dye, (size_t)R * CB_C, &abs_y);
    const double w = dot(c.topw, dtopw, RT_N * RT_K, &abs_w);
    CHECK_NEAR(l, y, 8 * REAL_U * (abs_l + abs_y));
    CHECK_NEAR(l, w, 8 * REAL_U * (abs_l + abs_w));
    int untouched = 1, zero = 1;
    for (int i = R * CB_C; i < (R + SPARE) * CB_C; i++) untouched &= dye[i] == GARBAGE;
    for (int i = 0; i < RT_N * RT_K; i++)
      if (slot[i] < 0) zero &= dtopw[i] == 0.0f;
    for (int n = 0; n < RT_N; n++)
      if (slot[n * RT_K] < 0 && slot[n * RT_K + 1] < 0)
        for (int k = 0; k < CB_C; k++) zero &= c.out[n * CB_C + k] == 0.0f;
    CHECK(untouched);
    CHECK(zero);
    char name[64];
    snprintf(name, sizeof name, "capacity %d: dtopw", capacity);
    check_grad(name, c.topw, RT_N * RT_K, dtopw, combine_objective, &c);
    free(c.out); free(c.ye); free(c.topw); free(c.dout); free(dye); free(dtopw);
  }
}

/* ---- the router's backward ---- */

enum { RB_N = 8, RB_T = 4, RB_E = 5, RB_K = 2 };
struct router_ctx {
  real *logits, *probs, *topw, *lse, *aux, *dtopw;
  int *topi, *topi0, reordered;
  real aux_scale, z_scale;
};
static double router_objective(void *p)
{
  struct router_ctx *c = p;
  moe_router_forward(c->probs, c->topi, c->topw, c->lse, c->logits, RB_N, RB_E, RB_K);
  moe_aux_loss(c->aux, c->probs, c->topi, RB_N, RB_T, RB_E, RB_K);
  c->reordered |= memcmp(c->topi, c->topi0, sizeof(int) * RB_N * RB_K) != 0;
  double l = dot(c->dtopw, c->topw, RB_N * RB_K, NULL);
  for (int g = 0; g < RB_N / RB_T; g++) l += (double)c->aux_scale * c->aux[g];
  for (int n = 0; n < RB_N; n++) l += (double)c->z_scale * c->lse[n] * c->lse[n];
  return l;
}

static void check_router_backward(const char *what, real dtopw_scale, real aux_scale,
                                  real z_scale, uint32_t seed)
{
  uint32_t s = seed;
  struct router_ctx c = { malloc(RB_N * RB_E * sizeof(real)), malloc(RB_N * RB_E * sizeof(real)),
                          malloc(RB_N * RB_K * sizeof(real)), malloc(RB_N * sizeof(real)),
                          malloc(RB_N / RB_T * sizeof(real)),
                          rand_buf(RB_N * RB_K, dtopw_scale, &s),
                          malloc(RB_N * RB_K * sizeof(int)), malloc(RB_N * RB_K * sizeof(int)), 0,
                          aux_scale, z_scale };
  gapped_logits(c.logits, RB_N, RB_E, &s);
  moe_router_forward(c.probs, c.topi0, c.topw, c.lse, c.logits, RB_N, RB_E, RB_K);
  router_objective(&c);
  real *dlogits = filled(RB_N * RB_E, GARBAGE);
  moe_router_backward(dlogits, c.dtopw, c.probs, c.topi, c.topw, c.lse, RB_N, RB_T, RB_E, RB_K,
                      aux_scale, z_scale);
  check_grad(what, c.logits, RB_N * RB_E, dlogits, router_objective, &c);
  CHECK(!c.reordered); /* the top-k never changed under the perturbations */
  /* The gradient is not trivially small: each term moves the logits by its own size. */
  double norm = dot(dlogits, dlogits, RB_N * RB_E, NULL);
  CHECK(norm > 1e-4);
  free(c.logits); free(c.probs); free(c.topw); free(c.lse); free(c.aux); free(c.dtopw);
  free(c.topi); free(c.topi0); free(dlogits);
}

static void router_backward_matches_finite_differences(void)
{
  check_router_backward("dlogits, renormalised weights only", 1, 0, 0, 51);
  check_router_backward("dlogits, aux loss only", 0, 1, 0, 52);
  check_router_backward("dlogits, z-loss only", 0, 0, 0.5f, 53);
  check_router_backward("dlogits, all three", 1, 0.7f, 0.3f, 54);
}

/* ---- the load-balancing loss ---- */

static void aux_loss_is_k_when_balanced_and_matches_a_hand_value(void)
{
  /* Balanced choices (each expert 4 times of 12 in a group), any probabilities:
   * aux = E · Σ_e (K/E) · P_e = K · Σ_e P_e = K. Σ P_e = 1 to the probs' 16u, times K: 64u. */
  enum { T = 6, E = 3, K = 2, G = 2 };
  static const int balanced[G * T * K] = { 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2, 0,
                                           2, 1, 0, 2, 1, 0, 2, 0, 1, 0, 2, 1 };
  uint32_t s = 61;
  real logits[G * T * E], probs[G * T * E], topw[G * T * K], lse[G * T];
  real aux[G] = { GARBAGE, GARBAGE };
  int topi[G * T * K];
  for (int i = 0; i < G * T * E; i++) logits[i] = 2 * rnd(&s);
  moe_router_forward(probs, topi, topw, lse, logits, G * T, E, K);
  moe_aux_loss(aux, probs, balanced, G * T, T, E, K);
  CHECK_NEAR(aux[0], K, 64 * REAL_U);
  CHECK_NEAR(aux[1], K, 64 * REAL_U);
  /* Uniform probabilities, any choices (the router's own): P_e = 1/E, aux = Σ_e f_e = K. */
  for (int i = 0; i < G * T * E; i++) probs[i] = (real)1 / E;
  moe_aux_loss(aux, probs, topi, G * T, T, E, K);
  CHECK_NEAR(aux[0], K, 64 * REAL_U);
  CHECK_NEAR(aux[1], K, 64 * REAL_U);
  /* By hand, E = 3, K = 2, T = 2 (every number exact in binary):
   *   group 0: probs (0.5, 0.25, 0.25), (0.125, 0.625, 0.25); choices (0, 1), (1, 2):
   *     f = (0.5, 1, 0.5), P = (0.3125, 0.4375, 0.25), aux = 3 · 0.71875 = 2.15625;
   *   group 1: probs (0.25, 0.25, 0.5), (0.25, 0.5, 0.25); choices (2, 0), (1, 0):
   *     f = (1, 0.5, 0.5), P = (0.25, 0.375, 0.375), aux = 3 · 0.625 = 1.875. */
  static const real hand_probs[4 * 3] = { 0.5f, 0.25f, 0.25f, 0.125f, 0.625f, 0.25f,
                                          0.25f, 0.25f, 0.5f, 0.25f, 0.5f, 0.25f };
  static const int hand_topi[4 * 2] = { 0, 1, 1, 2, 2, 0, 1, 0 };
  real hand_aux[2] = { GARBAGE, GARBAGE };
  moe_aux_loss(hand_aux, hand_probs, hand_topi, 4, 2, 3, 2);
  CHECK_NEAR(hand_aux[0], 2.15625, 4 * REAL_U);
  CHECK_NEAR(hand_aux[1], 1.875, 4 * REAL_U);
}

/* ---- threads ---- */

struct moe_run { real *probs, *topw, *lse, *out, *dx, *dtopw, *dlogits, *aux; int *topi, *slot; };

static struct moe_run moe_run_with(int n_threads)
{
  enum { N = 512, T = 128, E = 8, K = 2, C = 24, CAP = 40 };
  uint32_t s = 71;
  real *logits = rand_buf(N * E, 2, &s), *x = rand_buf(N * C, 1, &s);
  real *dout = rand_buf(N * C, 1, &s), *dtopw_in = rand_buf(N * K, 1, &s);
  real *xe = malloc((size_t)N * K * C * sizeof(real));
  real *dye = malloc((size_t)N * K * C * sizeof(real));
  struct moe_run r = { malloc(N * E * sizeof(real)), malloc(N * K * sizeof(real)),
                       malloc(N * sizeof(real)), malloc(N * C * sizeof(real)),
                       malloc(N * C * sizeof(real)), malloc(N * K * sizeof(real)),
                       malloc(N * E * sizeof(real)), malloc(N / T * sizeof(real)),
                       malloc(N * K * sizeof(int)), malloc(N * K * sizeof(int)) };
  int counts[E], routed[E];
  kernels_init_cpu(n_threads);
  moe_router_forward(r.probs, r.topi, r.topw, r.lse, logits, N, E, K);
  moe_route(r.slot, counts, routed, r.topi, N, T, E, K, CAP);
  moe_dispatch(xe, x, r.slot, N, K, C);
  moe_combine(r.out, xe, r.slot, r.topw, N, K, C); /* the experts as the identity */
  moe_combine_backward(dye, r.dtopw, dout, xe, r.slot, r.topw, N, K, C);
  moe_dispatch_backward(r.dx, dye, r.slot, N, K, C);
  moe_aux_loss(r.aux, r.probs, r.topi, N, T, E, K);
  moe_router_backward(r.dlogits, dtopw_in, r.probs, r.topi, r.topw, r.lse, N, T, E, K, 0.01f,
                      0.001f);
  kernels_init_cpu(1);
  free(logits); free(x); free(dout); free(dtopw_in); free(xe); free(dye);
  return r;
}

static void moe_kernels_give_the_same_bits_with_1_and_4_threads(void)
{
  enum { N = 512, T = 128, E = 8, K = 2, C = 24 };
  struct moe_run a = moe_run_with(1), b = moe_run_with(4);
  CHECK(memcmp(a.probs, b.probs, N * E * sizeof(real)) == 0);
  CHECK(memcmp(a.topi, b.topi, N * K * sizeof(int)) == 0);
  CHECK(memcmp(a.topw, b.topw, N * K * sizeof(real)) == 0);
  CHECK(memcmp(a.lse, b.lse, N * sizeof(real)) == 0);
  CHECK(memcmp(a.slot, b.slot, N * K * sizeof(int)) == 0);
  CHECK(memcmp(a.out, b.out, N * C * sizeof(real)) == 0);
  CHECK(memcmp(a.dtopw, b.dtopw, N * K * sizeof(real)) == 0);
  CHECK(memcmp(a.dx, b.dx, N * C * sizeof(real)) == 0);
  CHECK(memcmp(a.aux, b.aux, N / T * sizeof(real)) == 0);
  CHECK(memcmp(a.dlogits, b.dlogits, N * E * sizeof(real)) == 0);
  struct moe_run *runs[2] = { &a, &b };
  for (int i = 0; i < 2; i++) {
    struct moe_run *r = runs[i];
    free(r->probs); free(r->topw); free(r->lse); free(r->out); free(r->dx); free(r->dtopw);
    free(r->dlogits); free(r->aux); free(r->topi); free(r->slot);
  }
}

TEST_MAIN(TEST(router_forward_matches_direct_computation),
          TEST(route_keeps_the_hand_worked_slots_and_counts),
          TEST(route_layout_invariants_on_random_choices),
          TEST(dispatch_is_the_adjoint_of_its_backward),
          TEST(combine_is_the_adjoint_of_its_backward),
          TEST(router_backward_matches_finite_differences),
          TEST(aux_loss_is_k_when_balanced_and_matches_a_hand_value),
          TEST(moe_kernels_give_the_same_bits_with_1_and_4_threads))
