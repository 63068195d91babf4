/* Pipeline schedules as data (docs/design.md, "Schedules"). A schedule is, for each pipeline rank,
 * the ordered list of instructions it runs in one training step: FWD / BWD / RECOMPUTE of a (stage,
 * micro-batch), the point-to-point SEND / RECV of activations and gradients between pipeline ranks,
 * REDUCE_GRADS once per stage after its last backward, and OPTIMIZER last. GPipe, 1F1B and
 * interleaved 1F1B are generators of such lists; so is ZB-H1, the zero-bubble schedule, whose
 * lists split each backward in two (see "Split backward" below); `sched_check` proves a list complete,
 * `sched_simulate` runs all ranks' lists together under a cost model to prove them free of deadlock
 * and to measure the bubble. The executor runs the very same lists.
 *
 * Stages are global indices 0 .. S-1 in model order, S = pp · v (v virtual stages, or chunks,
 * per rank). Stage s runs on pipeline rank s mod pp as its chunk s / pp: Megatron's
 * interleaving, the same mapping as struct plan_stage.
 *
 * Messages are named by the stage that produced them. SEND_ACT(s, mb) follows FWD(s, mb) on
 * rank(s) and sends its output to rank(s + 1), where RECV_ACT(s, mb) precedes FWD(s + 1, mb).
 * SEND_GRAD(s, mb) follows BWD(s, mb) and sends the gradient of stage s's input to rank(s - 1),
 * where RECV_GRAD(s, mb) precedes BWD(s - 1, mb). With pp = 1 consecutive stages share the rank
 * and no messages exist. A (kind, stage, mb) names exactly one message, so sends and receives
 * match by name; `peer` repeats the other rank for the executor.
 *
 * Split backward (zero-bubble schedules, s->split): BWD_B(s, mb) computes the gradient of the
 * stage's input, the only part the previous stage waits for, and SEND_GRAD follows it at once;
 * BWD_W(s, mb) computes the stage's weight gradients, needed by nobody until REDUCE_GRADS, so it
 * can run later to fill what would be idle time. W comes after B on the same rank; REDUCE_GRADS
 * after the stage's last W; RECOMPUTE before B. A split list has no BWD, a whole one no B or W.
 * A micro-batch stays in flight until its W ends: W needs the linears' inputs and the output
 * gradients B leaves, so they are held until then.
 *
 * Pure C: no Lua, no MPI, never exits. Functions return 0 or an enum sched_status and write a
 * one-line message into err. */
#ifndef TYCHO_SCHED_H
#define TYCHO_SCHED_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "plan/plan.h"
#include "util/strbuf.h"

enum sched_op {
  SCHED_FWD, SCHED_BWD, SCHED_RECOMPUTE,
  SCHED_SEND_ACT, SCHED_RECV_ACT, SCHED_SEND_GRAD, SCHED_RECV_GRAD,
  SCHED_REDUCE_GRADS, /* the stage's gradients are complete: data-parallel reduction (buckets later) */
  SCHED_OPTIMIZER,    /* last on every rank */
  /* the split backward's two halves (zero-bubble lists only) */
  SCHED_BWD_B,        /* input gradient: the stage's input's, sent upstream at once */
  SCHED_BWD_W,        /* weight gradient: free to run any time before REDUCE_GRADS */
  SCHED_N_ALL_OPS
};

enum sched_status {
  SCHED_OK = 0,
  SCHED_INVALID,    /* bad arguments to a generator or a plan the generators cannot serve */
  SCHED_INCOMPLETE, /* an instruction list misses, repeats or misorders something */
  SCHED_DEADLOCK,   /* the lists are complete but some receive can never be satisfied */
  SCHED_NOMEM
};

struct sched_instr {
  uint8_t op;  /* enum sched_op */
  int stage;   /* global stage; -1 for OPTIMIZER */
  int mb;      /* micro-batch 0 .. m-1; -1 for REDUCE_GRADS and OPTIMIZER */
  int peer;    /* SEND_*: the rank sent to; RECV_*: the rank received from; else -1 */
};

