/* Data parallelism and ZeRO stages 1, 2 and 3 (plan fields mesh.dp, zero, bucket_mb) over the
 * dp group. Every rank of the group holds the same model; each trains on its slice of the
 * step's windows; gradients are summed over the group in buckets while backward still runs.
 *
 * The flat layout. The parameters are laid out in buckets: consecutive parameters, in the
 * order backward finishes their gradients (head first, embedding last), until a bucket holds
 * bucket_mb MiB; under ZeRO 2 and 3 a bucket also never spans two units (the embedding, one
 * layer, the head with the final norm), so a unit's gradients are reduced, and under ZeRO-3
 * its parameters gathered, on their own. Each bucket is padded to size · share elements, and
 * rank r owns the slice [start + r·share, start + (r+1)·share) of every bucket: its shard is
 * those slices, packed in bucket order (Megatron's distributed-optimizer layout; with one bucket
 * it is one contiguous range of the flattened parameters).
 *
 * What each rank keeps, by stage (size = dp):
 *   zero 0  params, grads and AdamW state for every element; all-reduce per bucket.
 *   zero 1  AdamW state for its shard only; all-reduce per bucket; each rank updates its
 *           shard, then all-gather per bucket brings every rank the new parameters.
 *   zero 2  + gradients for its shard only, held between steps. Within a step, by the plan's
 *           zero_every.grads:
 *           "micro_batch": every backward reduce-scatters; a bucket's full gradients exist from
 *             the backward that first writes them until its reduce-scatter ends, then are added
 *             into the shard. One unit's reductions are in flight at a time, overlapping the
 *             next unit's backward: at most two units' gradients besides the shard, and no rank
 *             ever holds the whole gradient (DeepSpeed's choice);
 *           "step": the whole gradients of this rank's stages are allocated at the step's first
 *             backward and accumulate over its micro-batches, as under zero 1; each stage's last
 *             backward reduce-scatters its buckets straight into the shard as they become final,
 *             and the whole gradients are freed when the step's reductions end (PyTorch's
 *             pipeline schedules under FSDP). One reduce-scatter per bucket per step.
 *   zero 3  + parameters for its shard only. A unit's parameters are all-gathered just before a
 *           piece reads them, the next piece's gather started (non-blocking) before computing
 *           the current one; by zero_every.params they are freed after the piece ("micro_batch":
 *           gathered again for every forward and backward) or kept until the stage's last
 *           backward of the step ("step": each unit gathered once per step, the stage's whole
 *           parameters held meanwhile; torchtitan's choice with pipeline stages).
 * Under zero 0 and 1 only each stage's last backward reduces (gradients accumulate locally
 * before), all-reducing every bucket of the layout (those of another stage's parameters move 0
 * bytes); under zero 2 and 3 a pass reduces only the units its stage computes. A tied embedding
 * held by the first and the last pipeline stage is summed between the two after the data-parallel
 * reductions (zero ≥ 2: the shards' slices, 1/dp of it) or before them (zero 0, 1: the whole
 * gradient).
 *
 * Expert parallelism (mesh.ep > 1): the model's table holds this rank's experts only, and the
 * layout puts experts in buckets of their own (dp_bucket.expert), shared by the edp group instead
 * of the dp group: the dp / ep ranks holding the same experts. Such a bucket's share is 1/(dp/ep)
 * of it, its rank's slice that of its edp rank, and its collectives go over edp; everything above
 * holds for it with edp in place of dp.
 *
 * Memory comes from the runtime allocator: parameters (full, shard, gathered units, the bucket
 * being initialized) as "params", gradients (full, shard, buckets in flight) as "grads", AdamW
 * state as "optimizer", reduce-scatter outputs as "comm", the export's gathered copy on rank 0
 * as "workspace".
 *
 * A NULL group is a group of one without the comm layer (unit tests, benchmarks): collectives
 * become the copies they are on one rank; everything else runs the same code. */
#ifndef TYCHO_RUNTIME_DP_H
#define TYCHO_RUNTIME_DP_H
#include <stddef.h>
#include <stdint.h>

#include "plan/plan.h"
#include "layout/dp_buckets.h"
#include "runtime/model/model.h"
#include "runtime/model/optimizer.h"

struct comm_group;
struct comm_request;

/* Lays m's parameter table out in buckets for a group of `size` (layout/dp_buckets.h, on
 * m->table), then sets every p->offset and m->n_elems from it. 0 ok; nonzero (out of memory)
 * with a message. */
int dp_layout_build(struct dp_layout *l, struct model *m, int size, int zero, double bucket_mb,
                    char *err, size_t err_size);

