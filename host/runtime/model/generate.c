/* Generation (generate.h): the model's forward over a per-layer key/value cache, the training
 * forward recomputed over the whole sequence as its check, and the sampler.
 *
 * The cached forward uses the model's kernel table for everything but the attention, so the
 * norms, products, RoPE, SwiGLU and a sparse layer's routing are the training's kernels on fewer
 * rows. The attention of a
 * new row reads every cached position up to its own (causal by construction: the cache holds
 * nothing later), with the max subtracted before exp and the sums in `real` as the training
 * kernel's online softmax keeps them; the two differ by rounding only. */
#include "runtime/model/generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "philox.h"

/* The low byte-string "gen" in the Philox counter's last word: generation's draws never meet
 * dropout's or initialization's counters. */
#define GEN_STREAM 0x67656e00u

int gen_cache_open(struct gen_cache *c, const struct model *m, int max_T, int max_rows, char *err,
                   size_t err_size)
{
  memset(c, 0, sizeof *c);
  const struct plan_model *cfg = &m->config;
  int sparse = 0;
  for (int l = 0; m->moe && l < cfg->n_layers; l++) sparse |= m->moe[l];
  if (m->tp.size != 1 || m->ep.size > 1 || !m->embed_here || !m->head_here) {
    snprintf(err, err_size, "generation runs on one rank holding the whole model");
    return -1;
  }
  if (!m->k->host_visible || !m->param_memory) {
    snprintf(err, err_size, "generation needs the model's weights in host memory (the CPU, ZeRO below 3)");
    return -1;
  }
  if (max_T < 1 || max_rows < 1 || max_rows > max_T) {
    snprintf(err, err_size, "generation: bad cache size %d for %d rows", max_T, max_rows);
    return -1;
  }
  c->m = m;
  c->max_T = max_T;
  c->max_rows = max_rows;
  const size_t L = (size_t)cfg->n_layers, C = (size_t)cfg->dim, HS = (size_t)cfg->head_dim;
  const size_t KVD = (size_t)cfg->n_kv_heads * HS, F = (size_t)cfg->ffn_dim, R = (size_t)max_rows;
  const size_t QD = (size_t)cfg->n_heads * HS;
  struct { real **p; size_t n; } bufs[] = {
    { &c->k, L * (size_t)max_T * KVD }, { &c->v, L * (size_t)max_T * KVD },
    { &c->x, R * C }, { &c->h, R * C }, { &c->q, R * QD }, { &c->kr, R * KVD }, { &c->vr, R * KVD },
    { &c->att, R * QD }, { &c->gate, R * F }, { &c->up, R * F }, { &c->hid, R * F }, { &c->rstd, R },
    { &c->cos, R * HS / 2 + 1 }, { &c->sin, R * HS / 2 + 1 }, { &c->scores, (size_t)max_T },
    { &c->logits, (size_t)cfg->vocab_padded },
  };
  /* the sparse layers' routing and experts' rows: each of the R tokens sends K rows */
  const size_t E = sparse ? (size_t)cfg->moe.experts : 0, K = sparse ? (size_t)cfg->moe.top_k : 0;
  const size_t Fe = sparse ? (size_t)cfg->moe.ffn_dim : 0;
  struct { real **p; size_t n; } moe_bufs[] = {
    { &c->moe_logits, R * E }, { &c->moe_probs, R * E }, { &c->moe_topw, R * K }, { &c->moe_lse, R },
    { &c->moe_xe, R * K * C }, { &c->moe_ye, R * K * C }, { &c->moe_gate, R * K * Fe },
    { &c->moe_up, R * K * Fe }, { &c->moe_hid, R * K * Fe },
  };
  struct { int **p; size_t n; } moe_ints[] = {
    { &c->moe_topi, R * K }, { &c->moe_slot, R * K }, { &c->moe_counts, E }, { &c->moe_routed, E },
  };
  const size_t n_bufs = sizeof bufs / sizeof bufs[0], n_moe = sparse ? sizeof moe_bufs / sizeof moe_bufs[0] : 0;
  const size_t n_ints = sparse ? sizeof moe_ints / sizeof moe_ints[0] : 0;
  for (size_t i = 0; i < n_bufs + n_moe + n_ints; i++) {
    void **p = i < n_bufs ? (void **)bufs[i].p : i < n_bufs + n_moe ? (void **)moe_bufs[i - n_bufs].p
                                                                    : (void **)moe_ints[i - n_bufs - n_moe].p;
    const size_t bytes = i < n_bufs ? bufs[i].n * sizeof(real) : i < n_bufs + n_moe
                                          ? moe_bufs[i - n_bufs].n * sizeof(real)
                                          : moe_ints[i - n_bufs - n_moe].n * sizeof(int);
    *p = m->k->mem_alloc(m->kctx, bytes);
    if (!*p) {
      gen_cache_close(c);
      snprintf(err, err_size, "generation: out of memory for the key/value cache of %d positions", max_T);
      return -1;
    }
  }
  return 0;
}

