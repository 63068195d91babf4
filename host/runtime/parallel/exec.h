/* The executor: the one way a step runs, for every plan. Each pipeline rank runs its own list of
 * the plan's schedule (host/sched: GPipe, 1F1B or interleaved 1F1B; with mesh.pp = 1 the list of
 * one stage, which 1F1B makes forward, backward, forward, backward ...), the very list `check`
 * simulates and prints, in order:
 *   FWD, BWD      a (stage, micro-batch) on its own activation slot, piece by piece through the
 *                 data-parallel layer (dp_run_pass: the ZeRO-3 gathers around each piece, and in
 *                 backward the bucket reductions as gradients become final: during each stage's
 *                 last backward under zero 0 and 1 and zero_every.grads = "step", during every
 *                 backward under zero_every.grads = "micro_batch");
 *   SEND_*, RECV_* non-blocking sends and receives on the pp group (a send overlaps what follows;
 *                 a receive is waited for by the FWD or BWD that reads it);
 *   RECOMPUTE     a marker: the layers recompute what their policy discarded one at a time
 *                 inside the BWD that follows (model_layer_backward);
 *   REDUCE_GRADS  after the rank's last one: the rest of the data-parallel reductions started
 *                 and waited for, and the tied embedding's gradient summed between the first and
 *                 last stage (dp_reduce_rest);
 *   OPTIMIZER     every send and receive ended, the loss brought from the last stage, then the
 *                 owner's update (exec_step's hook: the gradient norm, clipping, AdamW).
 *
 * Slots: one struct model_acts per (stage, micro-batch) in flight, each with room for its stage's
 * layers only, as many per stage as this rank's list ever has in flight (a slot is taken by the
 * receive of a stage's input, or its forward, and given back by the send of its input's
 * gradient, or its backward on the first stage), plus one with more than one pipeline rank, so
 * that a slot whose send is still in flight need not be waited for: the memory of activations
 * follows the schedule (GPipe holds all m micro-batches, 1F1B at most pp − rank, one stage under
 * 1F1B one). Slots share the workspace and the recompute area (model_acts_create_slot); the
 * first slot of the rank's first stage is the owner's own set, with room for all of the rank's
 * layers (evaluation runs them on it). A slot's activations keep the tokens and targets its
 * forward read (model_acts: tokens, targets), so the owner's batch buffers (host memory) are
 * only read while a forward runs; on a one-stage plan no slot needs a boundary gradient.
 *
 * Every pipeline rank computes the windows of any micro-batch itself (the data is a function of
 * the step and window), so only activations and gradients travel. The loss is computed on the
 * last stage and broadcast over the pp group: every rank reports the same numbers.
 *
 * Failures (a slot the list did not count, a send or receive that failed) are recorded in the
 * executor's fault (FAULT_OF(x): the trainer's), the first one kept; the list stops at a slot
 * failure. */
#ifndef TYCHO_RUNTIME_EXEC_H
#define TYCHO_RUNTIME_EXEC_H
#include <stddef.h>
#include <stdint.h>

#include "runtime/model/model.h"
#include "sched/sched.h"
#include "real.h"
#include "util/fault.h"

struct comm_group;
struct comm_request;
struct dp;
struct model;
struct model_acts;
struct plan;

/* What the executor works on, given by its owner (the trainer) at exec_open: the plan, the
 * model and its data-parallel layer, the first activation slot, the batch buffers and how to
 * fill them with micro-batch mb of the current step, the dropout seed, and where the step
 * counter lives. The executor knows no trainer. */
struct exec_env {
  const struct plan *plan;
  struct model *model;
  struct dp *dp;
  struct model_acts *acts;     /* slot 0 */
  int *inputs, *targets;       /* (micro, seq) host memory, filled by micro_batch */
  uint64_t *samples;           /* (micro) each row's window index (host memory) */
  uint64_t dropout_seed;
  const long long *step;       /* the step running */
  void (*micro_batch)(void *ctx, int mb, int *inputs, int *targets, uint64_t *samples);
  void *ctx;
};

struct exec_slot {
  int pool;                    /* the stage whose slot it is */
  int stage, mb;               /* −1: free */
  struct model_acts *acts;
  real *grad;                  /* (micro · Th · C) the gradient received before, and sent after,
                                * BWD; NULL on a one-stage plan */
  struct comm_request *recv, *send_act, *send_grad;
  bf16 *wire;                  /* a bf16 model's (2 · micro · Th · C): what the slot sends, rounded to
                                * bf16, then what it receives, widened once it has arrived (the pp
                                * wire); NULL in fp32 or on one stage */
  real *recv_to;               /* where the receive in flight is widened into (wire only) */
  size_t recv_n;
};

/* A split backward's held memory (model.h, struct model_split), one per micro-batch between its
 * BWD_B and its BWD_W on this rank: taken by B, given back by W. */
struct exec_split {
  int stage, mb;               /* −1: free */
  struct model_split s;
};

struct exec {
  struct exec_env env;
  struct comm_group *group;    /* the pp group, or NULL (one rank without the comm layer) */
  struct comm_group *embed;    /* tied embeddings: the first and last stage's ranks, else NULL */
  int size, rank;              /* of the pp group */
  struct sched sched;
  int n_slots, n_reduce;       /* slots; REDUCE_GRADS instructions in this rank's list */
  struct exec_slot *slots;     /* slots[0].acts is the owner's acts */
  int *in_index;               /* (n_stages) the residual index a stage reads: its first layer */
  double *flops;               /* (n_stages · 2) a micro-batch's forward, backward FLOPs per stage */
  int peak_slots;              /* most slots in use at once in the last step */
  int *last_bwd;               /* (n_stages) the micro-batch of each stage's last BWD (split: BWD_W)
                                * on this rank */
  int n_splits;                /* split lists: the most micro-batches past B at once (0: whole) */
  struct exec_split *splits;
  struct fault *fault;         /* where a failure is recorded: the trainer's, or NULL for own_fault
                                * (used on its own); read with FAULT_OF */
  struct fault own_fault;
};

/* Builds the schedule, the slots and the embedding group over env (whose model, dp layer and
 * acts exist; env is copied). Collective over the pp group when there is one (the embedding
 * group is split from it). 0 ok; nonzero with a message. */
int exec_open(struct exec *x, const struct exec_env *env, struct comm_group *group, char *err, size_t err_size);
void exec_close(struct exec *x);
/* One step: this rank's list, forward and backward of every micro-batch with the reductions,
 * then at OPTIMIZER optimizer(ctx, loss) when given (NULL: the step stops at its gradients,
 * complete and reduced). `loss` is Σ losses of this data-parallel rank's windows, the same on
 * every pipeline rank; it is also what exec_step returns. A hook's nonzero return is returned
 * through *hook_rc. Failures show in FAULT_OF(x) and the dp layer's (one fault under a trainer). */
double exec_step(struct exec *x, int (*optimizer)(void *ctx, double loss), void *ctx, int *hook_rc);
/* A forward alone through every stage, stage after stage (evaluation), on slot 0: Σ losses
 * (targets given) on every pipeline rank. */
double exec_forward(struct exec *x, const int *tokens, const int *targets, int B, int T);
/* After exec_forward without targets: model_head_argmax on the last stage, the tokens sent to
 * every pipeline rank. */
void exec_argmax(struct exec *x, const int *rows, int n, int *out);

#endif
