/* The sparse MLP of a mixture-of-experts layer (model.moe, docs/moe.md): the router, the
 * routing, the experts' SwiGLU products on the dispatched rows, and the combine, forward and
 * backward, on the model's kernel table (kernels/ops.h, "mixture of experts"). The host reads one
 * small thing per forward: the kept rows per expert, which size the experts' products. */
#include <stdio.h>
#include <string.h>

#include "model.h"
#include "runtime/hostview.h"

size_t model_moe_rows(const struct model *m, int B, int T)
{
  const struct plan_moe *e = &m->config.moe;
  if (e->experts <= 0)
    return 0;
  const size_t all = (size_t)B * T * e->top_k;
  const int cap = plan_moe_capacity(&m->config, T);
  const size_t kept = (size_t)B * e->experts * cap;
  return cap > 0 && kept < all ? kept : all;
}

void model_moe_stats_reset(struct model *m)
{
  const int E = m->config.moe.experts;
  for (int l = 0; m->moe_stat && l < m->config.n_layers; l++) {
    struct model_moe_stat *s = &m->moe_stat[l];
    long long *routed = s->routed;
    memset(s, 0, sizeof *s);
    s->routed = routed;
    memset(routed, 0, (size_t)E * sizeof *routed);
  }
}

/* n (E) ints of backend memory to the host. */
static void ints_to_host(const struct model *m, int *dst, const int *src, int n)
{
  int *v = hostview_open(m->k, m->kctx, src, (size_t)n * sizeof(int), 1);
  if (v)
    memcpy(dst, v, (size_t)n * sizeof(int));
  else
    memset(dst, 0, (size_t)n * sizeof(int)); /* no host memory: no rows (never on the CPU) */
  hostview_close(m->k, m->kctx, (void *)src, v, (size_t)n * sizeof(int), 0);
}

void model_moe_forward(struct model *m, struct model_acts *a, int layer, const real *x, real *out)
{
  const struct plan_model *c = &m->config;
  const int B = a->B, T = a->T, N = B * T, C = c->dim;
  const int E = c->moe.experts, K = c->moe.top_k, Fe = c->moe.ffn_dim;
  const struct model_layer_weights *w = &m->layers[layer];
  struct model_layer_acts *la = &a->layers[layer];
  const struct kernel_ops *k = m->k;
  void *ctx = m->kctx;
  int counts[MODEL_MOE_MAX_EXPERTS];

  k->linear_forward(ctx, a->moe_logits, x, w->router, N, C, E);
  k->moe_router_forward(ctx, la->moe_probs, la->moe_topi, la->moe_topw, la->moe_lse, a->moe_logits,
                        N, E, K);
  k->moe_route(ctx, la->moe_slot, la->moe_counts, la->moe_routed, la->moe_topi, N, T, E, K,
               plan_moe_capacity(c, T));
  ints_to_host(m, counts, la->moe_counts, E);
  k->moe_dispatch(ctx, la->moe_xe, x, la->moe_slot, N, K, C);
  size_t off = 0;
  for (int e = 0; e < E; e++) {
    const int n = counts[e];
    if (n == 0)
      continue;
    real *g = la->gate + off * Fe, *u = la->up + off * Fe, *h = la->hidden + off * Fe;
    const real *xe = la->moe_xe + off * C;
    k->linear_forward(ctx, g, xe, w->w1[e], n, C, Fe);
    k->linear_forward(ctx, u, xe, w->w3[e], n, C, Fe);
    k->swiglu_forward(ctx, h, g, u, (size_t)n * Fe);
    k->linear_forward(ctx, la->moe_ye + off * C, h, w->w2[e], n, Fe, C);
    off += (size_t)n;
  }
  k->moe_combine(ctx, out, la->moe_ye, la->moe_slot, la->moe_topw, N, K, C);

  if (m->moe_collect && m->moe_stat) {
    struct model_moe_stat *s = &m->moe_stat[layer];
    int routed[MODEL_MOE_MAX_EXPERTS];
    k->moe_aux_loss(ctx, a->moe_aux, la->moe_probs, la->moe_topi, N, T, E, K);
    s->aux += hostview_sum(k, ctx, a->moe_aux, (size_t)B);
    s->z += k->sumsq(ctx, la->moe_lse, (size_t)N);
    ints_to_host(m, routed, la->moe_routed, E);
    for (int e = 0; e < E; e++) s->routed[e] += routed[e];
    s->sequences += B;
    s->tokens += N;
    s->assigned += (long long)N * K;
    s->dropped += (long long)N * K - (long long)off;
  }
}

void model_moe_backward(struct model *m, struct model_acts *a, int layer, const real *x,
                        const real *dout, real *dx, real *tmp)
{
  const struct plan_model *c = &m->config;
  const int B = a->B, T = a->T, N = B * T, C = c->dim;
  const int E = c->moe.experts, K = c->moe.top_k, Fe = c->moe.ffn_dim;
  const struct model_layer_weights *w = &m->layers[layer];
  const struct model_layer_weights *g = &m->layer_grads[layer];
  const struct model_layer_acts *la = &a->layers[layer];
  const struct kernel_ops *k = m->k;
  void *ctx = m->kctx;
  int counts[MODEL_MOE_MAX_EXPERTS];
  (void)B;

  ints_to_host(m, counts, la->moe_counts, E);
  k->moe_combine_backward(ctx, a->moe_dye, a->moe_dtopw, dout, la->moe_ye, la->moe_slot,
                          la->moe_topw, N, K, C);
  size_t off = 0;
  for (int e = 0; e < E; e++) {
    const int n = counts[e];
    if (n == 0)
      continue;
    const size_t f = off * Fe, r = off * C;
    k->linear_backward(ctx, a->moe_dhid + f, g->w2[e], a->moe_dye + r, la->hidden + f, w->w2[e], n,
                       Fe, C);
    k->swiglu_backward(ctx, a->moe_dgate + f, a->moe_dup + f, a->moe_dhid + f, la->gate + f,
                       la->up + f, (size_t)n * Fe);
    k->linear_backward(ctx, a->moe_dxe + r, g->w1[e], a->moe_dgate + f, la->moe_xe + r, w->w1[e], n,
                       C, Fe);
    /* the rows' output gradient is spent: their up-projection's input gradient goes there */
    k->linear_backward(ctx, a->moe_dye + r, g->w3[e], a->moe_dup + f, la->moe_xe + r, w->w3[e], n,
                       C, Fe);
    off += (size_t)n;
  }
  if (off)
    k->residual_forward(ctx, a->moe_dxe, a->moe_dxe, a->moe_dye, off * C);
  k->moe_dispatch_backward(ctx, dx, a->moe_dxe, la->moe_slot, N, K, C);
  /* the router: its weights' gradient, and its share of d/dx. The load-balancing loss is a mean
   * over the global batch's sequences (loss_scale · T = 1/global), the z-loss over its tokens. */
  const real aux_scale = (real)(c->moe.aux_loss * (double)a->loss_scale * T);
  const real z_scale = (real)(c->moe.z_loss * (double)a->loss_scale);
  k->moe_router_backward(ctx, a->moe_logits, a->moe_dtopw, la->moe_probs, la->moe_topi,
                         la->moe_topw, la->moe_lse, N, T, E, K, aux_scale, z_scale);
  k->linear_backward(ctx, tmp, g->router, a->moe_logits, x, w->router, N, C, E);
  k->residual_forward(ctx, dx, dx, tmp, (size_t)N * C);
}
