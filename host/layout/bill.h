/* The memory bill, predicted (docs/design.md, "The memory bill"): what the runtime allocates on a
 * rank, by the memory categories (layout/categories.h), for any plan and world, without allocating
 * it. It is computed from the same layout the runtime binds its memory to — the parameter table
 * this rank would build (params.h: TP blocks, pipeline stages; in outline), the data-parallel
 * buckets and shards (dp_buckets.h), the activation and workspace layout (acts.h, with the
 * recompute area), the pipeline's slots (pieces_stage_slots: the schedule's peak in flight) —
 * and, for what ZeRO 2 and 3 allocate and free during a step, the high-water mark of the passes'
 * order over the rank's schedule list, piece by piece as the runtime's passes run it (pieces.h):
 * under zero ≥ 2 with zero_every.grads = "micro_batch" the gradients of the unit computing and of
 * the one still reducing, with "step" the stages' whole gradients; under zero 3 the parameters of
 * the piece computing and of the one prefetched, with zero_every.params = "step" every unit the
 * rank's stages gathered until each stage's last backward.
 *
 * Element sizes are those of the runtime the plan runs on (plan_on_cpu). On the CPU, every buffer
 * is counted in the runtime's `real` as it carves it (4 bytes, 8 in the float64 proof build:
 * bill_element_bytes), a bf16 plan's bf16 activations as half as many reals, and a bf16 plan's
 * params are its fp32 weights (the master) plus the bf16 copies of all of them (under
 * zero 3 each gathered unit's, held and freed with it: layout/pieces.h); this is
 * byte for byte what the allocator bills, and the tests hold runs to it. A device = "cuda" plan
 * is billed with its precision's sizes over the CPU's layout: params in precision.compute, grads
 * in precision.grads, AdamW's m and v in fp32 plus an fp32 master copy when the compute type is
 * not fp32, activations, comm buffers and workspace in precision.compute. For an fp32 plan that
 * is what the CUDA runtime allocates (the layout's buffers, acts.h, as 4-byte floats); a bf16
 * cuda plan is refused by the runtime until the GPU keeps bf16 weight copies (a cuda plan's
 * layout has none yet, layout/params.c), so its figures are the plan's bf16 layout. Host memory
 * (the batch, the async snapshot) is in `host` too. Assumptions the numbers
 * carry: attention keeps O(T · d) per layer (its output and each query row's log-sum-exp: the
 * kernels are flash-style), evaluation and export add nothing beyond training (export
 * gathers the model on one rank: workspace there, not billed here). */
#ifndef TYCHO_LAYOUT_BILL_H
#define TYCHO_LAYOUT_BILL_H
#include <stddef.h>

#include "comm/comm.h"
#include "plan/plan.h"
#include "layout/categories.h"
#include "sched/sched.h"

struct bill {
  double bytes[ALLOC_N_CATEGORIES];
  double total;              /* Σ of the categories' peaks (each category's high-water mark) */
  int n_slots;               /* activation slots of the schedule (1 for one stage under 1F1B) */
  long long n_params;        /* parameters held (this rank's blocks, padding included) */
  /* What each category keeps allocated between steps (after a step has freed its buffers, before
   * the next allocates them): for params, grads and optimizer the model states, as the ZeRO paper
   * counts them (Rajbhandari et al. 2020: parameters, gradients, optimizer state; shards under
   * ZeRO, alignment padding included); for activations, workspace and comm (the pipeline's slot
   * gradients) the buffers the runtime allocates once at open; 0 for checkpoint (the async
   * snapshot lives from a save to its commit, across steps). For params, grads and comm,
   * bytes[k] − held[k] is the transient part, allocated and freed inside a step: gathered ZeRO-3
   * units (params), gradient buckets in flight with the tied embedding's (grads), reduce-scatter
   * outputs (comm), each at its peak. */
  double held[ALLOC_N_CATEGORIES];
  /* Of bytes[k], what a plan on a device with memory of its own (device = "cuda") keeps in host
   * memory, billed to the host (alloc.h: alloc_host_bytes): the async checkpoint's snapshot, the
   * trainer's batch (token ids, targets, sample indices: workspace the host fills); the rest of
   * bytes[k] is the device's (parameters, gradients, optimizer state, activations, the layout's
   * workspace, comm buffers). host_total: their Σ. All 0 on the CPU, whose memory is all the
   * host's, one bill. Not counted: host views of device memory (hostview.h), transient staging. */
  double host[ALLOC_N_CATEGORIES];
  double host_total;
};

