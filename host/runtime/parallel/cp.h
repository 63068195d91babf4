/* Context parallelism's ring attention (cp.c): each of a cp group's ranks holds 2 of a
 * sequence's 2·cp chunks — rank i chunks i and 2·cp − 1 − i (kernels.h: attention_cp_chunk), so
 * every rank has an equal share of the causal square — of every sample, and the causal attention
 * of those rows is computed by passing the ranks' k, v pairs around the group's ring.
 * mesh.cp selects it: the model's attention runs through it (runtime/model/model_cp.c). Its blocks
 * run through the kernel table it is given (the attention_cp_* entries, ops_list.h, and zero,
 * copy and vec_add for the accumulators), its buffers are that table's memory (the runtime's
 * allocator's blocks on the table's device); the transfers are
 * the comm layer's on host memory, so the table must be host-visible (the CPU's): a GPU's ring
 * (NCCL send/recv on device buffers) is not done yet and cp_ring_init refuses it by name.
 *
 * Layouts: a rank's q, out, dout, dq (B, Tl, NH·HS), k, v, dk, dv (B, Tl, NKV·HS), lse (B, NH,
 * Tl), Tl = attention_cp_rank_tokens(T, cp, rank), the rows of its first chunk then its second.
 * Dropout: struct attention_dropout as for the whole sequence (first at its head 0, row 0, key 0):
 * the draws are the whole-sequence kernel's.
 *
 * Traffic (comm counters, COMM_SEND; COMM_RECV the same): forward, cp − 1 hops, each rank sending
 * the k and v of the pair it holds to the next rank; backward, the same cp − 1 hops of k and v
 * and cp hops of the dk, dv accumulators, which travel with their pair and end at its home rank.
 * With T divisible by 2·cp a rank sends, per call, forward 2 (cp − 1) · B · (T / cp) · NKV · HS
 * reals and backward 2 (cp − 1) + 2 cp times that share (cp_ring_send_bytes gives the exact
 * count for any T). */
#ifndef TYCHO_RUNTIME_CP_H
#define TYCHO_RUNTIME_CP_H
#include <stddef.h>

#include "comm/comm.h"
#include "kernels.h"

struct cp_ring {
  struct comm_group *g; /* the cp group: ring order is group rank order */
  const struct kernel_ops *k; /* the table the blocks run on, and its context */
  void *kctx;
  int B, T, NH, NKV, HS;
  int Tl, maxTl;        /* this rank's tokens; the most any rank holds */
  real *kv[2];          /* received k | v pairs, double-buffered */
  real *acc[2];         /* backward: travelling dk | dv accumulators */
  real *dloc;           /* backward: this step's dk | dv share */
  real *pout, *plse;    /* forward: a block's partial before its merge */
  real *D;              /* backward: Σ dout · out per row */
  real *scratch;        /* the block kernels' */
  size_t cap_rows, cap_scratch; /* what the buffers were sized for: B · maxTl rows, scratch elements */
  int cap_NH, cap_NKV;  /* the heads they were sized for (cp_ring_heads takes fewer) */
};

/* Sizes (layout_cp_ring) and allocates the ring's buffers for B samples of T tokens on group g
 * from the runtime's allocator on its device `device` (alloc.h; the table's memory): the
 * transfers' buffers billed as comm, the blocks' as workspace; the blocks run on k with context
 * kctx. Refuses (-1, the reason naming T and cp) a T shorter than
 * 2·cp: every chunk holds at least one token; and (naming the table) a table that is not
 * host-visible. The buffers given to forward and backward are k's memory too. */
int cp_ring_init(struct cp_ring *r, const struct kernel_ops *k, void *kctx, int device, struct comm_group *g,
                 int B, int T, int NH, int NKV, int HS, char *err, size_t err_size);
void cp_ring_free(struct cp_ring *r);
/* out, lse (this rank's rows) ← the causal attention of q against the whole sequence's keys. The
 * next pair's transfer is started before each step's blocks are computed. Collective over g. */
int cp_ring_forward(struct cp_ring *r, real *out, real *lse, const real *q, const real *k,
                    const real *v, const struct attention_dropout *drop, char *err, size_t err_size);
/* dq, dk, dv (this rank's rows and keys) assigned, from the forward's out and lse. The pairs
 * travel as forward; each step's dk, dv share is computed while the travelling accumulator
 * arrives, then added to it and sent on. Collective over g. */
int cp_ring_backward(struct cp_ring *r, real *dq, real *dk, real *dv, const real *dout,
                     const real *q, const real *k, const real *v, const real *out,
                     const real *lse, const struct attention_dropout *drop, char *err,
                     size_t err_size);
/* The ring's buffers for B samples of T tokens from now on (an evaluation's shorter forward):
 * refuses (-1, naming T) a T shorter than 2·cp, and a shape whose rows or scratch the buffers
 * sized at init cannot hold. */
int cp_ring_reshape(struct cp_ring *r, int B, int T, char *err, size_t err_size);
/* The query and key/value heads of the calls from now on (a tensor-parallel rank's share of a
 * layer's heads, which may differ from layer to layer): at most those cp_ring_init sized the
 * buffers for, else -1 with the reason. */
int cp_ring_heads(struct cp_ring *r, int NH, int NKV, char *err, size_t err_size);
/* Bytes this rank sends in one forward (backward 0) or backward (1) call. */
size_t cp_ring_send_bytes(const struct cp_ring *r, int backward);

#endif
