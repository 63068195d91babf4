/* The trainer: `tycho run`. It owns what the model does not — data windows, micro-batches, the
 * loss scale, the optimizer step, evaluation, metrics, export — and drives the model through the
 * data-parallel layer (dp.h), which adds the reductions, gathers and sharding of mesh.dp and
 * zero, on a model split over the tp group (model.h, layout/tp_layout.h), always through the
 * executor (exec.h), which runs this rank's list of the plan's schedule — one stage's list when
 * mesh.pp = 1.
 *
 * Step s (0-based) trains on windows w = s·G + k (G = batch.global): data-parallel rank r of dp
 * takes k in [r·G/dp, (r+1)·G/dp), batch.micro at a time, so the windows of a step are the
 * serial run's whatever dp is. The loss is the mean cross-entropy over every target token of the
 * global batch: each micro-batch's backward is scaled by 1/(G·S), so the gradients summed over
 * micro-batches and ranks are the full batch's. Loss and gradient norm are sums over the group,
 * the same bits on every rank.
 *
 * Evaluation runs after step s when (s + 1) is a multiple of train.eval_every, and after the
 * last step; its records carry "step": s + 1 (optimizer steps done, as llm.c labels them). It
 * computes the mean loss over train.eval_batches batches of G validation windows of the data
 * source (data/source.h: data.val from window 0, unshuffled; for "addition", the held-out
 * problems in order), and when the source has held-out problems, the exact-match accuracy of
 * greedy decoding on the first max(256, eval_batches·G) of them (for "addition": prompt
 * "ddd+ddd=", 5 generated tokens compared with "dddd\n"). Evaluation is shared
 * out over the dp group: its chunks of batch.micro windows (or problems) go round-robin to the
 * ranks and the sums are added up; every rank runs the same number of forwards (a rank short of
 * work repeats chunk 0 and drops the result), as ZeRO-3's gathers need. */
#ifndef TYCHO_RUNTIME_TRAIN_H
#define TYCHO_RUNTIME_TRAIN_H
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "data/source.h"
#include "runtime/model/alloc.h"
#include "runtime/model/device.h"
#include "plan/plan.h"
#include "runtime/parallel/dp.h"
#include "runtime/model/model.h"
#include "runtime/model/optimizer.h"
#include "runtime/parallel/exec.h"

struct comm_group;

/* Return codes of trainer_open, trainer_replan and train_run: the house's 0 or −1, and −2 for an
 * error in the plan (the CLI exits 2 for it, 1 for −1). TRAIN_PLAN_ERROR is the agreement's
 * COMM_AGREE_PLAN_ERROR, so an agreed plan error is not prefixed with a rank (comm.h).
 * train_run also returns −3 for an input error (util/err.h: bad content in a file the user gave,
 * a lock held by another run; exit 2), agreed over the ranks like the others. */
enum train_status { TRAIN_OK = 0, TRAIN_RUNTIME_ERROR = -1, TRAIN_PLAN_ERROR = -2, TRAIN_INPUT_ERROR = -3 };

#define TRAIN_MIN_EVAL_PROBLEMS 256
#define TRAIN_MAX_PROBLEM_TOKENS 64 /* prompt plus answer of a held-out problem */

/* train.max_loss_jump: the losses of the last TRAIN_LOSS_WINDOW applied steps; the guard acts
 * once TRAIN_LOSS_WINDOW_MIN are known, and TRAIN_MAX_SKIPS skips in a row stop the run. */
enum { TRAIN_LOSS_WINDOW = 20, TRAIN_LOSS_WINDOW_MIN = 5, TRAIN_MAX_SKIPS = 10 };

struct train_loss_window {
  double loss[TRAIN_LOSS_WINDOW]; /* oldest first */
  int n;
  int skipped_in_a_row;
};

