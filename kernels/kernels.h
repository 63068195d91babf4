/* The kernel interface: forward and backward of every op a Llama-style model needs, on `real`
 * (real.h: fp32, or double in the float64 proof build).
 * kernels/cpu/ implements it with OpenBLAS and OpenMP and is the reference; a CUDA backend
 * implements the same signatures. Semantics follow Hugging Face LlamaForCausalLM.
 *
 * Dimension legend:
 *   B    batch                       T    sequence length
 *   C    model dim (= NH * HS)       HS   head size
 *   NH   query heads                 NKV  key/value heads (NH % NKV == 0; grouped-query attention)
 *   F    ffn (intermediate) dim      V    vocabulary size
 *   Vp   padded vocabulary (>= V): the row stride of logits and of the embedding table
 *   BT   B * T, for ops that treat every token alike
 *
 * Conventions (as in llm.c):
 *   - arguments in the order: outputs, saved-for-backward, inputs, parameters, sizes, then
 *     scalar settings (eps, learning rate, ...);
 *   - parameter gradients ACCUMULATE (+=), activation gradients ASSIGN (=);
 *   - row-major; activations are (BT, C), (BT, F), ...; a linear weight is stored as Hugging
 *     Face stores it, (OC, IC), and y = x · Wᵀ (no bias);
 *   - element counts are size_t and named n_elems; everything else is int;
 *   - kernels never allocate, never exit and keep no state; buffers that may alias are named. */
#ifndef TYCHO_KERNELS_H
#define TYCHO_KERNELS_H
#include <stddef.h>
#include <stdint.h>

#include "real.h"

/* Call first thing in main, before any other thread exists. Sets OpenBLAS to 1 thread, turns on
 * flush-to-zero and denormals-are-zero (x86 MXCSR) in the calling thread, then sets OpenBLAS and
 * OpenMP to n_threads, so worker threads created from now on inherit the mode (denormals make
 * sgemm ~100x slower on some CPUs). OpenBLAS (0.3.21) starts its pool when the library loads and
 * never copies MXCSR to it, so the pool only gets the mode if the process was started with
 * OPENBLAS_NUM_THREADS=1. Returns 0, or 1 when OpenBLAS already had more than one thread on
 * entry (its old workers then run without flush-to-zero; the caller may warn). */
int kernels_init_cpu(int n_threads);

/* ---- embedding ---------------------------------------------------------------------------- */
/* out[bt, :] = wte[tokens[bt], :]. tokens in [0, Vp). */
void encoder_forward(real *out, const int *tokens, const real *wte, int BT, int C);
/* dwte[tokens[bt], :] += dout[bt, :]. */
void encoder_backward(real *dwte, const real *dout, const int *tokens, int BT, int C);
/* A vocabulary shard: wte holds rows [v0, v0 + Vl) of the table. out[bt, :] = that row for
 * tokens inside the shard, 0 for the others (partial sums over the shards). */
void encoder_forward_shard(real *out, const int *tokens, const real *wte, int v0, int Vl,
                           int BT, int C);
/* dwte[tokens[bt] − v0, :] += dout[bt, :] for tokens inside the shard. */
void encoder_backward_shard(real *dwte, const real *dout, const int *tokens, int v0, int Vl,
                            int BT, int C);

/* ---- RMSNorm ------------------------------------------------------------------------------ */
/* out = inp · rsqrt(mean(inp²) + eps) · weight, per row. out (BT, C), rstd (BT), inp (BT, C),
 * weight (C). out may equal inp. */
void rmsnorm_forward(real *out, real *rstd, const real *inp, const real *weight,
                     int BT, int C, real eps);
/* dinp (BT, C) assigned, dweight (C) accumulated. dinp may equal dout. */
void rmsnorm_backward(real *dinp, real *dweight, const real *dout, const real *inp,
                      const real *weight, const real *rstd, int BT, int C);

