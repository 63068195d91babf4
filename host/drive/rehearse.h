/* Rehearsal (docs/design.md, "Rehearsal and calibration"): a plan's exact layout run at toy scale
 * on CPU ranks, against the serial run of the same shrunk model — `tycho rehearse PLAN.lua`.
 *
 * What is kept: the mesh (tp, pp, dp and their order, so every rank's groups are the plan's),
 * the layer count and every layer's stage (the full-size plan's mapping, passed as an explicit
 * stages list, so that "balanced" cannot move a layer when the dims shrink), virtual stages, the
 * schedule, every module's split, sequence parallelism, recompute, ZeRO, bucket_mb, tied
 * embeddings, dropout, the seeds, the optimizer and batch.micro.
 *
 * What shrinks (rehearse_shrink): each head to opts.head_dim elements (dim = n_heads × head_dim;
 * the head counts, which carry the tensor-parallel divisibility, are kept), ffn_dim in the same
 * ratio to dim rounded up to a multiple of tp, the vocabulary to the 64 byte tokens of the
 * built-in addition corpus (rounded up to a multiple of tp when the plan's vocabulary is one;
 * one more when it is not, so that the padding the plan needs is padded here too), the sequence
 * to opts.seq (a multiple of tp when the plan's is), and the micro-batches per step per rank to
 * at most opts.micro_batches (default max(4, 2 · pp · virtual_stages): every phase of every
 * schedule — warm-up, steady state, cool-down — with the same count on every rank). Nothing grows:
 * a plan already smaller keeps its sizes. The rehearsal trains on device "cpu" in the plan's
 * precision — a bf16 plan in bf16 compute (products widened where the CPU has no bf16 ones,
 * kernels/bf16.h), gradients and master in fp32; in float64 in the proof build, which has no
 * bf16 — on the addition corpus, without init.from, export, checkpoints
 * or logs, and without learning-rate warm-up (so that a few steps move the weights enough for
 * the final weights to tell a layout bug from rounding).
 *
 * What is proved (rehearse_worker, on every rank of the job; rank 0 prints):
 *   - initial parameters bitwise those of the serial run;
 *   - every step's loss and gradient norm, the evaluation and the final parameters against the
 *     serial run (one rank, zero 0, no tp or pp) within this build's bounds — those the
 *     equivalence tests argue (tests/mpi/mpi_dp_equiv.c): fp32 loss 1e-5 relative, gradient norm
 *     1e-3, final weights 1e-5 relative L2; bf16 compute 1e-3, 1e-2 and 1e-3; float64 1e-10 for
 *     all; and the same bits on every rank;
 *   - the comm layer's counters over the last step, on every group of every rank, equal to the
 *     calls and bytes `tycho check` predicts for the rehearsed plan (traffic_predict);
 *   - every rank's allocator peaks, by category, equal to the bill `tycho check` prints
 *     (bill_predict), to the byte.
 * A --fault override changes the layout's run only (not the serial run, not the predictions):
 * a deliberate difference, to see what a failing rehearsal reports. */
#ifndef TYCHO_DRIVE_REHEARSE_H
#define TYCHO_DRIVE_REHEARSE_H
#include <stddef.h>
#include <stdio.h>

#include "comm/comm.h"
#include "real.h"
#include "plan/plan.h"
#include "layout/bill.h"
#include "runtime/train/packed.h"

struct trainer;
struct model;

#define REHEARSE_MAX_STEPS 64
#define REHEARSE_MAX_SETS 64   /* --set arguments */
#define REHEARSE_MAX_FAULTS 16 /* --fault arguments */

struct rehearse_options {
  const char *plan_path;
  int world;          /* ranks; 0: the plan's tp · pp · dp (dp a number) */
  int steps;          /* 0: 3 */
  int head_dim;       /* 0: 4 */
  int seq;            /* 0: 32 */
  int micro_batches;  /* 0: max(4, 2 · pp · virtual_stages) at most */
  int unsafe;
  size_t memory_limit;
  long long instruction_limit;
  int n_sets;
  const char *const *sets;   /* the user's --set, applied to the plan before it is shrunk */
  int n_faults;
  const char *const *faults; /* --fault: the layout's run only */
  const char *launcher;      /* the command that starts the ranks, "{n}" the count; NULL: default */
};

/* The overrides that shrink a compiled plan (see above), as --set texts, and a one-line account
 * of what changed. */
struct rehearse_shrink {
  int n_sets;
  char sets[24][1024];
  char *stages_set;   /* "stages={...}": the full-size plan's stage of every layer (malloc'd) */
  char summary[1024];
  int micro_batches;  /* per step per rank, rehearsed */
};
int rehearse_shrink(const struct plan *big, const struct rehearse_options *o, struct rehearse_shrink *out,
                    char *err, size_t err_size);
void rehearse_shrink_free(struct rehearse_shrink *s);

/* The launcher side (not under MPI): compiles the plan for its world, then starts
 * `LAUNCHER tycho rehearse --worker ...` with the same arguments (launch_self; o->launcher or
 * launch_default) and waits. `self` is this executable. Returns the exit code (2 for usage and
 * plan errors, with the message in err). */
int rehearse_launch(const struct rehearse_options *o, const char *self, char *err, size_t err_size);

/* The worker side: every rank of the job (the world's size must be the plan's). Rank 0 writes
 * the account to `out`. Returns 0 when everything held, 1 when something did not (rank 0 has
 * said what), 2 for a plan error (message in err), identical on every rank. Collective. */
int rehearse_worker(const struct rehearse_options *o, FILE *out, char *err, size_t err_size);

/* The parameters compared against the serial run: trainer_gather_packed and model_packed
 * (runtime/train/packed.h). */

/* The comm layer's counters of t's groups (tp, dp, pp, the tied embedding's; enum
 * traffic_group), to hold a step to check's prediction. groups: the mesh groups t runs on. */
void rehearse_counters(struct comm_group *const *groups, const struct trainer *t,
                       struct comm_counter out[TRAFFIC_N_GROUPS][COMM_N_OPS]);
/* The calls and bytes of every group and op since `before` (one step) against traffic_predict of
 * p for t's pipeline rank — what `tycho check` prints: 0 equal, 1 not (the first difference in
 * msg), −1 no prediction (why in msg). *calls: the step's collectives and messages. */
int rehearse_traffic_check(const struct plan *p, struct comm_group *const *groups, const struct trainer *t,
                           const struct comm_counter before[TRAFFIC_N_GROUPS][COMM_N_OPS],
                           unsigned long long *calls, char *msg, size_t msg_size);
/* The allocator's peaks by category against bill_predict of p for t's pipeline rank, to the
 * byte: 0 equal, 1 not (the first category in msg), −1 no bill. *worst_bytes: the largest
 * difference. */
int rehearse_bill_check(const struct plan *p, const struct trainer *t, double *worst_bytes, char *msg,
                        size_t msg_size);
/* ‖a − b‖ / ‖b‖ and max |a − b| / max |b| over n elements (in double). */
void rehearse_compare(const real *a, const real *b, size_t n, double *l2_rel, double *max_rel);

#endif