struct sched_list {
  int n, cap;
  struct sched_instr *instr; /* (n) in execution order */
};

/* The cost model, in arbitrary time units. Per stage so that uneven stages cost what they are. */
struct sched_costs {
  double *fwd;       /* (S) default 1 */
  double *bwd;       /* (S) default 2 */
  double *recompute; /* (S) default = fwd; used where the stage recomputes */
  double *w_share;   /* (S) the weight gradient's share of bwd: BWD_W costs bwd · w_share, BWD_B
                      * the rest. Default 1/2: a linear's backward is two products of the
                      * forward's size, one for the input gradient and one for the weights;
                      * sched_from_plan counts it per stage (attention's core has no weights,
                      * so its backward is all B) */
  double comm;       /* from a send to its message being receivable; default 0 */
  double reduce_grads, optimizer; /* per instruction; default 0 */
};

struct sched {
  enum plan_schedule kind;
  int pp;                /* pipeline ranks */
  int v;                 /* virtual stages (chunks) per rank */
  int m;                 /* micro-batches per step */
  int n_stages;          /* pp · v */
  int split;             /* 1: backwards are BWD_B + BWD_W (zero-bubble kinds), 0: BWD */
  uint8_t *recompute;    /* (S) 1: RECOMPUTE(s, mb) runs just before BWD(s, mb) */
  struct sched_list *ranks; /* (pp) */
  struct sched_costs costs;
};

/* Result of a simulation. Times are in the cost model's units, from 0 at the step's start. */
struct sched_sim_rank {
  double busy;        /* time spent in FWD, BWD (or B and W), RECOMPUTE, REDUCE_GRADS, OPTIMIZER */
  double finish;      /* when its last instruction ended */
  int peak_inflight;  /* most (stage, mb) whose FWD ran and whose BWD (split: W) has not finished */
  int stuck_at;       /* after a deadlock: the index of its first stuck instruction, else -1 */
  double *start, *end; /* (n instructions of the rank); a RECV's span is its wait */
};

struct sched_sim {
  int pp;
  double makespan;          /* the latest finish over all ranks */
  double idle;              /* pp · makespan − Σ busy */
  double bubble_fraction;   /* idle / (pp · makespan): GPipe, 1F1B: (p−1)/(m+p−1) */
  double bubble_over_ideal; /* idle / Σ busy: Megatron's bubble time / ideal time,
                             * (p−1)/m for 1F1B, (p−1)/(v·m) for interleaved */
  struct sched_sim_rank *ranks; /* (pp) */
};

/* Generators. Each fills *s (free with sched_free, also after a failure) for pipeline size pp,
 * m micro-batches and v virtual stages per rank, with the default costs. `recompute` is (pp·v)
 * flags or NULL for none.
 * sched_gpipe: every forward, then every backward (chunk by chunk when v > 1).
 * sched_1f1b: PipeDream-flush / Megatron's non-interleaved schedule (v must be 1): rank r runs
 *   min(pp − r − 1, m) warm-up forwards, then alternates one forward and one backward, then
 *   the remaining backwards.
 * sched_interleaved: Megatron-LM's interleaved 1F1B (v ≥ 2, m a multiple of pp): micro-batches
 *   go through each chunk in groups of pp; warm-up of (pp − r − 1)·2 + (v − 1)·pp forwards capped
 *   at m·v (all of them when m = pp), then 1F1B, then the remaining backwards.
 * sched_zb_h1: ZB-H1 of "Zero Bubble Pipeline Parallelism" (Qi et al., 2024) (v must be 1,
 *   m ≥ pp): 1F1B's order with each backward split, B where 1F1B has its backward; rank r
 *   holds back up to r of its W's and runs them after its last B, where 1F1B waits for
 *   gradients. Every rank's peak in-flight count (W-held included) is pp, 1F1B's on rank 0, so
 *   the pipeline's peak memory is 1F1B's. With equal stages the idle time per rank is
 *   (pp − 1)(F + B − W) instead of 1F1B's (pp − 1)(F + B + W). */
