/* The split backward's two halves (struct model_split, model.h): what B keeps of each linear's
 * weight-gradient product and how W runs it.
 *
 * A whole backward computes each linear's two gradients in one kernel call, linear_backward (or
 * linear_backward_bf16): dinp = dout · w, then dweight += doutᵀ · in, two products the kernel
 * runs one after the other. Under B the call runs with dweight NULL (the first product alone,
 * the same call) after dout — the output gradient, which a workspace buffer holds only until
 * the next product — is copied into the micro-batch's held memory; W later calls the kernel with
 * dinp NULL on that copy, the same `in` (the linear's input, saved in the micro-batch's slot) and
 * the same dweight (the second product alone). Same operands, same kernel, and each weight's
 * gradient still gains one product per micro-batch in micro-batch order (W's order is B's), so
 * the gradients are the whole backward's bit for bit.
 *
 * A tied embedding whose head is on the same model (pipeline rank) gets two additions per
 * micro-batch into one gradient, the head's product and then the embedding's rows; B then
 * keeps the embedding's input gradient too (dresidual, as the rows' kernel reads it) and W adds
 * it after the head's product, in the whole backward's order. An untied embedding's rows stay
 * in B, and so do a tied one's at tp > 1 (before the head's W product: the same sum in another
 * order).
 *
 * A layer whose recompute policy discarded a linear's input (it then lives in the recompute
 * area every layer and slot share) recomputes it again before its W, as B did before its
 * backward: the same forward pieces from the same saved inputs, so the same bits.
 *
 * At tp > 1 a product's input is often the workspace's (a norm output gathered under sequence
 * parallelism, a conversion between the tp layouts, a bf16 model's rounding in in_b), which the
 * next product overwrites: B holds a copy of every product's input beside its output gradient
 * (the bill counts both, layout_split_held_elems), and W reads the copies and recomputes
 * nothing, so it runs no collective. */
#include <stdlib.h>
#include <string.h>

#include "runtime/model/alloc.h"
#include "runtime/model/model_passes_int.h"

int model_split_open(struct model_split *s, const struct model *m, size_t cap, int cap_products)
{
  memset(s, 0, sizeof *s);
  s->held = cap ? alloc_bytes_on(m->device, ALLOC_ACTIVATIONS, cap) : NULL;
  s->products = calloc(cap_products > 0 ? (size_t)cap_products : 1, sizeof *s->products);
  if ((cap && !s->held) || !s->products) {
    model_split_close(s);
    return -1;
  }
  s->cap = cap;
  s->cap_products = cap_products;
  return 0;
}

void model_split_close(struct model_split *s)
{
  alloc_free(s->held);
  free(s->products);
  memset(s, 0, sizeof *s);
}

/* The parameter whose gradient holds dw (and where), so W finds it as the gradients are bound then. */
static int grad_home(const struct model *m, const real *dw, size_t *off)
{
  for (int i = 0; dw && i < m->n_params; i++) {
    const struct model_param *p = &m->params[i];
    if (p->grad && dw >= p->grad && dw < p->grad + p->n_elems) {
      *off = (size_t)(dw - p->grad);
      return i;
    }
  }
  *off = 0;
  return -1;
}

/* Where W writes product p's weight gradient. */
static real *grad_now(const struct model *m, const struct model_split_product *p)
{
  return p->param >= 0 && m->params[p->param].grad ? m->params[p->param].grad + p->off : p->dweight;
}