struct trainer {
  const struct plan *plan;   /* &own_plan */
  struct plan own_plan;      /* the trainer's copy of the plan it was opened with */
  struct comm_group *own_groups[PLAN_N_AXES]; /* trainer_open_on_world's, freed at close */
  struct model model;
  struct dp dp;              /* the data-parallel layer: layout, shards, reductions */
  struct comm_group *world;  /* every rank of the job (agreements, the memory bill), or NULL */
  struct comm_group *ep;     /* mesh.ep > 1: this rank's expert-parallel group (dp ranks), or NULL */
  struct comm_group *edp;    /* mesh.ep > 1: the dp ranks holding this rank's experts, or NULL */
  /* mesh.cp > 1: the dp × cp ranks holding the same parameters (this rank's tp and pp
   * coordinates), over which the gradients, the loss and the evaluation's sums are summed — the
   * dp layer's group (its shards span it); the cp ranks of a dp rank share its samples, each
   * computing its chunks of them. NULL without context parallelism (the dp group is the dp
   * layer's). */
  struct comm_group *dpcp;
  int data_rank, data_size;  /* this rank's dp coordinate and mesh.dp: its slice of the windows */
  struct comm_group *stage;  /* pp > 1 with zero ≥ 2: the ranks running this rank's schedule list
                              * (its pipeline rank's tp × dp ranks), where the step's allocation
                              * rounds are agreed (dp_passes.c); else NULL */
  struct comm_group *nccl[8]; /* comm nccl: the groups given an NCCL communicator here, closed first at close */
  int n_nccl;
  struct exec exec;          /* the executor of this rank's schedule list (every plan) */
  struct model_acts acts;    /* for batch.micro × batch.seq tokens */
  struct optimizer opt;      /* AdamW state for the elements this rank owns */
  struct data_source data;   /* token files, the synthetic corpus: windows and held-out problems */
  uint64_t dropout_seed;
  int *inputs, *targets;     /* (micro, S) */
  uint64_t *samples;         /* (micro) window index of each row */
  long long step;            /* the next step to run, 0-based */
  size_t reserved[ALLOC_N_CATEGORIES]; /* the memory bill, reserved at open (alloc_reserve) */
  struct ckpt_async *ckpt_pending; /* checkpoint.async: a save being written (ckpt.h), or NULL */
  struct train_loss_window recent; /* train.max_loss_jump's state (saved in checkpoints) */
  struct fault fault;        /* the first failure the model, dp layer or executor recorded in a
                              * call (trainer_failed), until trainer_clear_error */
  struct runtime_device device; /* where it computes: the CPU, or a CUDA context of its own */
};

struct train_step_stats {
  long long step;            /* 0-based */
  double loss;               /* mean over the global batch's target tokens */
  double lr;
  double grad_norm;          /* before clipping */
  int skipped;               /* train.max_loss_jump: the step was not applied (a loss spike) */
  double recent_loss;        /* with skipped: the mean of the recent applied steps' losses */
  int threads;               /* the CPU kernels' threads this step ran with */
  int threads_next;          /* and the next steps will (threads_adapt.h) */
  double others_cpus;        /* with threads_next != threads: the CPUs' worth other processes
                              * used of this rank's CPUs, by which it changed */
};


struct train_eval_stats {
  long long step;            /* optimizer steps done */
  int has_val_loss;
  double val_loss;
  int has_accuracy;
  double accuracy;           /* exact-match fraction */
  int n_problems;
  int stopped;               /* cut short by a signal (trainer_eval_until): no figures */
};

/* Checks that this build can run the plan (layout/supported.h), picks its device (device.h:
 * the CPU's selected kernel table, or for "cuda" — and "auto" where a CUDA device is visible — a
 * CUDA context of its own on device local rank % device count, whose table and memory the
 * trainer keeps; the selection is back to what it was on return), builds the
 * model (initialized from seeds.model, or loaded from init.from) split for the tp group and laid
 * out for the dp group (groups: the mesh groups by enum plan_axis, from comm_build_mesh_groups;
 * NULL: one rank without the comm layer), the optimizer and the data, and reserves the plan's
 * memory bill with the allocator, so that a step's buffers (ZeRO's gathered parameters and
 * gradient buckets) cannot meet the allocator's cap half-way through a step: a plan whose step
 * would not fit fails here, naming the category. Returns an enum
 * train_status with a one-line message; plan errors start with the field's location. On failure
 * nothing is left to free. Local: no collective (train_run agrees on the outcome). */