int sched_gpipe(struct sched *s, int pp, int m, int v, const uint8_t *recompute, char *err, size_t err_size);
int sched_1f1b(struct sched *s, int pp, int m, int v, const uint8_t *recompute, char *err, size_t err_size);
int sched_interleaved(struct sched *s, int pp, int m, int v, const uint8_t *recompute, char *err, size_t err_size);
int sched_zb_h1(struct sched *s, int pp, int m, int v, const uint8_t *recompute, char *err, size_t err_size);
/* The generator of `kind`. */
int sched_build(struct sched *s, enum plan_schedule kind, int pp, int m, int v, const uint8_t *recompute,
                char *err, size_t err_size);

/* The schedule a compiled plan asks for (p->schedule, p->mesh.pp, p->virtual_stages,
 * p->batch.microbatches), with RECOMPUTE on stages where any layer recomputes, and costs from
 * forward FLOPs per token: a stage's forward is its layers' FLOPs plus the LM head's on the
 * stage that holds it (the embedding lookup counts nothing), scaled so that the mean stage's
 * forward is 1; backward is twice the forward; recompute is the FLOPs of the recomputed parts.
 * Communication, gradient reduction and the optimizer cost 0 here: the cost model adds them. */
int sched_from_plan(const struct plan *p, struct sched *out, char *err, size_t err_size);

void sched_free(struct sched *s);

/* A split list as whole backwards, in the same order: each BWD_B becomes BWD, the W's go and
 * REDUCE_GRADS moves to just after the stage's last backward (ZB-H1 becomes 1F1B). What the
 * layout's memory bill walks under ZeRO 2 and 3, where the executor does not split backwards;
 * what W holds beyond it is billed apart (`tycho check`). A no-op on a whole list; 0 or
 * sched_check's status. */
int sched_merge_split(struct sched *s, char *err, size_t err_size);

/* Every (stage, mb) forward once and backward once after it, RECOMPUTE (exactly where the
 * stage recomputes) between them, every message sent once after it was produced and received
 * once before it is used, by the right ranks, REDUCE_GRADS once per stage after its last
 * backward, OPTIMIZER last. 0, or SCHED_INCOMPLETE naming the rank, index and instruction. */
int sched_check(const struct sched *s, char *err, size_t err_size);

/* Runs all ranks' lists together: a rank executes its list in order; compute advances its
 * clock by the cost; a send is buffered (never blocks, takes no time on the sender) and its
 * message becomes receivable `costs.comm` later; a receive blocks until then. Checks the
 * lists first (sched_check). 0 with *out filled (free with sched_sim_free); SCHED_INCOMPLETE;
 * or SCHED_DEADLOCK with *out filled up to the stuck instructions and a message naming each
 * stuck rank's first stuck instruction. */
int sched_simulate(const struct sched *s, struct sched_sim *out, char *err, size_t err_size);
void sched_sim_free(struct sched_sim *r);

/* One step as a per-rank text timeline, one column per time quantum (the shortest compute
 * instruction): "F3" forward and "B3" backward of micro-batch 3 (continued by "--" while it
 * lasts), "R3" its recompute, "." idle; with virtual stages the chunk follows as a letter
 * ("F3b": chunk 1). Wider than max_width characters (0: 120), the middle is cut and the cut
 * said; of more than 16 ranks the first 8 and the last 4 rows show, with how many were left
 * out. Then the bubble and the peak in-flight micro-batches per rank (cut the same way). */
void sched_print_timeline(FILE *f, const struct sched *s, const struct sched_sim *r, int max_width);
/* The same as one JSON object: shape, makespan, bubble, and per rank its busy time, peak
 * in-flight count and the ordered compute instructions with simulated start and end. */
void sched_json(struct json *j, const struct sched *s, const struct sched_sim *r);

const char *sched_op_name(int op); /* "FWD", "SEND_ACT", "BWD_B", ... (enum sched_op) */
/* "RECV_GRAD(stage 1, mb 0) from rank 1", into buf. */
const char *sched_instr_text(const struct sched_instr *in, char *buf, size_t n);

#endif