/* A bucket during a step. */
struct dp_bucket_state {
  real *grads;               /* zero 2, 3: its full gradients while it fills and reduces (grads
                              * bf16: followed by their bf16 image, n_elems more bf16) */
  real *recv;                /* zero 2, 3: its reduce-scatter output (grads bf16: bf16 elements) */
  struct comm_request *req;   /* its reduction in flight */
};

enum dp_unit_hold { DP_UNIT_FREE, DP_UNIT_GATHERING, DP_UNIT_HELD };

/* A unit's parameters on this rank: always held under zero 0-2; gathered on demand under 3. */
struct dp_unit_state {
  enum dp_unit_hold hold;
  real *params;              /* zero 3: its buckets' parameters, gathered */
  bf16 *copies;              /* zero 3, bf16 models: its parameters' bf16 copies, rounded once
                              * the gather completes (pieces_unit_bf16's span), or NULL */
  size_t copies_start;       /* where they start among the layout's copies (bf16_offset's origin) */
  struct comm_request **reqs; /* (its buckets) gathers in flight */
};

struct piece;

struct dp {
  struct dp_layout layout;
  struct comm_group *group;   /* the dp group; NULL: a group of one without the comm layer */
  struct comm_group *pp_group; /* the pipeline group (gradient norm, export), or NULL */
  int size, rank, zero;
  struct comm_group *edp;     /* mesh.ep > 1: the dp ranks holding this rank's experts (dp rank
                               * r with r mod ep equal; its rank r / ep), or NULL (one) */
  int edp_size, edp_rank;
  struct model *model;
  real *shard_params;        /* (n_shard) where dp_master_sharded: this rank's fp32 parameters, the
                              * master (zero 3; a bf16 model's from zero 1 on, billed "optimizer") */
  bf16 *shard_bf16;          /* (n_shard) zero 3, bf16 models: the bf16 copies of that shard, which
                              * the units' gathers move */
  real *shard_grads;         /* (n_shard) zero 2, 3: this rank's summed gradients (fp32 grads) */
  bf16 *grads_gbf16;         /* (n_elems) zero 0, 1 with precision.grads = "bf16": the whole
                              * gradients in bf16 (in place of the model's grad_memory). Each unit's
                              * backward sums its micro-batch's gradients in an fp32 area of its own
                              * (unit_grads, with a bf16 image after it); once the unit is final
                              * for the pass the area is rounded into the image and added in
                              * (accumulate_bf16), the same two roundings a ZeRO-2 bucket gets over
                              * one rank; the stage's last backward all-reduces the buckets in bf16 */
  real **unit_grads;         /* (n_units) bf16 gradients kept whole (zero 0, 1; zero 2, 3 with
                              * zero_every.grads = "step"): the areas of the units
                              * whose backward is running (a tied embedding's from the head's
                              * backward to the embedding's), else NULL */
  bf16 *shard_gbf16;         /* (n_shard) zero 2, 3 with precision.grads = "bf16" (m->grads_bf16):
                              * the same in bf16. Each unit's backward still sums its micro-batch's
                              * gradients in fp32 (the bucket); the bucket is rounded to bf16 (an
                              * image beside it, in the same block), reduce-scattered in bf16 and
                              * the share added into this shard (accumulate_bf16: one rounding);
                              * the gradient norm and AdamW widen one bucket's share at a time into
                              * a scratch of the largest share (billed "grads" while they run) */
  int grads_step;             /* zero 2, 3: zero_every.grads = "step" (0: "micro_batch") */
  int params_step;            /* zero 3: zero_every.params = "step" (0: "micro_batch") */
  real *step_grads;           /* (n_elems) grads_step: the whole gradients during a step, or NULL */
  bf16 *step_gbf16;           /* (n_elems) grads_step with bf16 gradients: the same in bf16, summed
                               * unit by unit as grads_gbf16 is (unit_grads), then reduce-scattered
                               * in bf16 into the bf16 shard */
  struct dp_bucket_state *buckets;
  struct dp_unit_state *units;
  int reducing;               /* this backward reduces its buckets as they become final */
  int next_bucket;            /* the next bucket to reduce (they go from the last to the first) */
  int *inflight;              /* (n_buckets) buckets whose reduction is started, oldest first */
  struct comm_request **gather_reqs; /* (n_buckets) zero 1, 2: the update's all-gathers */
  struct piece *pieces;       /* (n_layers + 2) a pass's pieces (dp_passes.c) */
  int n_inflight;
  long long step;             /* for the comm records */
  struct comm_group *agree;   /* where a step's allocation rounds are agreed (the trainer's world;
                               * NULL: no peers to agree with) */
  int round_failed;           /* this rank could not allocate in the current round: its vote at
                               * the round's end, not yet a failure of the step */
  char round_what[160];       /* what it was allocating */
  int aborted;                /* the agreed end of a failed round: the pass stopped, on every rank
                               * alike (the executor stops its list on it) */
  struct fault *fault;        /* where a failed collective or round is recorded: the trainer's, or
                               * NULL for own_fault (used on its own); read with FAULT_OF */
  struct fault own_fault;
};

