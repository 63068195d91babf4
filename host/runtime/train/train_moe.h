/* What a run shows of its sparse layers (model.moe, docs/moe.md): each step's routing summed
 * over every rank, the metrics' "moe" object, the progress line's part, and the imbalance
 * warning. The statistics come from the model (model.h, struct model_moe_stat): each rank holds
 * those of its pipeline stage's layers over its data-parallel share of the batch, so their sum
 * over the world is the global batch's. The gather is instrumentation, not model traffic: it runs
 * on the comm layer's control channel (comm_control_gather), uncounted, so `check`'s traffic
 * still equals the counters. */
#ifndef TYCHO_RUNTIME_TRAIN_MOE_H
#define TYCHO_RUNTIME_TRAIN_MOE_H
#include <stddef.h>

#include "runtime/train/train.h"

/* Steps over which the imbalance warning measures each expert's share. */
#define TRAIN_MOE_WINDOW 100
/* The warning: an expert that took more than this many times its fair share (1/experts of the
 * layer's assignments) over a window. */
#define TRAIN_MOE_IMBALANCE 2.0

enum { TRAIN_MOE_FIELDS = 6 }; /* aux, z, sequences, tokens, assigned, dropped; then routed (E) */

struct train_moe {
  int n, E;                  /* sparse layers (0: a dense model; nothing here is used), experts */
  int *layer;                /* (n) their indices */
  double *step;              /* (n, TRAIN_MOE_FIELDS + E) this step's, summed over the world (rank 0) */
  double *window;            /* (n, 1 + E) assigned and routed over the current window */
  long long window_first;    /* its first step (0-based) */
  int window_steps;
};

/* For the trainer's model; 0, or −1 out of memory (err). */
int train_moe_open(struct train_moe *m, const struct trainer *t, char *err, size_t n);
void train_moe_close(struct train_moe *m);
/* After a step: every rank's statistics to rank 0, summed in rank order. Collective over the
 * trainer's world. 0, or −1 (err). */
int train_moe_gather(struct train_moe *m, const struct trainer *t, char *err, size_t n);
/* The step's figures: Σ over sparse layers of the mean load-balancing loss per sequence and of
 * the mean z-loss per token, and the fraction of assignments dropped. */
void train_moe_totals(const struct train_moe *m, double *aux, double *z, double *dropped);
/* `, "moe": {...}` for the metrics line: aux, z, dropped, and per layer its index, aux, dropped
 * and tokens per expert. Returns the length written (truncated to n). */
int train_moe_json(const struct train_moe *m, char *buf, size_t n);
/* " | moe aux 2.013 drop 1.2%" for the progress line. */
void train_moe_progress(const struct train_moe *m, char *buf, size_t n);
/* Rank 0, after train_moe_gather: the step's figures as trace counters (comm_trace_counter):
 * "moe layer L" with series aux and dropped, "moe layer L tokens" with one series per expert. */
void train_moe_trace(const struct train_moe *m);
/* Adds the step to the window; when the window is full (TRAIN_MOE_WINDOW steps, or `last`),
 * writes into buf one warning line per layer whose busiest expert took more than
 * TRAIN_MOE_IMBALANCE × its share, and starts a new window. Returns the number of warnings. */
int train_moe_window(struct train_moe *m, long long step, int last, char *buf, size_t n);
/* The busiest expert's share of assignments relative to the fair share 1/E: max_e routed[e] · E /
 * Σ routed; its index in *expert. 0 when nothing was routed. */
double train_moe_imbalance(const double *routed, int E, int *expert);

#endif
