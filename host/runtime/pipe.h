/* Pipeline stages (mesh.pp > 1): the executor of host/sched's instruction lists. Each pipeline
 * rank runs its own list of the plan's schedule (GPipe, 1F1B or interleaved 1F1B) in order:
 * FWD and BWD of a (stage, micro-batch) on its own activation slot, SEND_ACT / RECV_ACT and
 * SEND_GRAD / RECV_GRAD as non-blocking sends and receives on the pp group (a send overlaps what
 * follows; a receive is waited for by the FWD or BWD that reads it), RECOMPUTE as a marker (the
 * layers recompute what their policy discarded one at a time inside the BWD that follows,
 * model_layer_backward), REDUCE_GRADS — after the rank's last one — the tied embedding's
 * gradient summed between the first and last stage and the rest of the data-parallel
 * all-reduce, and OPTIMIZER left to the trainer. The data-parallel buckets start as soon as their
 * gradients are final: during each stage's last backward, after the head and after each layer
 * (a tied embedding's bucket waits for its sum between the stages).
 *
 * Slots: one struct model_acts per (stage, micro-batch) in flight, each with room for its stage's
 * layers only, as many per stage as this rank's list ever has in flight (a slot is taken by the
 * receive of a stage's input, or its forward, and given back by the send of its input's
 * gradient, or its backward on the first stage) plus one, so that a slot whose send is still in
 * flight need not be waited for: the memory of activations follows the schedule (GPipe holds all
 * m micro-batches, 1F1B at most pp − rank). Slots share the workspace and the recompute area
 * (model_acts_create_slot); the first slot of the rank's first stage is the trainer's own set,
 * with room for all of the rank's layers (evaluation runs them on it).
 *
 * Every pipeline rank computes the windows of any micro-batch itself (the data is a function of
 * the step and window), so only activations and gradients travel. The loss is computed on the
 * last stage and broadcast over the pp group: every rank reports the same numbers. */
#ifndef TYCHO_RUNTIME_PIPE_H
#define TYCHO_RUNTIME_PIPE_H
#include <stddef.h>
#include <stdint.h>

#include "sched/sched.h"
#include "real.h"

struct comm_group;
struct comm_request;
struct dp;
struct model;
struct model_acts;
struct plan;

/* What the executor works on, given by its owner (the trainer) at pipe_open: the plan, the
 * model and its data-parallel layer, the first activation slot, the batch buffers and how to
 * fill them with micro-batch mb of the current step, the dropout seed, and where the step
 * counter lives. The executor knows no trainer. */
struct pipe_env {
  const struct plan *plan;
  struct model *model;
  struct dp *dp;
  struct model_acts *acts;     /* slot 0 */
  int *inputs, *targets;       /* (micro, seq) */
  uint64_t *samples;           /* (micro) each row's window index */
  uint64_t dropout_seed;
  const long long *step;       /* the step running */
  void (*micro_batch)(void *ctx, int mb, int *inputs, int *targets, uint64_t *samples);
  void *ctx;
};

struct pipe_slot {
  int pool;                    /* the stage whose slot it is */
  int stage, mb;               /* −1: free */
  struct model_acts *acts;
  int *targets;                /* (micro · seq) on the rank holding the head */
  real *grad;                 /* (micro · Th · C) the gradient received before, and sent after, BWD */
  struct comm_request *recv, *send_act, *send_grad;
};

struct pipe {
  struct pipe_env env;
  struct comm_group *group;    /* the pp group */
  struct comm_group *embed;    /* tied embeddings: the first and last stage's ranks, else NULL */
  int size, rank;
  struct sched sched;
  int n_slots, n_reduce;       /* slots; REDUCE_GRADS instructions in this rank's list */
  struct pipe_slot *slots;     /* slots[0].acts is the trainer's acts */
  int *in_index;               /* (n_stages) the residual index a stage reads: its first layer */
  int peak_slots;              /* most slots in use at once in the last step */
  int *last_bwd;               /* (n_stages) the micro-batch of each stage's last BWD on this rank */
};

/* Slots per stage of pipeline rank pp_rank under schedule s: (n_stages) entries, 0 for the
 * stages elsewhere. The memory bill uses it too. */
void pipe_stage_slots(const struct plan *p, const struct sched *s, int pp_rank, int *slots);
/* Builds the schedule, the slots and the embedding group over env (whose model, dp layer and
 * acts exist; env is copied). Collective over the pp group (the embedding group is split from
 * it). 0 ok; nonzero with a message. */
int pipe_open(struct pipe *pp, const struct pipe_env *env, struct comm_group *group, char *err, size_t err_size);
void pipe_close(struct pipe *pp);
/* One step's forward and backward over this rank's schedule, the tied embedding's and the
 * data-parallel gradient reduction included. Returns Σ losses of this data-parallel rank's
 * windows (the same on every pipeline rank). Failures show in the model's tp failure and the dp
 * layer's (trainer_failed). */
double pipe_forward_backward(struct pipe *pp);
/* A forward alone through every stage, stage after stage (evaluation), on slot 0: Σ losses
 * (targets given) on every pipeline rank. */
double pipe_forward(struct pipe *pp, const int *tokens, const int *targets, int B, int T);
/* After pipe_forward without targets: model_head_argmax on the last stage, the tokens sent to
 * every pipeline rank. */
void pipe_argmax(struct pipe *pp, const int *rows, int n, int *out);

#endif
