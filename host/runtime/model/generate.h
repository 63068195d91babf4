/* Generation from a model (tycho generate): its forward over a per-layer key/value cache, and the
 * sampler that picks each next token.
 *
 * The cache holds, for every layer, the rotated keys and the values of every position run so far.
 * gen_forward runs a block of new tokens (the whole prompt once, then one token at a time) through
 * the model on the kernel table's entries (rmsnorm, linear, rope, swiglu) and a small attention of
 * each new row over the cache: so a new token costs one position's forward, not the sequence's.
 * RoPE turns each row at its absolute position; query head h reads key/value head
 * h / (NH / NKV) as the training attention does. A sparse layer (model.moe) runs the training's
 * router, routing, experts and combine on the new rows, each token routed alone and none of its
 * top_k assignments dropped whatever the capacity factor (a decoded token is one token: Mixtral
 * and Megatron decode dropless too), so a token's output never depends on later tokens. Models
 * of one rank (the whole model, every expert) on a backend whose memory is host memory (the
 * CPU); inference only: no dropout.
 *
 * gen_forward_full is the check of it: the training forward (model_passes.c) over the whole
 * sequence, recomputed at every token, with the same dropless rule (gen_full_model).
 *
 * The sampler: temperature 0 is greedy (the largest logit, ties to the lowest id); otherwise
 * softmax(logits / temperature), the top_k most probable kept (0: all), then of those (renormalised)
 * the smallest most-probable prefix whose sum reaches top_p, renormalised, and one draw from Philox
 * (kernels/philox.h) keyed by the seed at the token's position: the same seed gives the same tokens
 * on every run and machine. */
#ifndef TYCHO_RUNTIME_GENERATE_H
#define TYCHO_RUNTIME_GENERATE_H
#include <stddef.h>
#include <stdint.h>

#include "runtime/model/model.h"

struct gen_cache {
  const struct model *m;
  int max_T;     /* positions the cache holds */
  int max_rows;  /* tokens one gen_forward may run */
  int n;         /* positions run so far */
  real *k, *v;   /* (L, max_T, NKV·HS) rotated keys, values */
  real *x, *h, *q, *kr, *vr, *att, *gate, *up, *hid, *rstd, *cos, *sin, *scores;
  real *logits;  /* (Vp) the last row's */
  /* sparse layers (model.moe), NULL in a dense model: router logits and probabilities (R, E),
   * top-k weights (R, K), logsumexp (R), the experts' rows (R·K, C) in and out and their SwiGLU
   * (R·K, Fe); top-k experts and rows (R, K), rows per expert and routed (E) */
  real *moe_logits, *moe_probs, *moe_topw, *moe_lse, *moe_xe, *moe_ye, *moe_gate, *moe_up, *moe_hid;
  int *moe_topi, *moe_slot, *moe_counts, *moe_routed;
};

/* A cache for up to max_T positions and prompts of up to max_rows tokens. 0, or −1 with a message
 * (out of memory; a model this path does not run: tensor, pipeline or expert split, memory the
 * host cannot address). */
int gen_cache_open(struct gen_cache *c, const struct model *m, int max_T, int max_rows, char *err,
                   size_t err_size);
void gen_cache_close(struct gen_cache *c);

/* Runs n tokens (host memory) at positions c->n .. c->n + n − 1 against the cache, appends their
 * keys and values and leaves the last row's logits (V of them, then padding) in c->logits.
 * n ≤ max_rows, c->n + n ≤ max_T. */
void gen_forward(struct gen_cache *c, const int *tokens, int n);

/* The model as gen_forward_full runs it: a shallow copy of m (the same weights and tables) whose
 * sparse layers keep every assignment, model.moe.capacity_factor set aside as gen_forward does,
 * and add nothing to m's routing statistics. Activations for it: model_acts_create on the copy. */
void gen_full_model(struct model *view, const struct model *m);

/* The training forward over tokens[0, T) on activations for (1, T_max): the last row's logits
 * into logits (Vp host memory). m: gen_full_model's copy where layers are sparse. */
void gen_forward_full(const struct model *m, struct model_acts *a, const int *tokens, int T, real *logits);

struct gen_sampling {
  double temperature; /* 0: greedy */
  int top_k;          /* 0: off */
  double top_p;       /* 1: off */
  uint64_t seed;
};

/* The token chosen from logits[0, V) for the token at `position` (the draw's counter). work:
 * 2·V doubles' worth (gen_sample_work_bytes). */
size_t gen_sample_work_bytes(int V);
int gen_sample(const real *logits, int V, const struct gen_sampling *s, long long position, void *work);

/* A whole generation: the prompt (host memory, every id below the vocabulary, P ≤ max_seq), at
 * most max_tokens new tokens, fewer where the sequence would pass model.max_seq
 * (gen_budget), stopping after one of the eos ids; each token given to emit (may be NULL) as it is
 * chosen and written to out (gen_budget entries). no_cache: the training forward over the whole
 * sequence at every token (gen_forward_full, on gen_full_model's copy). */
struct gen_request {
  const int *prompt;
  int P;
  long long max_tokens;
  struct gen_sampling s;
  const int *eos;
  int n_eos;
  int no_cache;
  void (*emit)(void *ctx, int id);
  void *ctx;
};
/* The most tokens a request can give: max_tokens, or max_seq − P + 1 when less. */
long long gen_budget(const struct model *m, int P, long long max_tokens);
/* The count of tokens written, or −1 with a message (gen_cache_open's refusals, out of memory). */
long long gen_run(const struct model *m, const struct gen_request *r, int *out, char *err, size_t err_size);

#endif