/* Whether this rank keeps only its shard of the fp32 weights (d->shard_params): ZeRO 3, and a bf16
 * model from ZeRO 1 on over more than one dp rank (layout/dp_buckets.h). Everything that reads or writes the fp32 weights of
 * the whole layout (init, checkpoints, export, views) takes the shard's path where it holds. */
static inline int dp_master_sharded(const struct dp *d)
{
  return dp_master_is_sharded(d->zero, d->model->bf16, d->size);
}

/* Takes m from model_create_table, lays it out for the group (NULL: a group of one), allocates
 * what this rank keeps for `zero` and points the parameters there. 0 ok; nonzero with a message. */
int dp_open(struct dp *d, struct model *m, struct comm_group *group, struct comm_group *edp, int zero,
            double bucket_mb, char *err, size_t err_size);
/* Frees what dp_open allocated (the model's memory included; the table stays with the model). */
void dp_close(struct dp *d);
/* Fills the parameters: from init.from when set, else model_init with seeds.model. Under ZeRO-3
 * one bucket at a time, keeping this rank's share. Every rank gets the values of a serial run,
 * bit for bit. 0 ok; nonzero with a message. */
int dp_init_params(struct dp *d, const struct plan *p, char *err, size_t err_size);
/* bf16 models: when the copies do not hold the fp32 weights rounded (m->bf16_fresh is 0: after
 * init, a load, anything but AdamW wrote weights), rounds them again. Where the master is
 * sharded each rank rounds its shard and the copies are all-gathered (bf16) over the group
 * (zero 1, 2), or kept as the shard's (zero 3): collective over the dp group, every rank calling
 * it at the same point. 0 ok; -1 (FAULT_OF(d)). */
int dp_bf16_refresh(struct dp *d);
/* AdamW state elements this rank keeps: the flat layout (zero 0) or the shard. */
size_t dp_state_elems(const struct dp *d);

/* ---- one step's passes (dp_passes.c), driven by the executor (exec.h) ---- */
/* One FWD or BWD of a stage: its pieces (pieces.h) with the gathers and reductions the ZeRO
 * stage needs. */
struct dp_pass {
  const struct plan_stage *stage;
  int backward;
  struct model_acts *a;
  const int *tokens, *targets;       /* targets: NULL for a forward without loss */
  const struct model_dropout *dropout; /* NULL: none (evaluation) */
  int B, T;
  real loss_scale;                   /* backward: the head's gradient scale */
  int last;        /* backward: the stage's last of the step, on a split list its last W (its
                    * buckets reduce there as their gradients become final under zero 0, 1 and
                    * zero_every.grads = "step"; zero_every.params = "step" frees the stage's
                    * gathered units there) */
  int embed_waits; /* backward: a tied embedding's gradient is summed between the stages (in
                    * dp_reduce_rest); under zero 0, 1 before its bucket may reduce */
  int in_step;     /* a pass of a training step's list (0: evaluation, which keeps nothing) */
};
/* Room for a stage's pieces (d->pieces), so a pass allocates no list. 0, or -1. */
int dp_pieces_alloc(struct dp *d);
/* Zeroes the gradients this rank keeps, records the step for the comm records and readies the
 * bucket reductions (the last bucket first). */
void dp_step_begin(struct dp *d, long long step);
/* Runs pass ps. `then`: the first piece of the compute that follows it on this rank when that
 * is the same (stage, micro-batch) (pieces_follower: its units are gathered while ps's last piece
 * computes, and kept), else NULL (every gathered unit is freed at the end). Returns the loss sum
 * of a forward through the head with targets, else 0. */
double dp_run_pass(struct dp *d, const struct dp_pass *ps, const struct piece *then);
/* After a pass stopped (d->aborted): ends every gather and reduction in flight and frees the
 * step's buffers (gathered units, buckets, reduce-scatter outputs), so the next step starts as
 * from dp_open's state. The same calls on every rank (the rounds were agreed). The recorded
 * failure (FAULT_OF(d)) stays for the caller. */
