/* The sparse MLP of a mixture-of-experts layer (model.moe, docs/moe.md): the router, the
 * routing, the experts' SwiGLU products on the dispatched rows, and the combine, forward and
 * backward, on the model's kernel table (kernels/ops.h, "mixture of experts"). The host reads one
 * small thing per forward: the kept rows per expert, which size the experts' products. The
 * router's and the experts' products go through passes_lin_* (model_passes_int.h): fp32, or on a
 * bf16 model each on its input rounded and its weight's bf16 copy. */
#include <stdio.h>
#include <string.h>

#include "runtime/model/model.h"
#include "runtime/model/model_passes_int.h"
#include "comm/comm.h"
#include "runtime/parallel/dcomm.h"
#include "runtime/model/hostview.h"

size_t model_moe_rows(const struct model *m, int B, int T)
{
  return layout_moe_rows(&m->config, B, T);
}

size_t model_moe_rows_received(const struct model *m, int B, int T)
{
  return layout_moe_rows_received(&m->config, m->ep.size, B, T);
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

/* The bf16 copy of layer `layer`'s weight of kind `kind` (of expert e, or −1), or NULL (an fp32
 * model). The layer's parameters lie from its layer_param0 on (layout/params.h). */
static const bf16 *weight_bf16(const struct model *m, int layer, enum model_param_kind kind, int e)
{
  if (!m->bf16)
    return NULL;
  for (int i = m->table.layer_param0[layer]; i < m->n_params; i++) {
    const struct model_param *p = &m->params[i];
    if (p->layer == layer && p->kind == kind && p->expert == e)
      return model_param_bf16(m, p, 0);
    if (p->layer > layer)
      break;
  }
  return NULL;
}

/* Expert e's SwiGLU on n rows: out (n, C) = w2 · (silu(w1 · in) ⊙ (w3 · in)); its gate, up and
 * hidden kept at row `row` of the layer's expert buffers. On a bf16 model (in_b: its input rows in
 * bf16, in unused) the rows are kept in bf16, as Megatron-LM's bf16 experts keep theirs: the w1
 * and w3 products write fp32 into the workspace's moe_dgate and moe_dup (free in forward), rounded
 * once into gate_b and up_b and widened back, so SwiGLU and its backward see the same values;
 * SwiGLU writes hidden_b, w2's input. */
static void experts_forward(struct model *m, struct model_acts *a, int layer, int e, int n,
                            const real *in, const bf16 *in_b, real *out, size_t row)
{
  if (n == 0)
    return;
  const int C = m->config.dim, Fe = m->config.moe.ffn_dim;
  const struct model_layer_weights *w = &m->layers[layer];
  struct model_layer_acts *la = &a->layers[layer];
  const size_t f = row * Fe, nf = (size_t)n * Fe;
  if (m->bf16) {
    const struct kernel_ops *k = m->k;
    real *g = a->moe_dgate + f, *u = a->moe_dup + f;
    passes_lin_fwd_b(m, g, in_b, weight_bf16(m, layer, MODEL_EXPERT_W1, e), n, C, Fe);
    passes_lin_fwd_b(m, u, in_b, weight_bf16(m, layer, MODEL_EXPERT_W3, e), n, C, Fe);
    k->round_bf16(m->kctx, la->gate_b + f, g, nf);
    k->round_bf16(m->kctx, la->up_b + f, u, nf);
    k->widen_bf16(m->kctx, g, la->gate_b + f, nf);
    k->widen_bf16(m->kctx, u, la->up_b + f, nf);
    k->swiglu_forward_bf16(m->kctx, la->hidden_b + f, g, u, nf);
    passes_lin_fwd_b(m, out, la->hidden_b + f, weight_bf16(m, layer, MODEL_EXPERT_W2, e), n, Fe, C);
    return;
  }
  real *g = la->gate + f, *u = la->up + f, *h = la->hidden + f;
  passes_lin_fwd(m, a, g, in, w->w1[e], NULL, n, C, Fe);
  passes_lin_fwd(m, a, u, in, w->w3[e], NULL, n, C, Fe);
  m->k->swiglu_forward(m->kctx, h, g, u, nf);
  passes_lin_fwd(m, a, out, h, w->w2[e], NULL, n, Fe, C);
}

/* Its backward on the same rows: din (n, C) assigned; dout (n, C) is spent (the rows'
 * up-projection input gradient goes there first); the expert's gradients accumulate. A bf16
 * model's SwiGLU backward runs on gate_b and up_b widened into the gradients' own buffers
 * (swiglu_backward in place: ops_list.h). */
static void experts_backward(struct model *m, struct model_acts *a, int layer, int e, int n, real *dout,
                             real *din, const real *in, const bf16 *in_b, size_t row)
{
  if (n == 0)
    return;
  const int C = m->config.dim, Fe = m->config.moe.ffn_dim;
  const struct model_layer_weights *w = &m->layers[layer], *g = &m->layer_grads[layer];
  const struct model_layer_acts *la = &a->layers[layer];
  const struct kernel_ops *k = m->k;
  void *ctx = m->kctx;
  const size_t f = row * Fe, nf = (size_t)n * Fe;
  real *dgate = a->moe_dgate + f, *dup = a->moe_dup + f, *dhid = a->moe_dhid + f;
  if (m->bf16) {
    passes_lin_bwd_b(m, a, dhid, g->w2[e], dout, la->hidden_b + f, weight_bf16(m, layer, MODEL_EXPERT_W2, e), n,
                     Fe, C);
    k->widen_bf16(ctx, dgate, la->gate_b + f, nf);
    k->widen_bf16(ctx, dup, la->up_b + f, nf);
    k->swiglu_backward(ctx, dgate, dup, dhid, dgate, dup, nf);
    passes_lin_bwd_b(m, a, din, g->w1[e], dgate, in_b, weight_bf16(m, layer, MODEL_EXPERT_W1, e), n, C, Fe);
    passes_lin_bwd_b(m, a, dout, g->w3[e], dup, in_b, weight_bf16(m, layer, MODEL_EXPERT_W3, e), n, C, Fe);
  } else {
    passes_lin_bwd(m, a, dhid, g->w2[e], dout, la->hidden + f, w->w2[e], NULL, n, Fe, C);
    k->swiglu_backward(ctx, dgate, dup, dhid, la->gate + f, la->up + f, nf);
    passes_lin_bwd(m, a, din, g->w1[e], dgate, in, w->w1[e], NULL, n, C, Fe);
    passes_lin_bwd(m, a, dout, g->w3[e], dup, in, w->w3[e], NULL, n, C, Fe);
  }
  k->vec_add(ctx, din, din, dout, (size_t)n * C);
}

/* ---- expert parallelism (mesh.ep) -----------------------------------------------------------
 * The kept rows are expert-major, so the block for ep rank r (experts [r·El, (r + 1)·El)) is
 * contiguous. At capacity every expert's block is padded to B · capacity rows (zero rows give
 * zero outputs and add nothing to the gradients), so every exchange has the plan's size and
 * `check` states the traffic exactly; dropless, the ranks first exchange how many rows of each
 * of the receiver's experts they send. The receiver keeps its rows source-major, then expert. */

static void ep_failed(struct model *m, const char *what)
{
  char msg[256]; /* the bound the model's messages had */
  snprintf(msg, sizeof msg, "expert parallelism: %s: %s", what, comm_error());
  fault_set(FAULT_OF(&m->tp), FAULT_LEVEL_MODEL, "%s", msg);
}

/* dst: each expert's counts[e] rows of src (expert-major, packed) at e · P, the rest of its P
 * rows zero; or the inverse (unpad). */
static void pad_rows(const struct model *m, real *dst, const real *src, const int *counts, int P, int unpad)
{
  const int C = m->config.dim, E = m->config.moe.experts;
  size_t at = 0;
  for (int e = 0; e < E; e++) {
    real *padded = (real *)(unpad ? src : dst) + (size_t)e * P * C;
    real *packed = (real *)(unpad ? dst : src) + at * C;
    const size_t bytes = (size_t)counts[e] * C * sizeof(real);
    if (unpad) {
      if (bytes)
        m->k->copy(m->kctx, packed, padded, bytes);
    } else {
      if (bytes)
        m->k->copy(m->kctx, padded, packed, bytes);
      if (counts[e] < P)
        m->k->zero(m->kctx, padded + (size_t)counts[e] * C, (size_t)(P - counts[e]) * C * sizeof(real));
    }
    at += (size_t)counts[e];
  }
}

/* The exchange's element counts per peer: what this rank sends (sent[e] rows of each expert) and
 * receives (rows[s · El + j] of its j-th expert from ep rank s). */
static void ep_sizes(const struct model *m, const int *sent, const int *rows, size_t *send_n, size_t *recv_n)
{
  const int C = m->config.dim, ep = m->ep.size, El = m->config.moe.experts / ep;
  for (int r = 0; r < ep; r++) {
    send_n[r] = recv_n[r] = 0;
    for (int j = 0; j < El; j++) {
      send_n[r] += (size_t)sent[r * El + j] * C;
      recv_n[r] += (size_t)rows[r * El + j] * C;
    }
  }
}

/* Rows of each expert in this rank's send buffer: the kept rows, or B · capacity padded. */
static int ep_sent(const struct model *m, const struct model_acts *a, const int *counts, int *sent)
{
  const int cap = plan_moe_capacity(&m->config, a->T), E = m->config.moe.experts;
  for (int e = 0; e < E; e++) sent[e] = cap > 0 ? a->B * cap : counts[e];
  return cap > 0 ? a->B * cap : 0;
}

/* One exchange of rows over the ep group: send_n[r] elements of send to rank r, recv_n[r] from it
 * into recv. A bf16 model moves them in bf16 (the ep wire, as the tp conversions move theirs):
 * rounded once into moe_wire_out, received in recv_b where given (the dispatch: the experts' bf16
 * inputs, kept so), else in moe_wire_in and widened into recv. 0 on success. */
static int ep_exchange(struct model *m, struct model_acts *a, const real *send, const size_t *send_n, real *recv,
                       bf16 *recv_b, const size_t *recv_n)
{
  if (!m->bf16)
    return dcomm_all_to_all_v(DCOMM_OF(m), m->ep.group, send, send_n, recv, recv_n, COMM_REAL, NULL);
  size_t n_send = 0, n_recv = 0;
  for (int r = 0; r < m->ep.size; r++) {
    n_send += send_n[r];
    n_recv += recv_n[r];
  }
  m->k->round_bf16(m->kctx, a->moe_wire_out, send, n_send);
  bf16 *in = recv_b ? recv_b : a->moe_wire_in;
  if (dcomm_all_to_all_v(DCOMM_OF(m), m->ep.group, a->moe_wire_out, send_n, in, recv_n, COMM_BF16, NULL))
    return 1;
  if (!recv_b)
    m->k->widen_bf16(m->kctx, recv, in, n_recv);
  return 0;
}

/* The experts' rows under ep: xe, this rank's dispatched rows (the layer's moe_xe, or a bf16
 * model's workspace moe_xw), out to ye (moe_ye, or moe_xw: the combine's input). */
static void ep_experts_forward(struct model *m, struct model_acts *a, int layer, const int *counts, const real *xe,
                               real *ye)
{
  const int C = m->config.dim, E = m->config.moe.experts, ep = m->ep.size, El = E / ep;
  struct model_layer_acts *la = &a->layers[layer];
  int sent[MODEL_MOE_MAX_EXPERTS];
  size_t send_n[MODEL_MOE_MAX_EXPERTS], recv_n[MODEL_MOE_MAX_EXPERTS];
  const int P = ep_sent(m, a, counts, sent);
  const real *send = xe;
  if (P > 0) {
    pad_rows(m, a->moe_pad, xe, counts, P, 0);
    send = a->moe_pad;
  }
  /* A training step's forwards all have the plan's micro-batch, so at capacity every block's size
   * is known; an evaluation's may not (a last, shorter chunk of problems on one rank), so there the
   * ranks say theirs (evaluation is not in a step's traffic). */
  if (P > 0 && a->moe_in_step) {
    for (int i = 0; i < E; i++) la->moe_rows[i] = P;
  } else if (comm_all_to_all(m->ep.group, sent, la->moe_rows, (size_t)El, COMM_INT32, NULL)) {
    ep_failed(m, "the row counts' exchange");
    return;
  }
  ep_sizes(m, sent, la->moe_rows, send_n, recv_n);
  if (ep_exchange(m, a, send, send_n, la->moe_xr, la->moe_x_b, recv_n)) {
    ep_failed(m, "the dispatch");
    return;
  }
  size_t at = 0;
  for (int s = 0; s < ep; s++)
    for (int j = 0; j < El; j++) {
      const int n = la->moe_rows[s * El + j];
      experts_forward(m, a, layer, m->ep.rank * El + j, n, la->moe_xr ? la->moe_xr + at * C : NULL,
                      la->moe_x_b ? la->moe_x_b + at * C : NULL, a->moe_yr + at * C, at);
      at += (size_t)n;
    }
  if (ep_exchange(m, a, a->moe_yr, recv_n, P > 0 ? a->moe_pad : ye, NULL, send_n)) {
    ep_failed(m, "the combine");
    return;
  }
  if (P > 0)
    pad_rows(m, ye, a->moe_pad, counts, P, 1);
}

static void ep_experts_backward(struct model *m, struct model_acts *a, int layer, const int *counts)
{
  const int C = m->config.dim, E = m->config.moe.experts, ep = m->ep.size, El = E / ep;
  const struct model_layer_acts *la = &a->layers[layer];
  int sent[MODEL_MOE_MAX_EXPERTS];
  size_t send_n[MODEL_MOE_MAX_EXPERTS], recv_n[MODEL_MOE_MAX_EXPERTS];
  const int P = ep_sent(m, a, counts, sent);
  ep_sizes(m, sent, la->moe_rows, send_n, recv_n);
  const real *send = a->moe_dye;
  if (P > 0) {
    pad_rows(m, a->moe_pad, a->moe_dye, counts, P, 0);
    send = a->moe_pad;
  }
  if (ep_exchange(m, a, send, send_n, a->moe_dyr, NULL, recv_n)) {
    ep_failed(m, "the combine's backward");
    return;
  }
  size_t at = 0;
  for (int s = 0; s < ep; s++)
    for (int j = 0; j < El; j++) {
      const int n = la->moe_rows[s * El + j];
      experts_backward(m, a, layer, m->ep.rank * El + j, n, a->moe_dyr + at * C, a->moe_dxr + at * C,
                       la->moe_xr ? la->moe_xr + at * C : NULL, la->moe_x_b ? la->moe_x_b + at * C : NULL, at);
      at += (size_t)n;
    }
  if (ep_exchange(m, a, a->moe_dxr, recv_n, P > 0 ? a->moe_pad : a->moe_dxe, NULL, send_n)) {
    ep_failed(m, "the dispatch's backward");
    return;
  }
  if (P > 0)
    pad_rows(m, a->moe_dxe, a->moe_pad, counts, P, 1);
}

void model_moe_forward(struct model *m, struct model_acts *a, int layer, const real *x, real *out)
{
  const struct plan_model *c = &m->config;
  const int B = a->B, T = a->T, N = B * T, C = c->dim;
  const int E = c->moe.experts, K = c->moe.top_k;
  const struct model_layer_weights *w = &m->layers[layer];
  struct model_layer_acts *la = &a->layers[layer];
  const struct kernel_ops *k = m->k;
  void *ctx = m->kctx;
  int counts[MODEL_MOE_MAX_EXPERTS];

  passes_lin_fwd(m, a, a->moe_logits, x, w->router, weight_bf16(m, layer, MODEL_ROUTER, -1), N, C, E);
  k->moe_router_forward(ctx, la->moe_probs, la->moe_topi, la->moe_topw, la->moe_lse, a->moe_logits,
                        N, E, K);
  k->moe_route(ctx, la->moe_slot, la->moe_counts, la->moe_routed, la->moe_topi, N, T, E, K,
               plan_moe_capacity(c, T));
  ints_to_host(m, counts, la->moe_counts, E);
  /* a bf16 model dispatches into the workspace and keeps the rows' bf16 rounding (at ep 1; under
   * ep the dispatch's exchange delivers them in bf16), and its combine reads the experts' outputs
   * as kept, moe_ye_b widened, so its backward sees what the forward combined */
  real *xe = m->bf16 ? a->moe_xw : la->moe_xe, *ye = m->bf16 ? a->moe_xw : la->moe_ye;
  k->moe_dispatch(ctx, xe, x, la->moe_slot, N, K, C);
  size_t off = 0; /* kept rows here */
  for (int e = 0; e < E; e++) off += (size_t)counts[e];
  if (m->ep.size > 1) {
    ep_experts_forward(m, a, layer, counts, xe, ye);
  } else {
    if (m->bf16)
      k->round_bf16(ctx, la->moe_x_b, xe, off * C);
    size_t at = 0;
    for (int e = 0; e < E; e++) {
      experts_forward(m, a, layer, e, counts[e], m->bf16 ? NULL : xe + at * C,
                      m->bf16 ? la->moe_x_b + at * C : NULL, ye + at * C, at);
      at += (size_t)counts[e];
    }
  }
  if (m->bf16) {
    k->round_bf16(ctx, la->moe_ye_b, ye, off * C);
    k->widen_bf16(ctx, ye, la->moe_ye_b, off * C);
  }
  k->moe_combine(ctx, out, ye, la->moe_slot, la->moe_topw, N, K, C);

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
  const int E = c->moe.experts, K = c->moe.top_k;
  const struct model_layer_weights *w = &m->layers[layer];
  const struct model_layer_weights *g = &m->layer_grads[layer];
  const struct model_layer_acts *la = &a->layers[layer];
  const struct kernel_ops *k = m->k;
  void *ctx = m->kctx;
  int counts[MODEL_MOE_MAX_EXPERTS];
  (void)B;

  ints_to_host(m, counts, la->moe_counts, E);
  const real *ye = la->moe_ye;
  if (m->bf16) { /* the outputs the forward combined */
    size_t off = 0;
    for (int e = 0; e < E; e++) off += (size_t)counts[e];
    k->widen_bf16(ctx, a->moe_xw, la->moe_ye_b, off * C);
    ye = a->moe_xw;
  }
  k->moe_combine_backward(ctx, a->moe_dye, a->moe_dtopw, dout, ye, la->moe_slot, la->moe_topw, N, K, C);
  if (m->ep.size > 1) {
    ep_experts_backward(m, a, layer, counts);
  } else {
    size_t at = 0;
    for (int e = 0; e < E; e++) {
      experts_backward(m, a, layer, e, counts[e], a->moe_dye + at * C, a->moe_dxe + at * C,
                       m->bf16 ? NULL : la->moe_xe + at * C, m->bf16 ? la->moe_x_b + at * C : NULL, at);
      at += (size_t)counts[e];
    }
  }
  k->moe_dispatch_backward(ctx, dx, a->moe_dxe, la->moe_slot, N, K, C);
  /* the router: its weights' gradient, and its share of d/dx. The load-balancing loss is a mean
   * over the global batch's sequences (loss_scale · T = 1/global), the z-loss over its tokens. */
  const real aux_scale = (real)(c->moe.aux_loss * (double)a->loss_scale * T);
  const real z_scale = (real)(c->moe.z_loss * (double)a->loss_scale);
  k->moe_router_backward(ctx, a->moe_logits, a->moe_dtopw, la->moe_probs, la->moe_topi,
                         la->moe_topw, la->moe_lse, N, T, E, K, aux_scale, z_scale);
  passes_lin_bwd(m, a, tmp, g->router, a->moe_logits, x, w->router, weight_bf16(m, layer, MODEL_ROUTER, -1),
                 N, C, E);
  k->vec_add(ctx, dx, dx, tmp, (size_t)N * C);
}
