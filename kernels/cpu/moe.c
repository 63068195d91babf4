/* Mixture of experts: the router's softmax and top-k, the routing of assignments to rows of the
 * experts' buffer (capacity and dropping), dispatch and combine with their duals, the
 * load-balancing loss and the router's backward. The contracts are in ops.h; docs/moe.md tells
 * the layer they make.
 *
 * Kernels never allocate, and several of these would want a small array of E counters: instead
 * moe_route keeps its per-group counters in counts (rebuilt once the slots are known), and
 * moe_router_backward keeps a group's expert counts in the dlogits row of the group's first
 * token, which it finishes last. Rows (tokens) are independent in the router, dispatch and
 * combine and are split over OpenMP threads; each thread owns whole rows and every sum runs in
 * one fixed order, so the bits do not depend on the thread count. */
#include <math.h>

#include "kernels.h"
#include "moe_router.h"

void moe_router_forward(real *probs, int *topi, real *topw, real *lse, const real *logits, int N,
                        int E, int K)
{
#pragma omp parallel for
  for (int n = 0; n < N; n++)
    moe_router_token(probs + (size_t)n * E, topi + (size_t)n * K, topw + (size_t)n * K, lse + n,
                     logits + (size_t)n * E, E, K);
}

/* Sequential: a group's priority order decides which assignments fit, and the expert-major rows
 * are numbered in token order over all groups. O(N·K + G·E). */
void moe_route(int *slot, int *counts, int *routed, const int *topi, int N, int T, int E, int K,
               int capacity)
{
  for (int e = 0; e < E; e++) routed[e] = 0;
  for (size_t i = 0; i < (size_t)N * K; i++) routed[topi[i]]++;
  /* 1. Which assignments are kept: slot 0 marks kept, −1 dropped. counts holds the group's
   *    kept assignments per expert while the group is walked in priority order (k-major). */
  const int group = T > 0 ? T : N; /* T ≤ 0 is outside the contract: one group then */
  for (int g0 = 0; g0 < N; g0 += group) {
    const int g1 = g0 + group < N ? g0 + group : N;
    for (int e = 0; e < E; e++) counts[e] = 0;
    for (int k = 0; k < K; k++)
      for (int n = g0; n < g1; n++) {
        const size_t i = (size_t)n * K + k;
        const int e = topi[i];
        if (capacity > 0 && counts[e] >= capacity) {
          slot[i] = -1;
        } else {
          counts[e]++;
          slot[i] = 0;
        }
      }
  }
  /* 2. counts ← kept per expert over all groups, then their exclusive prefix sums: each
   *    expert's next row. Tokens are walked in order, so an expert's rows are in token order. */
  for (int e = 0; e < E; e++) counts[e] = 0;
  for (size_t i = 0; i < (size_t)N * K; i++)
    if (slot[i] == 0) counts[topi[i]]++;
  int row = 0;
  for (int e = 0; e < E; e++) {
    const int kept = counts[e];
    counts[e] = row;
    row += kept;
  }
  for (size_t i = 0; i < (size_t)N * K; i++)
    if (slot[i] == 0) slot[i] = counts[topi[i]]++;
  /* 3. counts[e] is now expert e's end row, off_e + kept_e: back to kept_e. */
  for (int e = E - 1; e > 0; e--) counts[e] -= counts[e - 1];
}

void moe_dispatch(real *xe, const real *x, const int *slot, int N, int K, int C)
{
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const real *xn = x + (size_t)n * C;
    for (int k = 0; k < K; k++) {
      const int s = slot[(size_t)n * K + k];
      if (s < 0) continue;
      real *row = xe + (size_t)s * C;
      for (int c = 0; c < C; c++) row[c] = xn[c];
    }
  }
}

void moe_dispatch_backward(real *dx, const real *dxe, const int *slot, int N, int K, int C)
{
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    real *d = dx + (size_t)n * C;
    for (int c = 0; c < C; c++) d[c] = 0.0f;
    for (int k = 0; k < K; k++) {
      const int s = slot[(size_t)n * K + k];
      if (s < 0) continue;
      const real *row = dxe + (size_t)s * C;
      for (int c = 0; c < C; c++) d[c] += row[c];
    }
  }
}