void dp_pass_abort(struct dp *d);
/* After the rank's last backward: starts every bucket reduction not yet started, waits for all,
 * and sums a tied embedding's gradient between the first and last pipeline stage over `embed`
 * (their group, or NULL: none); then each rank holds the summed gradients it keeps. Every rank of
 * the group makes the same calls in the same order. 0 ok; -1 when a collective failed (FAULT_OF(d)). */
int dp_reduce_rest(struct dp *d, struct comm_group *embed);

/* ---- after backward (dp_optim.c) ---- */
/* out[i] = Σ over the group of local[i], summed in rank order: the same bits on every rank.
 * 0 ok; -1 (FAULT_OF(d)). n ≤ 8. */
int dp_sum(struct dp *d, const double *local, double *out, int n);
/* The global gradient norm: every rank sums the squares of its share of each bucket, then
 * dp_sum. The same value on every rank. Negative when a collective failed. */
double dp_grad_norm(struct dp *d);
/* AdamW on the elements this rank owns (all of them under zero 0), reading each gradient times
 * grad_scale (clipping's coefficient, 1 when not clipping; the gradient memory unchanged), then
 * under zero 1 and 2 the all-gather that gives every rank every new parameter. 0 ok; -1
 * (FAULT_OF(d)). */
int dp_update(struct dp *d, struct optimizer *o, long long step, double lr, real grad_scale);
/* Collective: every parameter in the flat layout on rank 0 of the group (*full; NULL on the
 * others), for export and tests; with expert parallelism on every rank of dp rank 0's ep group
 * (each rank 0 of its experts' edp group), holding its own experts. Under zero 0-2 that is the
 * model's own memory; under zero 3 a gathered copy that dp_gather_params_free releases. 0 ok; -1
 * (FAULT_OF(d)). */
int dp_gather_params(struct dp *d, real **full);
void dp_gather_params_free(struct dp *d, real *full);
/* Collective over the dp, TP, ep and pipeline groups: the whole model (every parameter unsplit,
 * every expert, in a model of its own with a group of one) on rank 0 of all; *have says where. Free with model_free.
 * 0 ok; nonzero with a message. */
int dp_gather_whole(struct dp *d, struct model *whole, int *have, char *err, size_t err_size);
/* Collective: exports every parameter from rank 0 (weights_export; hf_shard_bytes > 0: a Hugging
 * Face folder, weights_export_hf, with the tokenizer files and generation config of hf_extras).
 * 0 ok; nonzero with a message on the rank that failed. */
struct hf_extras;
int dp_export(struct dp *d, const char *path, uint64_t hf_shard_bytes, const struct hf_extras *hf_extras, char *err,
              size_t err_size);

/* ---- inside the dp module ---- */
/* Records the failed collective (comm_error()) in FAULT_OF(d), unless a failure is recorded
 * already; returns -1. */
int dp_fail(struct dp *d, const char *what);
/* Points bucket b's parameters' data (or grad) at base + (offset − bucket start); NULL unbinds.
 * The views are refreshed by the caller (model_bind_views). */
void dp_bind_bucket(struct dp *d, int b, real *base, int grads);
/* Bucket b's group (the dp group, or for an expert bucket the expert-data-parallel one), its size
 * and this rank's place in it: the rank owns [start + rank·share, start + (rank + 1)·share). */
struct comm_group *dp_bucket_group(const struct dp *d, int b);
int dp_bucket_size(const struct dp *d, int b);
int dp_bucket_rank(const struct dp *d, int b);
/* Bucket b's collectives over its group (a copy, or nothing, in a group of one). */
int dp_all_reduce(struct dp *d, int b, real *buf, size_t n_elems, struct comm_request **req);
int dp_all_gather(struct dp *d, int b, const real *send, real *recv, size_t n_elems,
                  struct comm_request **req);
int dp_reduce_scatter(struct dp *d, int b, const real *send, real *recv, size_t n_elems,
                      struct comm_request **req);
/* dp_all_gather of bf16 elements (a bf16 model's copies). */
int dp_all_gather_bf16(struct dp *d, int b, const bf16 *send, bf16 *recv, size_t n_elems,
                       struct comm_request **req);
/* dp_all_reduce and dp_reduce_scatter of bf16 elements (precision.grads = "bf16"), summed as
 * comm.h's bf16 sum. */
int dp_all_reduce_bf16(struct dp *d, int b, bf16 *buf, size_t n_elems, struct comm_request **req);
int dp_reduce_scatter_bf16(struct dp *d, int b, const bf16 *send, bf16 *recv, size_t n_elems,
                           struct comm_request **req);

#endif