int trainer_open(struct trainer *t, const struct plan *p, struct comm_group *const *groups,
                 char *err, size_t err_size);
/* trainer_open on mesh groups of its own: builds the plan's tp, dp and pp groups on the job's
 * world (comm_build_mesh_groups, collective) and frees them at trainer_close, which is then
 * collective over the world too. So one process can close one plan and open another on the same
 * world with nothing left over (tests/mpi/mpi_reopen.c). */
int trainer_open_on_world(struct trainer *t, const struct plan *p, char *err, size_t err_size);
/* data.text (p->data.n_text): rank 0 of w (NULL: this process alone) tokenizes the texts into
 * their cache unless it is there, saying which on out (NULL: nothing), before the trainer opens
 * on p as tycho run does (data/text_cache.h). Collective over w and agreed: TRAIN_OK, or
 * TRAIN_PLAN_ERROR for an input error (a missing text, a bad tokenizer), TRAIN_RUNTIME_ERROR. */
int trainer_prepare_text(const struct plan *p, struct comm_group *w, FILE *out, char *err, size_t err_size);
/* Frees everything trainer_open allocated (and the groups of trainer_open_on_world). */
void trainer_close(struct trainer *t);
/* Moves a live trainer to another layout of the same model, in memory: what a checkpoint saved
 * now and loaded by a trainer of p would give, without files. Collective over t's world: every
 * rank calls it, at a step boundary (between trainer_step calls), with the same compiled plan p
 * (compiled for the same world; any mesh.tp / pp / dp, zero, stages, schedule, batch.micro,
 * recompute... may differ; the model may not). p may be t->plan; the caller keeps p.
 *
 * The state is the checkpoint's: the master weights and AdamW's two moments (each element once,
 * as ckpt_save would write it) and the step (data position, dropout masks, learning rate and bias
 * correction are functions of it and the seeds). Every rank copies its pieces into its segment
 * of one buffer, the piece lists are all-gathered and each segment broadcast from its rank (the
 * comm layer's counted model traffic on the world group: every rank's broadcast counter grows by
 * the whole state), so every rank holds the whole state — 3 × sizeof(real) bytes per parameter —
 * for the duration, beside the old trainer and then the new one. Refused above
 * TRAINER_REPLAN_LIMIT_BYTES per rank (TYCHO_REPLAN_LIMIT_MB overrides it: MiB, 0 for no bound),
 * or when the allocator cannot give the buffer, with the bytes named. Then t is closed (its
 * groups freed when it owned them) and opened on p on mesh groups of its own, which it frees at
 * trainer_close (trainer_open_on_world's semantics, even when t was opened with the caller's
 * groups), and loaded from the buffer by ckpt_load.c's overlap copies.
 *
 * Errors are values, agreed over the world (every rank returns the same status and the failing
 * rank's message, "rank R: ..."): TRAIN_PLAN_ERROR for a p that cannot take t's state (another
 * model: the field is named; another world size; a plan this build cannot run; ranks whose plans
 * differ), TRAIN_RUNTIME_ERROR otherwise.
 *   - A failure before t is closed (a refusal, the bound, out of memory, the exchange) leaves t
 *     the trainer it was, untouched and usable.
 *   - A failure after (opening p or loading into it) reopens t's old plan from the same buffer
 *     ("... the trainer is back on its old layout, at step N": usable again); if that fails too,
 *     t is closed (t->plan == NULL, nothing left allocated, no group held: trainer_close is then
 *     a no-op) and the message says so.
 * A trainer without a world (trainer_open with NULL groups) replans locally to another plan of
 * one rank. Returns TRAIN_OK with t a trainer of p at the same step. */