/* ---- linear (no bias) --------------------------------------------------------------------- */
/* out (BT, OC) = inp (BT, IC) · weightᵀ, weight (OC, IC). */
void linear_forward(real *out, const real *inp, const real *weight, int BT, int IC, int OC);
/* dinp (BT, IC) = dout · weight, assigned, skipped when dinp is NULL;
 * dweight (OC, IC) += doutᵀ · inp. */
void linear_backward(real *dinp, real *dweight, const real *dout, const real *inp,
                     const real *weight, int BT, int IC, int OC);

/* ---- rotary position embedding (rotate-half form, as Hugging Face Llama) ------------------ */
/* cos_table, sin_table (T, HS/2): cos and sin of the angle (pos0 + t) · theta^(−2i/HS),
 * computed in double. pos0 is the position of row 0, for ranks that hold a later slice of the
 * sequence. HS even. */
void rope_table(real *cos_table, real *sin_table, int T, int HS, double theta, int pos0);
/* Rotates each head vector in pairs (i, i + HS/2):
 *   out[i]        = inp[i] cos_i − inp[i + HS/2] sin_i
 *   out[i + HS/2] = inp[i + HS/2] cos_i + inp[i] sin_i
 * inp, out (B, T, NHx, HS) with NHx = NH for q, NKV for k. out may equal inp. */
void rope_forward(real *out, const real *inp, const real *cos_table, const real *sin_table,
                  int B, int T, int NHx, int HS);
/* The transposed rotation. dinp may equal dout. */
void rope_backward(real *dinp, const real *dout, const real *cos_table,
                   const real *sin_table, int B, int T, int NHx, int HS);

/* ---- causal self-attention with grouped KV heads ------------------------------------------ */
/* Floats of scratch that attention_forward and attention_backward need:
 * B · T · T · max(NH, 2 · NKV). */
size_t attention_scratch_n_elems(int B, int T, int NH, int NKV);
/* scores = q·kᵀ / sqrt(HS) with a causal mask; probs = softmax(scores) (saved, pre-dropout,
 * zero above the diagonal); out = (probs ⊙ dropmask) · v. Query head h reads KV head
 * h / (NH / NKV). out (B, T, NH·HS), probs (B, NH, T, T), q (B, T, NH, HS),
 * k and v (B, T, NKV, HS), dropmask (B, NH, T, T) holding 0 or 1/(1 − p), or NULL for none.
 * scratch: attention_scratch_n_elems floats; may be NULL when dropmask is NULL. */
void attention_forward(real *out, real *probs, real *scratch, const real *q, const real *k,
                       const real *v, const real *dropmask, int B, int T, int NH, int NKV,
                       int HS);
/* dq (B, T, NH, HS), dk and dv (B, T, NKV, HS), all assigned. scratch as above (not NULL). */
void attention_backward(real *dq, real *dk, real *dv, real *scratch, const real *dout,
                        const real *q, const real *k, const real *v, const real *probs,
                        const real *dropmask, int B, int T, int NH, int NKV, int HS);

/* ---- SwiGLU ------------------------------------------------------------------------------- */
/* out = silu(gate) ⊙ up, silu(x) = x · sigmoid(x). All n_elems (BT · F). */
void swiglu_forward(real *out, const real *gate, const real *up, size_t n_elems);
/* dgate, dup assigned. */
void swiglu_backward(real *dgate, real *dup, const real *dout, const real *gate,
                     const real *up, size_t n_elems);

/* ---- dropout ------------------------------------------------------------------------------ */
/* mask[i] = 0 with probability p, else 1/(1 − p), decided by
 * philox_uniform(seed, c1, c2, c3, first_elem + i) < p (see philox.h), a comparison of floats in
 * both builds, so the float64 build drops the same elements. A rank that holds
 * elements [a, b) of a tensor passes first_elem = a and gets the serial run's values. */
void dropout_mask(real *mask, size_t n_elems, float p, uint64_t seed, uint32_t c1,
                  uint32_t c2, uint32_t c3, uint64_t first_elem);