void gen_cache_close(struct gen_cache *c)
{
  if (!c->m)
    return;
  void *all[] = { c->k, c->v, c->x, c->h, c->q, c->kr, c->vr, c->att, c->gate, c->up, c->hid,
                  c->rstd, c->cos, c->sin, c->scores, c->logits, c->moe_logits, c->moe_probs,
                  c->moe_topw, c->moe_lse, c->moe_xe, c->moe_ye, c->moe_gate, c->moe_up, c->moe_hid,
                  c->moe_topi, c->moe_slot, c->moe_counts, c->moe_routed };
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i])
      c->m->k->mem_free(c->m->kctx, all[i]);
  memset(c, 0, sizeof *c);
}

/* att (n, NH·HS) = softmax(q kᵀ / sqrt(HS)) v for rows at positions p0 .. p0 + n − 1 over the
 * cached keys and values of one layer, K and V (max_T, NKV·HS). */
static void attend(struct gen_cache *c, const real *K, const real *V, int p0, int n)
{
  const struct plan_model *cfg = &c->m->config;
  const int NH = cfg->n_heads, NKV = cfg->n_kv_heads, HS = cfg->head_dim, KVD = NKV * HS;
  const int group = NH / NKV;
  const real scale = (real)(1.0 / sqrt((double)HS));
  real *s = c->scores;
  for (int i = 0; i < n; i++) {
    const int last = p0 + i; /* keys 0 .. last */
    for (int h = 0; h < NH; h++) {
      const real *q = c->q + ((size_t)i * NH + h) * HS;
      const size_t kv = (size_t)(h / group) * HS;
      real mx = -INFINITY;
      for (int j = 0; j <= last; j++) {
        const real *k = K + (size_t)j * KVD + kv;
        real dot = 0;
        for (int d = 0; d < HS; d++) dot += q[d] * k[d];
        s[j] = dot * scale;
        if (s[j] > mx)
          mx = s[j];
      }
      real sum = 0;
      for (int j = 0; j <= last; j++) {
        s[j] = (real)exp((double)(s[j] - mx));
        sum += s[j];
      }
      real *out = c->att + ((size_t)i * NH + h) * HS;
      for (int d = 0; d < HS; d++) out[d] = 0;
      for (int j = 0; j <= last; j++) {
        const real *v = V + (size_t)j * KVD + kv, w = s[j] / sum;
        for (int d = 0; d < HS; d++) out[d] += w * v[d];
      }
    }
  }
}

/* x += moe(h) on n rows: the training's kernels (router, routing, dispatch, the experts' SwiGLU,
 * combine) with each token a routing group of its own and no capacity, so every one of a token's
 * top_k assignments is kept whatever model.moe.capacity_factor says: a token's output does not
 * depend on the tokens beside it, which the cache needs (a capacity over the sequence would let a
 * later token's choices drop an earlier token's, after its keys and values were cached). */
static void moe_forward(struct gen_cache *c, const struct model_layer_weights *w, int n)
{
  const struct model *m = c->m;
  const struct kernel_ops *k = m->k;
  void *kc = m->kctx;
  const int C = m->config.dim, E = m->config.moe.experts, K = m->config.moe.top_k, Fe = m->config.moe.ffn_dim;
  k->linear_forward(kc, c->moe_logits, c->h, w->router, n, C, E);
  k->moe_router_forward(kc, c->moe_probs, c->moe_topi, c->moe_topw, c->moe_lse, c->moe_logits, n, E, K);
  k->moe_route(kc, c->moe_slot, c->moe_counts, c->moe_routed, c->moe_topi, n, 1, E, K, 0);
  k->moe_dispatch(kc, c->moe_xe, c->h, c->moe_slot, n, K, C);
  size_t at = 0; /* the expert's first row: counts are host memory (gen_cache_open) */
  for (int e = 0; e < E; e++) {
    const int rows = c->moe_counts[e];
    if (rows == 0)
      continue;
    real *g = c->moe_gate + at * Fe, *u = c->moe_up + at * Fe, *h = c->moe_hid + at * Fe;
    k->linear_forward(kc, g, c->moe_xe + at * C, w->w1[e], rows, C, Fe);
    k->linear_forward(kc, u, c->moe_xe + at * C, w->w3[e], rows, C, Fe);
    k->swiglu_forward(kc, h, g, u, (size_t)rows * Fe);
    k->linear_forward(kc, c->moe_ye + at * C, h, w->w2[e], rows, Fe, C);
    at += (size_t)rows;
  }
  k->moe_combine(kc, c->h, c->moe_ye, c->moe_slot, c->moe_topw, n, K, C);
  k->vec_add(kc, c->x, c->x, c->h, (size_t)n * C);
}