/* A zero-bubble (split) schedule: 1 where the runtime runs its split backwards and the bill
 * walks the split list (bill_split_runs_zero), 0 where the bill reads it as whole backwards
 * (sched_merge_split) and `tycho check` prints what the W's hold apart (check/check_zb.c). */
int bill_split_runs(const struct plan *p);
/* The ZeRO stages the split backward runs under, with grads_step / params_step 1 for
 * zero_every.grads / .params = "step": ZeRO 0 and 1; ZeRO 2 with the gradients whole through the
 * step (each stage's last W reduces them, once a step); ZeRO 3 with the parameters gathered once
 * a step too (held to the stage's last W). Under "micro_batch" a micro-batch's buckets are
 * reduced and freed within its backward, while a W comes micro-batches after its B, and a W
 * would gather its units again (layout/supported.c refuses both). */
int bill_split_runs_zero(int zero, int grads_step, int params_step);
/* The bytes of one held area of pipeline rank pp_rank (its largest stage's
 * layout_split_held_elems in the products' operand dtype: bf16 on a bf16 plan, else the runtime's
 * reals) and, in *areas, how many the executor allocates for `list` (pieces_split_held); −1
 * (*areas 0) when there was no memory to lay the rank out (tp > 1). */
double bill_split_held_bytes(const struct plan *p, const struct sched_list *list, int pp_rank, int *areas);

/* The collectives of one training step on a rank's groups, as the comm layer counts them (calls
 * and bytes per group and enum comm_op): tp (tp_comm_list per micro-batch on the stage's layers,
 * the norm's partial sums), dp (bucket reductions, ZeRO's gathers, the loss and norm sums), pp
 * (the schedule's sends and receives, the loss broadcast, the norm's sums), the tied
 * embedding's group (its gradient), the expert-parallel group (the sparse layers' all-to-alls,
 * plan_ep_step_traffic) and the expert-data-parallel group (the dp ranks holding the same
 * experts: their buckets' reductions and gathers, which then leave the dp group's) and the cp
 * group (context parallelism's ring: each layer's k, v pairs forward and, in backward, the pairs
 * and the dk, dv accumulators; its sends and receives as messages). Under mesh.cp the dp group is
 * the dp layer's dp × cp ranks ("dpcp", which sums the gradients of a dp rank's cp ranks too),
 * and the tp and pp messages carry a cp rank's tokens. Groups of one move nothing. Evaluation is
 * not in a step. */
enum traffic_group {
  TRAFFIC_TP, TRAFFIC_DP, TRAFFIC_PP, TRAFFIC_EMBED, TRAFFIC_EP, TRAFFIC_EDP, TRAFFIC_CP, TRAFFIC_N_GROUPS
};
#define TRAFFIC_N_OPS COMM_N_OPS /* enum comm_op */
struct traffic {
  unsigned long long calls[TRAFFIC_N_GROUPS][TRAFFIC_N_OPS];
  unsigned long long bytes[TRAFFIC_N_GROUPS][TRAFFIC_N_OPS];
  /* 1: the group's bytes are exact only summed over its ranks (each rank's the group's mean): the
   * ep group of a dropless plan, whose combine sends back the rows the routing sent it
   * (plan_ep_exchange); its calls are exact on every rank */
  unsigned char summed_only[TRAFFIC_N_GROUPS];
};
const char *traffic_group_name(enum traffic_group g);
/* The traffic of pipeline rank pp_rank (dp and tp ranks alike; under mesh.cp, cp rank 0's: with
 * batch.seq % (2 · cp) ≠ 0 the cp ranks hold different counts of tokens and move different bytes,
 * traffic_predict_cp gives each). 0 ok; nonzero with a message. */
