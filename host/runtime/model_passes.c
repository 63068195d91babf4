/* Forward and backward of the model, piece by piece: embedding, one block, head. Each piece
 * reads and writes the activations of struct model_acts only, so a pipeline stage runs the
 * pieces it owns and a recompute can rerun one. Dropout masks are drawn per sample from its
 * logical coordinates (DESIGN 3.4), never from the batch row, so micro-batching, data
 * parallelism and recompute all see the same masks. */
#include <string.h>

#include "kernels.h"
#include "runtime/model.h"

static float *residual_at(const struct model_acts *a, const struct model *m, int index)
{
  return a->residual + (size_t)index * a->B_max * a->T_max * m->config.dim;
}

/* One mask per sample: the sample's tensor has per_sample elements, counted from 0. */
static void draw_masks(float *mask, size_t per_sample, const struct model_dropout *d, int B,
                       int layer, enum model_dropout_site site)
{
  for (int b = 0; b < B; b++)
    dropout_mask(mask + (size_t)b * per_sample, per_sample, d->p, d->seed, d->step,
                 (uint32_t)d->samples[b], ((uint32_t)layer << 8) | (uint32_t)site, 0);
}

void model_embed_forward(const struct model *m, struct model_acts *a, const int *tokens,
                         const struct model_dropout *dropout, int B, int T)
{
  a->B = B;
  a->T = T;
  a->dropout_on = dropout && dropout->p > 0.0f && m->config.dropout > 0.0;
  memcpy(a->tokens, tokens, (size_t)B * T * sizeof(int));
  encoder_forward(residual_at(a, m, 0), tokens, m->wte, B * T, m->config.dim);
}

void model_layer_forward(const struct model *m, struct model_acts *a, int layer,
                         const struct model_dropout *dropout)
{
  const struct plan_model *c = &m->config;
  const int B = a->B, T = a->T, BT = B * T, C = c->dim, F = c->ffn_dim, HS = c->head_dim;
  const int NH = c->n_heads, NKV = c->n_kv_heads;
  const size_t n_c = (size_t)BT * C;
  const struct model_layer_weights *w = &m->layers[layer];
  struct model_layer_acts *la = &a->layers[layer];
  const float *x = residual_at(a, m, layer);
  float *out = residual_at(a, m, layer + 1), *branch = a->work_c1;
  const float eps = (float)c->norm_eps;
  const int drop = a->dropout_on;

  rmsnorm_forward(la->ln1, la->ln1_rstd, x, w->attn_norm, BT, C, eps);
  linear_forward(la->q, la->ln1, w->wq, BT, C, NH * HS);
  linear_forward(la->k, la->ln1, w->wk, BT, C, NKV * HS);
  linear_forward(la->v, la->ln1, w->wv, BT, C, NKV * HS);
  rope_forward(la->q, la->q, a->rope_cos, a->rope_sin, B, T, NH, HS);
  rope_forward(la->k, la->k, a->rope_cos, a->rope_sin, B, T, NKV, HS);
  if (drop)
    draw_masks(la->probs_mask, (size_t)NH * T * T, dropout, B, layer, MODEL_DROP_ATTN_PROBS);
  attention_forward(la->atty, la->probs, a->attn_scratch, la->q, la->k, la->v,
                    drop ? la->probs_mask : NULL, B, T, NH, NKV, HS);
  linear_forward(branch, la->atty, w->wo, BT, NH * HS, C);
  if (drop) {
    draw_masks(la->attn_mask, (size_t)T * C, dropout, B, layer, MODEL_DROP_ATTN_OUT);
    dropout_forward(branch, branch, la->attn_mask, n_c);
  }
  residual_forward(la->mid, x, branch, n_c);

  rmsnorm_forward(la->ln2, la->ln2_rstd, la->mid, w->mlp_norm, BT, C, eps);
  linear_forward(la->gate, la->ln2, w->wgate, BT, C, F);
  linear_forward(la->up, la->ln2, w->wup, BT, C, F);
  swiglu_forward(la->hidden, la->gate, la->up, (size_t)BT * F);
  linear_forward(branch, la->hidden, w->wdown, BT, F, C);
  if (drop) {
    draw_masks(la->mlp_mask, (size_t)T * C, dropout, B, layer, MODEL_DROP_MLP_OUT);
    dropout_forward(branch, branch, la->mlp_mask, n_c);
  }
  residual_forward(out, la->mid, branch, n_c);
}

double model_head_forward(const struct model *m, struct model_acts *a, const int *targets)
{
  const struct plan_model *c = &m->config;
  const int BT = a->B * a->T, C = c->dim;
  rmsnorm_forward(a->lnf, a->lnf_rstd, residual_at(a, m, c->n_layers), m->final_norm, BT, C,
                  (float)c->norm_eps);
  linear_forward(a->logits, a->lnf, m->head, BT, C, c->vocab_padded);
  if (!targets)
    return 0.0;
  crossentropy_forward(a->losses, a->logits, a->logits, targets, BT, c->vocab, c->vocab_padded);
  double sum = 0.0; /* in token order: the same bits for any thread count */
  for (int i = 0; i < BT; i++) sum += a->losses[i];
  return sum;
}