#define TRAINER_REPLAN_LIMIT_BYTES ((size_t)2 << 30) /* 2 GiB: ~178M parameters in fp32 */
int trainer_replan(struct trainer *t, const struct plan *p, char *err, size_t err_size);
/* Fills the windows of micro-batch mb of step t->step for this data-parallel rank: inputs and
 * targets (micro, seq) and each row's window index. */
void trainer_micro_batch(struct trainer *t, int mb, int *inputs, int *targets, uint64_t *samples);
/* The first failure's message (the executor's, data-parallel or tensor-parallel: t->fault), or NULL. It
 * stays until the caller handles it with trainer_clear_error. A call that failed leaves the
 * trainer usable: a step that stopped changed no parameter, optimizer state or step counter, and
 * ended every collective it started on every rank. */
const char *trainer_failed(const struct trainer *t);
/* Forgets the recorded failure (every rank that got it, alike), after the caller handled it. */
void trainer_clear_error(struct trainer *t);
/* Gradients of step t->step (zeroed first, accumulated over the micro-batches, summed over the
 * group): the step's list up to its OPTIMIZER, which it leaves out; returns the loss of the
 * global batch. The step counter does not move. A failure shows in trainer_failed (the loss is
 * then NaN: nothing read back from a backend with a pending failure is handed out). */
double trainer_forward_backward(struct trainer *t);
/* One training step: the step's whole list, whose OPTIMIZER computes the gradient norm,
 * clips, sets the learning rate and runs AdamW; then t->step++. Fails (runtime error) when the
 * loss or the gradient norm is not finite (the parameters are then left as they were), or when
 * the backend reports a failure (its status entry, asked after the step's compute and again
 * after the norm is read back): the message is the backend's, and stats carry no loss or norm. */
int trainer_step(struct trainer *t, struct train_step_stats *stats, char *err, size_t err_size);
/* Evaluation as described above, with the parameters as they are. A backend failure shows in
 * trainer_failed, with stats empty. */
void trainer_eval(struct trainer *t, struct train_eval_stats *stats);
/* trainer_eval that a signal can end: before each batch of windows or problems the ranks of the
 * world agree on whether *stop (a caught SIGINT/SIGTERM, 0 when none) is set on any of them; when
 * it is, every rank leaves at that same batch with stats->stopped set and no figures. The
 * asynchronous signals held back during the compute (kernels_compute_begin) are let in at that
 * point, so a signal sent during a long evaluation ends it at the next batch. Collective over
 * the world. */
void trainer_eval_until(struct trainer *t, struct train_eval_stats *stats, const volatile sig_atomic_t *stop);

/* The whole run: trainer_open, train.steps steps with progress lines on `out` every log.every
 * steps, evaluation, log.metrics JSON lines, export.path every export.every steps and at the
 * end, the memory bill's peaks. Rank 0 of the group writes (progress, metrics, export); `out`
 * is ignored elsewhere. Every failure, even one only a single rank saw (a data file it cannot
 * open, a metrics file it cannot write), is agreed over the group (comm_agree_err) where it happens,
 * so every rank returns the same status with the failing rank's message ("rank R: ..." when the
 * group is larger than one). Returns an enum train_status with a message in err. */
int train_run(const struct plan *p, struct comm_group *const *groups, FILE *out, char *err,
              size_t err_size);

/* What train_run calls between two steps, on every rank and at the same step (after the step's
 * agreement, checkpoint and trace): `tycho run --listen`'s REPL, which may inspect the trainer,
 * change its live settings and take steps itself. Collective; returns 0, or −1 with err (the run
 * stops with it, every rank alike). The run goes on from the trainer's step then, with its plan as
 * it is then (train.steps included). NULL fn: nothing (the default). Set before train_run. */
struct train_between {
  int (*fn)(void *ctx, struct trainer *t, char *err, size_t err_size);
  void *ctx;
};
void train_run_set_between(const struct train_between *b);

#endif