void gen_forward(struct gen_cache *c, const int *tokens, int n)
{
  const struct model *m = c->m;
  const struct kernel_ops *k = m->k;
  void *kc = m->kctx;
  const struct plan_model *cfg = &m->config;
  const int C = cfg->dim, HS = cfg->head_dim, NH = cfg->n_heads, NKV = cfg->n_kv_heads;
  const int KVD = NKV * HS, QD = NH * HS, F = cfg->ffn_dim, p0 = c->n;
  const real eps = (real)cfg->norm_eps;
  const size_t layer_kv = (size_t)c->max_T * KVD;
  /* the tokens' embeddings: the table's rows, read where they are (host memory) */
  for (int i = 0; i < n; i++)
    memcpy(c->x + (size_t)i * C, m->wte + (size_t)tokens[i] * C, (size_t)C * sizeof(real));
  k->rope_table(kc, c->cos, c->sin, n, HS, cfg->rope_theta, p0);
  for (int l = 0; l < cfg->n_layers; l++) {
    const struct model_layer_weights *w = &m->layers[l];
    real *K = c->k + (size_t)l * layer_kv, *V = c->v + (size_t)l * layer_kv;
    k->rmsnorm_forward(kc, c->h, c->rstd, c->x, w->attn_norm, n, C, eps);
    k->linear_forward(kc, c->q, c->h, w->wq, n, C, QD);
    k->linear_forward(kc, c->kr, c->h, w->wk, n, C, KVD);
    k->linear_forward(kc, c->vr, c->h, w->wv, n, C, KVD);
    k->rope_forward(kc, c->q, c->q, c->cos, c->sin, 1, n, NH, HS);
    k->rope_forward(kc, c->kr, c->kr, c->cos, c->sin, 1, n, NKV, HS);
    memcpy(K + (size_t)p0 * KVD, c->kr, (size_t)n * KVD * sizeof(real));
    memcpy(V + (size_t)p0 * KVD, c->vr, (size_t)n * KVD * sizeof(real));
    attend(c, K, V, p0, n);
    k->linear_forward_acc(kc, c->x, c->att, w->wo, n, QD, C); /* x += o(att) */
    k->rmsnorm_forward(kc, c->h, c->rstd, c->x, w->mlp_norm, n, C, eps);
    if (m->moe && m->moe[l]) {
      moe_forward(c, w, n);
      continue;
    }
    k->linear_forward(kc, c->gate, c->h, w->wgate, n, C, F);
    k->linear_forward(kc, c->up, c->h, w->wup, n, C, F);
    k->swiglu_forward(kc, c->hid, c->gate, c->up, (size_t)n * F);
    k->linear_forward_acc(kc, c->x, c->hid, w->wdown, n, F, C); /* x += down(hidden) */
  }
  const real *last = c->x + (size_t)(n - 1) * C;
  k->rmsnorm_forward(kc, c->h, c->rstd, last, m->final_norm, 1, C, eps);
  k->linear_forward(kc, c->logits, c->h, m->head, 1, C, cfg->vocab_padded);
  c->n += n;
}

void gen_full_model(struct model *view, const struct model *m)
{
  *view = *m;
  view->config.moe.capacity_factor = 0;
  view->rank.config.moe.capacity_factor = 0; /* what the activations' layout reads */
  view->moe_collect = 0;
  memset(&view->cp, 0, sizeof view->cp); /* one rank, the whole sequence: no context parallelism */
}

void gen_forward_full(const struct model *m, struct model_acts *a, const int *tokens, int T, real *logits)
{
  model_embed_forward(m, a, tokens, NULL, 1, T);
  for (int l = 0; l < m->config.n_layers; l++) model_layer_forward(m, a, l, NULL);
  model_head_forward(m, a, NULL);
  const size_t Vp = (size_t)m->config.vocab_padded;
  m->k->to_host(m->kctx, logits, a->logits + (size_t)(T - 1) * Vp, Vp * sizeof(real));
}

/* ---- sampling ---- */

size_t gen_sample_work_bytes(int V)
{
  return (size_t)V * (sizeof(double) + sizeof(int));
}

/* Descending probability, the lower id first among equals: the order is total, so the kept set
 * does not depend on the sort's algorithm. */
static const double *sort_probs;
static int by_prob(const void *a, const void *b)
{
  const int i = *(const int *)a, j = *(const int *)b;
  if (sort_probs[i] != sort_probs[j])
    return sort_probs[i] > sort_probs[j] ? -1 : 1;
  return (i > j) - (i < j);
}

