/* Predicted step time and MFU of a plan on a cluster (plan/cluster.h), for `tycho check
 * --cluster` and `tycho tune`. The model, stated in the output too:
 *   - compute: the plan's forward FLOPs per token (plan_layer_flops: q, k, v, o, the causal
 *     attention core, SwiGLU; the LM head on the last stage), divided by tp, times micro·seq
 *     tokens per micro-batch; backward twice the forward; recompute what its parts cost again;
 *     at peak_tflops × efficiency.compute;
 *   - tensor-parallel collectives: tp_comm_list's, each with the ring cost (all-reduce
 *     2(n−1)/n·bytes/bw + 2(n−1)·latency, all-gather and reduce-scatter (n−1)/n·bytes/bw +
 *     (n−1)·latency) at bandwidth × efficiency.comm (the op's own bandwidth and latency where
 *     the link states them: cluster.h), on the intra-node link when the group fits
 *     in a node under the mesh order, else the inter-node one; not overlapped (the executor
 *     blocks on them);
 *   - expert parallelism (mesh.ep, docs/moe.md): each sparse layer's all-to-alls per micro-batch
 *     (plan_ep_exchange: dispatch and combine in forward, their duals in backward, the count
 *     exchange first when dropless), each of B bytes from a rank over the ep group of n ranks at
 *     (n−1)/n · B / bw + (n−1) · latency (nccl-tests' all-to-all: bus bandwidth = algorithm
 *     bandwidth × (n−1)/n, a rank's own block not crossing the link; one message per peer) at
 *     the link's bandwidth × efficiency.comm, on the intra-node link when the ep group (ep
 *     consecutive dp ranks, dp's stride apart: tp × ep ranks under the default order) fits in a
 *     node, else the inter-node one; not overlapped (the sparse layer waits for its rows). The
 *     experts' FLOPs are not divided by ep: a rank computes its experts for its ep group's tokens,
 *     on average (balanced routing) the work it would do for its own tokens on all experts;
 *   - context parallelism (mesh.cp): a rank computes, sends to its tp group and across stage
 *     boundaries its seq/cp tokens of each sequence (its two balanced chunks: a 1/cp share of the
 *     causal core too); the ring, per layer and micro-batch, hides each hop's transfer of a k, v
 *     pair (2 · micro · seq/cp · NKV/tp · HS elements at the cp group's link: t = bytes / (bw ×
 *     efficiency.comm) + latency) behind the attention block on the pair held (b, the layer's
 *     core / (tp · cp)): forward (cp − 1) · max(0, t − b) exposed, backward (a pair and an
 *     accumulator a hop, twice the compute) (cp − 1) · max(0, 2t − 2b) plus the accumulators'
 *     last hop t, a layer whose recompute reruns the core its forward's again, in the stage's
 *     time; overlap = false exposes every transfer. The dp layer's group is dp × cp;
 *   - pipeline: the schedule simulator runs the rank lists with these per-stage times and each
 *     stage boundary's send at its link's cost: makespan = compute + TP comm + bubble;
 *   - data parallel: the gradient all-reduce (zero 0, 1) or reduce-scatters (zero 2, 3) of a
 *     rank's parameters and, from zero 1, the parameter all-gather after the update; the
 *     reduction overlaps the last micro-batch's backward (with pipeline stages, each stage's
 *     last; zero 2, 3: every micro-batch's), the all-gather is exposed; ZeRO-3's parameter
 *     gathers overlap compute (prefetch) and are exposed only where longer;
 *   - the work beside the matmuls, where the cluster file states it (overheads, cluster.h; else
 *     it costs nothing): the attention core's FLOPs at attention_tflops instead of peak ×
 *     efficiency; per token and layer, pointwise_ns × (dim / tp under sequence parallelism, else
 *     dim, + ffn_dim / tp) for the norms, rotary, residual adds, SwiGLU and copies (a third in
 *     the forward, two thirds in the backward; a layer with recompute runs its third again),
 *     the embedding and the loss folded in; the optimizer step (norm, clipping, AdamW) as
 *     optimizer_ns × the parameter elements the rank updates (its stage's, over dp from zero 1),
 *     after the makespan and not overlapped;
 *   - with overlap = false (a CPU rank's comm thread progresses MPI on the rank's own core) no
 *     collective hides behind compute: the dp reduction, the gathers and ZeRO-3's prefetched
 *     gathers are all exposed;
 *   - shared devices: with `nodes` stated and more ranks than nodes × gpus_per_node, every rank's
 *     compute, pointwise and optimizer time is multiplied by ranks / devices (they time-slice
 *     the cores) and every group is on the intra-node link; the collectives keep their cost;
 *   - MFU = model FLOPs (3 × forward FLOPs × tokens, recompute not counted) / (step time ×
 *     world × peak). */
#ifndef TYCHO_CHECK_COST_H
#define TYCHO_CHECK_COST_H
#include <stddef.h>

#include "plan/cluster.h"
#include "plan/plan.h"

struct cost_group {
  int intra;            /* the group fits in a node */
  double total;         /* seconds of communication per step on it */
  double exposed;       /* of which not hidden behind compute */
  double bytes;         /* per step, per rank */
};

struct cost {
  double compute;       /* seconds of compute per step on the busiest pipeline rank (recompute in) */
  double bubble;        /* pipeline idle time of that rank per step */
  double pointwise;     /* of compute: the non-matmul work (overheads.pointwise_ns), per step */
  double optimizer;     /* the optimizer step (overheads.optimizer_ns), after the makespan */
  double share;         /* ranks per device: 1, or more where the job oversubscribes (nodes) */
  struct cost_group tp, dp, pp, ep, cp; /* cp: the ring attention's transfers (exposed: past its blocks) */
  /* ep.bytes: (n−1)/n of the all-to-alls' send buffers, what leaves the rank */
  double step;          /* predicted seconds per step */
  double tokens_per_s;
  double model_flops;   /* per step, the whole job */
  double mfu;
};

/* Bytes of one element of dtype d in the runtime the figures of `tycho check`, `tycho tune` and
 * this model describe, by the memory bill's rule (host/layout/bill.h): for a plan on this
 * build's CPU runtime (plan_on_cpu) what that runtime holds and moves, bill_element_bytes (an
 * fp32 element is a `real`, 8 bytes in the float64 build); for a device = "cuda" plan the GPU
 * runtime's, plan_dtype_bytes (2 for bf16, 4 for fp32). Every element size the check code uses
 * comes from here, so its numbers describe one runtime. */
double check_element_bytes(const struct plan *p, enum plan_dtype d);

/* Elements the pointwise charge counts per token and layer on one rank (see above). */
double cost_pointwise_elems(const struct plan *p);

/* 0 ok; nonzero with a message. */
int cost_predict(const struct plan *p, const struct cluster *c, struct cost *out, char *err, size_t err_size);

#endif