/* out = inp ⊙ mask. out may equal inp. */
void dropout_forward(real *out, const real *inp, const real *mask, size_t n_elems);
/* dinp = dout ⊙ mask, assigned. dinp may equal dout. */
void dropout_backward(real *dinp, const real *dout, const real *mask, size_t n_elems);

/* ---- residual ----------------------------------------------------------------------------- */
/* out = a + b. out may equal a or b (so it also serves as "accumulate"). */
void residual_forward(real *out, const real *a, const real *b, size_t n_elems);

/* ---- cross-entropy over the vocabulary ---------------------------------------------------- */
/* Softmax over the first V columns of each row of logits (BT, Vp); padding columns get
 * probability 0. losses[bt] = −log probs[bt, targets[bt]], or 0 where targets[bt] == −1.
 * probs (BT, Vp) is saved for backward and may equal logits (computed in place). */
void crossentropy_forward(real *losses, real *probs, const real *logits, const int *targets,
                          int BT, int V, int Vp);
/* dlogits = (probs − onehot(target)) · dloss_scale, assigned; 0 in padding columns and in rows
 * whose target is −1. dloss_scale is d(total loss)/d(losses[bt]), the same for every token
 * (e.g. 1 / number of counted tokens). dlogits may equal probs. */
void crossentropy_backward(real *dlogits, const real *probs, const int *targets,
                           real dloss_scale, int BT, int V, int Vp);

/* Cross-entropy over a vocabulary split in column shards (Megatron's vocab-parallel loss):
 * logits (BT, Vl) hold columns [v0, v0 + Vl) of the padded vocabulary, of which the first
 * Vvalid = clamp(V − v0, 0, Vl) are real tokens. The caller reduces over the shards between the
 * calls: stats (3, BT) = [max | Σ exp | target logit].
 * 1. stats[0] = the shard's max (−inf when it has no real token); reduce with max.
 * 2. stats[1] = Σ exp(logit − max) over the shard, stats[2] = the target's logit when the
 *    target is in the shard, else 0; reduce both with sum.
 * 3. losses (as crossentropy_forward) and probs = exp(logit − max) / Σ (0 in padding columns). */
void crossentropy_shard_max(real *stats, const real *logits, int BT, int Vvalid, int Vl);
void crossentropy_shard_sums(real *stats, const real *logits, const int *targets, int v0,
                             int BT, int Vvalid, int Vl);
void crossentropy_shard_finish(real *losses, real *probs, const real *logits,
                               const real *stats, const int *targets, int BT, int Vvalid, int Vl);
/* dlogits = (probs − onehot(target − v0)) · dloss_scale on the shard, as crossentropy_backward. */
void crossentropy_shard_backward(real *dlogits, const real *probs, const int *targets, int v0,
                                 real dloss_scale, int BT, int Vvalid, int Vl);

/* ---- optimizer and gradient utilities ----------------------------------------------------- */
/* One step of torch.optim.AdamW (defaults: no amsgrad, no maximize), t the 1-based step:
 *   param ← param · (1 − lr·weight_decay)                       (decoupled, applied first)
 *   m ← β1·m + (1 − β1)·grad;   v ← β2·v + (1 − β2)·grad²
 *   param ← param − lr/(1 − β1^t) · m / (sqrt(v)/sqrt(1 − β2^t) + eps)
 * The settings are double, as torch's Python floats are (1 − β2 taken from a float 0.999f is off
 * by 1e-5), and so are the bias corrections. */
void adamw_update(real *param, const real *grad, real *m, real *v, size_t n_elems,
                  double lr, double beta1, double beta2, double eps, double weight_decay, int t);
/* Σ x², accumulated in double (for the global gradient norm); the same bits for any number
 * of threads. */
double sumsq(const real *x, size_t n_elems);
/* x ← x · s. */
void scale_inplace(real *x, size_t n_elems, real s);

#endif