double model_forward(const struct model *m, struct model_acts *a, const int *tokens,
                     const int *targets, const struct model_dropout *dropout, int B, int T)
{
  model_embed_forward(m, a, tokens, dropout, B, T);
  for (int l = 0; l < m->config.n_layers; l++) model_layer_forward(m, a, l, dropout);
  return model_head_forward(m, a, targets);
}

void model_head_backward(struct model *m, struct model_acts *a, const int *targets,
                         float loss_scale)
{
  const struct plan_model *c = &m->config;
  const int BT = a->B * a->T, C = c->dim;
  crossentropy_backward(a->logits, a->logits, targets, loss_scale, BT, c->vocab, c->vocab_padded);
  linear_backward(a->work_c1, m->dhead, a->logits, a->lnf, m->head, BT, C, c->vocab_padded);
  rmsnorm_backward(a->dresidual, m->dfinal_norm, a->work_c1, residual_at(a, m, c->n_layers),
                   m->final_norm, a->lnf_rstd, BT, C);
}

void model_layer_backward(struct model *m, struct model_acts *a, int layer)
{
  const struct plan_model *c = &m->config;
  const int B = a->B, T = a->T, BT = B * T, C = c->dim, F = c->ffn_dim, HS = c->head_dim;
  const int NH = c->n_heads, NKV = c->n_kv_heads;
  const size_t n_c = (size_t)BT * C;
  const struct model_layer_weights *w = &m->layers[layer];
  struct model_layer_weights *g = &m->layer_grads[layer];
  const struct model_layer_acts *la = &a->layers[layer];
  const float *x = residual_at(a, m, layer);
  float *dres = a->dresidual, *d1 = a->work_c1, *d2 = a->work_c2;
  const int drop = a->dropout_on;

  /* MLP branch: out = mid + drop(down(hidden)); d mid = d out + (branch path). */
  const float *dbranch = dres;
  if (drop) {
    dropout_backward(d2, dres, la->mlp_mask, n_c);
    dbranch = d2;
  }
  linear_backward(a->dhidden, g->wdown, dbranch, la->hidden, w->wdown, BT, F, C);
  swiglu_backward(a->dgate, a->dup, a->dhidden, la->gate, la->up, (size_t)BT * F);
  linear_backward(d1, g->wgate, a->dgate, la->ln2, w->wgate, BT, C, F);
  linear_backward(d2, g->wup, a->dup, la->ln2, w->wup, BT, C, F);
  residual_forward(d1, d1, d2, n_c);
  rmsnorm_backward(d1, g->mlp_norm, d1, la->mid, w->mlp_norm, la->ln2_rstd, BT, C);
  residual_forward(dres, dres, d1, n_c);

  /* Attention branch: mid = x + drop(o(atty)). */
  dbranch = dres;
  if (drop) {
    dropout_backward(d2, dres, la->attn_mask, n_c);
    dbranch = d2;
  }
  linear_backward(d1, g->wo, dbranch, la->atty, w->wo, BT, NH * HS, C);
  attention_backward(a->dq, a->dk, a->dv, a->attn_scratch, d1, la->q, la->k, la->v, la->probs,
                     drop ? la->probs_mask : NULL, B, T, NH, NKV, HS);
  rope_backward(a->dq, a->dq, a->rope_cos, a->rope_sin, B, T, NH, HS);
  rope_backward(a->dk, a->dk, a->rope_cos, a->rope_sin, B, T, NKV, HS);
  linear_backward(d1, g->wq, a->dq, la->ln1, w->wq, BT, C, NH * HS);
  linear_backward(d2, g->wk, a->dk, la->ln1, w->wk, BT, C, NKV * HS);
  residual_forward(d1, d1, d2, n_c);
  linear_backward(d2, g->wv, a->dv, la->ln1, w->wv, BT, C, NKV * HS);
  residual_forward(d1, d1, d2, n_c);
  rmsnorm_backward(d1, g->attn_norm, d1, x, w->attn_norm, la->ln1_rstd, BT, C);
  residual_forward(dres, dres, d1, n_c);
}

void model_embed_backward(struct model *m, struct model_acts *a)
{
  encoder_backward(m->dwte, a->dresidual, a->tokens, a->B * a->T, m->config.dim);
}

void model_backward(struct model *m, struct model_acts *a, const int *targets, float loss_scale)
{
  model_head_backward(m, a, targets, loss_scale);
  for (int l = m->config.n_layers - 1; l >= 0; l--) model_layer_backward(m, a, l);
  model_embed_backward(m, a);
}
