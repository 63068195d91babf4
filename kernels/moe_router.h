/* One token's router (ops.h moe_router_forward): softmax over its E logits, the top k in
 * router_before's order, their weights renormalised; the one definition the CPU kernel
 * (kernels/cpu/moe.c) and the CUDA one (kernels/cuda/cuda_loss_moe.cu, a thread per token) run,
 * so both compute the same operations in the same order; and one token's row of the router's
 * backward, likewise. In `real` (real.h). */
#ifndef TYCHO_KERNELS_MOE_ROUTER_H
#define TYCHO_KERNELS_MOE_ROUTER_H
#include <math.h>

#include "philox.h" /* TYCHO_HD */
#include "real.h"

/* Whether expert a comes before expert b in a row's top-k order: larger probability first, the
 * lower index on a tie. */
TYCHO_HD static inline int router_before(const real *p, int a, int b)
{
  return p[a] > p[b] || (p[a] == p[b] && a < b);
}

/* p (E) ← softmax(l), its sum in double; lse ← log Σ exp(l); ti (K) the top k, tw (K) their
 * probabilities over their sum. The k-th choice is the first expert, in router_before's order,
 * among those after the (k−1)-th: a selection in O(K·E) that needs no "taken" flags. */
TYCHO_HD static inline void moe_router_token(real *p, int *ti, real *tw, real *lse, const real *l, int E, int K)
{
  real max = -INFINITY;
  for (int e = 0; e < E; e++) max = l[e] > max ? l[e] : max;
  double sum = 0.0;
  for (int e = 0; e < E; e++) {
    p[e] = real_exp(l[e] - max);
    sum += p[e];
  }
  for (int e = 0; e < E; e++) p[e] = (real)(p[e] / sum);
  *lse = (real)(max + log(sum));
  for (int k = 0; k < K; k++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      if (k > 0 && !router_before(p, ti[k - 1], e))
        continue;
      if (best < 0 || router_before(p, e, best))
        best = e;
    }
    ti[k] = best;
  }
  double s = 0.0;
  for (int k = 0; k < K; k++) s += p[ti[k]];
  for (int k = 0; k < K; k++) tw[k] = (real)(p[ti[k]] / s);
}

/* dlogits of one token from dp = ∂L/∂probs, then the softmax's backward and the z-loss:
 *   dp_e = aux_coef · count_e                       (f_e = count_e / T, held constant)
 *        + (dtopw_m − Σ_k dtopw_k topw_k) / S         when e = topi_m (the renormalisation;
 *                                                     S = Σ_k p[topi_k])
 *   dlogits_e = p_e (dp_e − Σ_e' p_e' dp_e') + z_scale · 2 · lse · p_e.
 * count (E) may be the token's own dlogits row: each element is read before it is written. */
TYCHO_HD static inline void moe_router_backward_row(real *dl, const real *count, const real *dtopw,
                                                    const real *p, const int *ti, const real *tw, double lse,
                                                    int E, int K, double aux_coef, double z_scale)
{
  double s = 0.0, dtw_tw = 0.0;
  for (int k = 0; k < K; k++) {
    s += p[ti[k]];
    dtw_tw += (double)dtopw[k] * tw[k];
  }
  double dot = 0.0;
  for (int e = 0; e < E; e++) {
    double dp = aux_coef * count[e];
    for (int k = 0; k < K; k++)
      if (ti[k] == e) dp += (dtopw[k] - dtw_tw) / s;
    dot += p[e] * dp;
  }
  for (int e = 0; e < E; e++) {
    double dp = aux_coef * count[e];
    for (int k = 0; k < K; k++)
      if (ti[k] == e) dp += (dtopw[k] - dtw_tw) / s;
    dl[e] = (real)(p[e] * (dp - dot) + z_scale * 2.0 * lse * p[e]);
  }
}

#endif