int passes_split_keep(struct model *m, struct model_acts *a, real *dweight, const void *dout, int bf16_product,
                      const void *in, const void *w, int N, int IC, int OC)
{
  struct model_split *s = a->split;
  if (!s || s->phase != MODEL_SPLIT_B)
    return 0;
  const size_t elem = bf16_product ? sizeof(bf16) : sizeof(real);
  const size_t bytes = (size_t)N * OC * elem;
  /* at tp > 1 the input too: there it is the workspace's (a conversion, a gathered norm output,
   * a rounding), gone by W; once for the products of one norm output that read it in the same
   * layout (q, k and v; gate and up), as layout_split_held_elems counts it */
  const void *key = s->in_src ? s->in_src : in;
  size_t in_bytes = m->tp.size > 1 ? (size_t)N * IC * elem : 0;
  for (int i = s->n_products - 1; in_bytes && i >= 0 && s->products[i].layer == s->layer &&
                                  s->products[i].group == s->group; i--) {
    const struct model_split_product *q = &s->products[i];
    if (q->key == key && q->N == N && q->IC == IC && q->bf16 == bf16_product) {
      in = q->in;
      in_bytes = 0;
    }
  }
  if (s->n_products >= s->cap_products || bytes + in_bytes > s->cap - s->used) { /* the layout's count is wrong */
    fault_set(FAULT_OF(&m->tp), FAULT_LEVEL_MODEL, "split backward: the held output gradients of layer %d "
              "exceed the %zu bytes counted for them", s->layer, s->cap);
    return 0; /* the whole product now, so the gradients stay right */
  }
  m->k->copy(m->kctx, s->held + s->used, dout, bytes);
  if (in_bytes) {
    m->k->copy(m->kctx, s->held + s->used + bytes, in, in_bytes);
    in = s->held + s->used + bytes;
  }
  size_t off;
  const int param = grad_home(m, dweight, &off);
  s->products[s->n_products++] = (struct model_split_product){ s->layer, dweight, param, off, in, w, bf16_product, N,
                                                               IC, OC, s->used, key, s->group };
  s->used += bytes + in_bytes;
  return 1;
}

int passes_split_w(struct model *m, struct model_acts *a, int layer)
{
  struct model_split *s = a->split;
  if (!s || s->phase != MODEL_SPLIT_W)
    return 0;
  int recomputed = 0;
  for (int i = 0; i < s->n_products; i++) {
    const struct model_split_product *p = &s->products[i];
    if (p->layer != layer)
      continue;
    /* the inputs B saw, where discarded (at tp > 1 B held them: no recompute, no collective) */
    if (!recomputed && m->tp.size == 1 && layer >= 0 && layer < m->config.n_layers) {
      passes_layer_recompute(m, a, layer);
      recomputed = 1;
    }
    const void *dout = s->held + p->at;
    if (layer < 0) { /* the tied embedding's rows: dwte += dresidual at the tokens */
      m->k->encoder_backward(m->kctx, grad_now(m, p), dout, p->in, p->N, p->IC);
      continue;
    }
    if (!p->bf16) {
      m->k->linear_backward(m->kctx, NULL, grad_now(m, p), dout, p->in, p->w, p->N, p->IC, p->OC);
      continue;
    }
    char e[200];
    if (m->k->linear_backward_bf16(m->kctx, NULL, grad_now(m, p), dout, p->in, p->w, p->N, p->IC, p->OC, e, sizeof e))
      fault_set(FAULT_OF(&m->tp), FAULT_LEVEL_MODEL, "bf16 product: %.241s", e);
  }
  return 1;
}

int passes_split_embed(struct model *m, struct model_acts *a)
{
  struct model_split *s = a->split;
  if (!s)
    return 0;
  if (s->phase == MODEL_SPLIT_W)
    return passes_split_w(m, a, -1);
  if (!(m->config.tie_embeddings && m->embed_here && m->head_here && m->tp.size == 1))
    return 0;
  const int N = a->B * a->T, C = m->config.dim;
  const size_t bytes = (size_t)N * C * sizeof(real);
  if (s->n_products >= s->cap_products || bytes > s->cap - s->used) { /* the layout's count is wrong */
    fault_set(FAULT_OF(&m->tp), FAULT_LEVEL_MODEL, "split backward: the tied embedding's held gradient "
              "exceeds the %zu bytes counted", s->cap);
    return 0; /* run it now, so the gradients stay right */
  }
  m->k->copy(m->kctx, s->held + s->used, a->dresidual, bytes);
  size_t off;
  const int param = grad_home(m, m->dwte, &off);
  s->products[s->n_products++] = (struct model_split_product){ -1, m->dwte, param, off, a->tokens, NULL, 0, N, C, 0,
                                                               s->used, NULL, 0 };
  s->used += bytes;
  return 1;
}
