/* One token's router (ops.h moe_router_forward): softmax over its E logits, the top k in
 * router_before's order, their weights renormalised; the one definition the CPU kernel
 * (kernels/cpu/moe.c) and the CUDA one (kernels/cuda/cuda_loss_moe.cu, a thread per token) run,
 * so both compute the same operations in the same order. In `real` (real.h). */
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

#endif