/* A uniform double in [0, 1) with 53 bits, a function of (seed, position) only. */
static double draw(uint64_t seed, long long position)
{
  const uint64_t p = (uint64_t)position;
  const uint32_t ctr[4] = { (uint32_t)p, (uint32_t)(p >> 32), 0, GEN_STREAM };
  const uint32_t key[2] = { (uint32_t)seed, (uint32_t)(seed >> 32) };
  uint32_t out[4];
  philox4x32_10(ctr, key, out);
  const uint64_t bits = ((uint64_t)out[0] << 21) ^ (uint64_t)(out[1] >> 11);
  return (double)(bits & ((1ULL << 53) - 1)) / 9007199254740992.0;
}

int gen_sample(const real *logits, int V, const struct gen_sampling *s, long long position, void *work)
{
  int best = 0;
  for (int i = 1; i < V; i++)
    if (logits[i] > logits[best])
      best = i;
  if (s->temperature <= 0)
    return best;
  double *p = work;
  int *idx = (int *)(p + V);
  const double mx = (double)logits[best];
  double sum = 0;
  for (int i = 0; i < V; i++) {
    p[i] = exp(((double)logits[i] - mx) / s->temperature);
    sum += p[i];
    idx[i] = i;
  }
  for (int i = 0; i < V; i++) p[i] /= sum;
  sort_probs = p;
  qsort(idx, (size_t)V, sizeof *idx, by_prob);
  int n = s->top_k > 0 && s->top_k < V ? s->top_k : V;
  /* top-p over the top-k renormalised: the smallest prefix whose sum reaches top_p */
  double kept = 0;
  for (int i = 0; i < n; i++) kept += p[idx[i]];
  if (s->top_p < 1) {
    double acc = 0;
    int m = 0;
    while (m < n) {
      acc += p[idx[m++]] / kept;
      if (acc >= s->top_p)
        break;
    }
    n = m;
    kept = 0;
    for (int i = 0; i < n; i++) kept += p[idx[i]];
  }
  const double u = draw(s->seed, position) * kept;
  double acc = 0;
  for (int i = 0; i < n; i++) {
    acc += p[idx[i]];
    if (u < acc)
      return idx[i];
  }
  return idx[n - 1];
}

/* ---- a whole generation ---- */

long long gen_budget(const struct model *m, int P, long long max_tokens)
{
  const long long fit = (long long)m->config.max_seq - P + 1; /* fed back while it fits */
  return max_tokens < fit ? max_tokens : fit;
}

long long gen_run(const struct model *m, const struct gen_request *r, int *out, char *err, size_t err_size)
{
  const int V = m->config.vocab, Vp = m->config.vocab_padded, P = r->P;
  const long long budget = gen_budget(m, P, r->max_tokens);
  const int T_max = P + (int)budget - 1 > P ? P + (int)budget - 1 : P;
  struct gen_cache cache = { 0 };
  struct model_acts acts;
  struct model full;
  int have_acts = 0;
  long long n_out = -1;
  int *seq = malloc((size_t)T_max * sizeof *seq);
  real *logits = malloc((size_t)Vp * sizeof *logits);
  void *work = malloc(gen_sample_work_bytes(V));
  if (!seq || !logits || !work) {
    snprintf(err, err_size, "generation: out of memory");
    goto done;
  }
  if (r->no_cache) {
    if (!m->k->host_visible || m->tp.size != 1 || !m->embed_here || !m->head_here) {
      snprintf(err, err_size, "generation runs on one rank holding the whole model, in host memory");
      goto done;
    }
    gen_full_model(&full, m);
    if (model_acts_create(&acts, &full, 1, T_max, err, err_size))
      goto done;
    have_acts = 1;
  } else if (gen_cache_open(&cache, m, T_max, P, err, err_size)) {
    goto done;
  }
  memcpy(seq, r->prompt, (size_t)P * sizeof *seq);
  int T = P;
  n_out = 0;
  while (n_out < budget) {
    if (r->no_cache) {
      gen_forward_full(&full, &acts, seq, T, logits);
    } else {
      gen_forward(&cache, n_out ? &seq[T - 1] : seq, n_out ? 1 : P);
      memcpy(logits, cache.logits, (size_t)Vp * sizeof *logits);
    }
    const int id = gen_sample(logits, V, &r->s, T, work);
    out[n_out++] = id;
    if (r->emit)
      r->emit(r->ctx, id);
    int stop = n_out == budget;
    for (int i = 0; i < r->n_eos; i++) stop |= r->eos[i] == id;
    if (stop)
      break;
    seq[T++] = id;
  }
done:
  if (have_acts)
    model_acts_free(&acts);
  gen_cache_close(&cache);
  free(seq);
  free(logits);
  free(work);
  return n_out;
}