int traffic_predict(const struct plan *p, int pp_rank, struct traffic *out, char *err, size_t err_size);

/* Parameter elements pipeline rank pp_rank holds (its stages' blocks, vocabulary padding
 * included; with mesh.ep > 1 its ep rank's experts only), from the runtime's parameter table, and
 * of them the experts'. 0 ok; nonzero with a message. */
int bill_rank_params(const struct plan *p, int pp_rank, double *n_elems, double *expert_elems, char *err,
                     size_t err_size);

/* Bytes of one element of dtype d in plan p's runtime: for an fp32 plan (this build's CPU
 * runtime) sizeof(real), 8 in the float64 build (kernels/real.h); otherwise plan_dtype_bytes
 * (a bf16 plan's fp32 gradients and AdamW state are 4 bytes whatever this build computes in). */
double bill_element_bytes(const struct plan *p, enum plan_dtype d);

/* Bytes of one element of dtype d as the plan's runtime moves it between ranks where no bf16 wire
 * applies (the gradient reductions in fp32, the loss's statistics, the context-parallel ring):
 * the CPU runtime's comm layer moves reals (COMM_REAL: sizeof(real)), the GPU runtime's fp32 (its
 * reals). */
double traffic_element_bytes(const struct plan *p, enum plan_dtype d);
/* The bytes of an activation's element on the wire between tp, ep and pp ranks: a bf16 model's
 * move bf16 (runtime/parallel/tp.c, runtime/model/model_moe.c, runtime/parallel/exec.c); else as
 * traffic_element_bytes. */
double traffic_wire_element_bytes(const struct plan *p);
/* The bytes of one element of a tensor-parallel collective (tp_comm_list): a conversion of an
 * activation or its gradient moves bf16 in a bf16 model (runtime/parallel/tp.c); the
 * cross-entropy's statistics and the gains' partial gradients move as traffic_element_bytes. */
struct tp_comm;
double traffic_tp_element_bytes(const struct plan *p, const struct tp_comm *c);

/* precision = { compute = "bf16", grads = "bf16" }: the gradients a rank keeps are bf16 and the
 * data-parallel gradient reductions (and a tied embedding's sum between the stages) move bf16
 * (the runtime's dp.h, ZeRO 2 and 3); each backward's per-unit sums are still fp32. */
int bill_grads_bf16(const struct plan *p);

/* The bill of pipeline rank pp_rank (every tp and dp rank of a stage gets the same one: shards
 * are equal by construction). 0 ok; nonzero with a message. */
int bill_predict(const struct plan *p, int pp_rank, struct bill *out, char *err, size_t err_size);

/* What the bills and traffic of a plan's pipeline ranks share: the plan's schedule
 * (sched_from_plan), built once rather than for each rank, so that predicting every rank of a
 * pipeline costs each its own list and layers. failed: it could not be built (err says why; each
 * prediction then fails with that message, as it would alone). Valid while the plan is. */
struct bill_shared {
  struct sched s;
  int failed;
  char err[512];
};
void bill_shared_open(struct bill_shared *sh, const struct plan *p);
void bill_shared_close(struct bill_shared *sh);
/* bill_predict and traffic_predict with the plan's shared schedule (sh from bill_shared_open on
 * the same plan; NULL: build it), the same figures. */
int bill_predict_shared(const struct plan *p, const struct bill_shared *sh, int pp_rank, struct bill *out,
                        char *err, size_t err_size);
int traffic_predict_shared(const struct plan *p, const struct bill_shared *sh, int pp_rank, struct traffic *out,
                           char *err, size_t err_size);
/* The same for cp rank cp_rank of pipeline rank pp_rank (sh may be NULL). */
int traffic_predict_cp(const struct plan *p, const struct bill_shared *sh, int pp_rank, int cp_rank,
                       struct traffic *out, char *err, size_t err_size);

#endif