void moe_combine(real *out, const real *ye, const int *slot, const real *topw, int N, int K, int C)
{
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    real *o = out + (size_t)n * C;
    for (int c = 0; c < C; c++) o[c] = 0.0f;
    for (int k = 0; k < K; k++) {
      const size_t i = (size_t)n * K + k;
      if (slot[i] < 0) continue;
      const real *row = ye + (size_t)slot[i] * C;
      const real w = topw[i];
      for (int c = 0; c < C; c++) o[c] += w * row[c];
    }
  }
}

void moe_combine_backward(real *dye, real *dtopw, const real *dout, const real *ye,
                          const int *slot, const real *topw, int N, int K, int C)
{
#pragma omp parallel for
  for (int n = 0; n < N; n++) {
    const real *d = dout + (size_t)n * C;
    for (int k = 0; k < K; k++) {
      const size_t i = (size_t)n * K + k;
      if (slot[i] < 0) {
        dtopw[i] = 0.0f;
        continue;
      }
      const real *y = ye + (size_t)slot[i] * C;
      real *dy = dye + (size_t)slot[i] * C;
      const real w = topw[i];
      double dot = 0.0;
      for (int c = 0; c < C; c++) {
        dot += (double)d[c] * y[c];
        dy[c] = w * d[c];
      }
      dtopw[i] = (real)dot;
    }
  }
}

/* Per expert, its count over the group's choices and its column of probabilities: O(E·T·K) a
 * group, no counters to keep. */
void moe_aux_loss(real *aux, const real *probs, const int *topi, int N, int T, int E, int K)
{
  const int G = T > 0 ? N / T : 0;
#pragma omp parallel for
  for (int g = 0; g < G; g++) {
    const size_t n0 = (size_t)g * T;
    double sum = 0.0;
    for (int e = 0; e < E; e++) {
      long chosen = 0;
      double p = 0.0;
      for (size_t n = n0; n < n0 + (size_t)T; n++) {
        for (int k = 0; k < K; k++) chosen += topi[n * K + k] == e;
        p += probs[n * E + e];
      }
      sum += (double)chosen * p;
    }
    aux[g] = (real)(E * sum / ((double)T * T));
  }
}


void moe_router_backward(real *dlogits, const real *dtopw, const real *probs, const int *topi,
                         const real *topw, const real *lse, int N, int T, int E, int K,
                         real aux_scale, real z_scale)
{
  if (T <= 0) return; /* outside the contract (N = G·T) */
  const int G = N / T;
  /* ∂(aux_scale · aux_g)/∂p[n, e] = aux_scale · E · f_e / T = aux_coef · count_e. */
  const double aux_coef = (double)aux_scale * E / ((double)T * T);
  /* 1. Each group's expert counts (exact small integers) in its first token's row. */
#pragma omp parallel for
  for (int g = 0; g < G; g++) {
    const size_t n0 = (size_t)g * T;
    real *count = dlogits + n0 * E;
    for (int e = 0; e < E; e++) count[e] = 0.0f;
    for (size_t i = n0 * K; i < (n0 + T) * K; i++) count[topi[i]] += 1.0f;
  }
  /* 2. Every token but the groups' first ones, reading its group's counts. */
#pragma omp parallel for
  for (int n = 0; n < G * T; n++) {
    if (n % T == 0) continue;
    const size_t n0 = (size_t)(n - n % T);
    moe_router_backward_row(dlogits + (size_t)n * E, dlogits + n0 * E, dtopw + (size_t)n * K,
                        probs + (size_t)n * E, topi + (size_t)n * K, topw + (size_t)n * K, lse[n],
                        E, K, aux_coef, z_scale);
  }
  /* 3. The first tokens, over their counts. */
#pragma omp parallel for
  for (int g = 0; g < G; g++) {
    const size_t n0 = (size_t)g * T;
    moe_router_backward_row(dlogits + n0 * E, dlogits + n0 * E, dtopw + n0 * K, probs + n0 * E,
                        topi + n0 * K, topw + n0 * K, lse[n0], E, K, aux_coef, z_scale);
  }
}
