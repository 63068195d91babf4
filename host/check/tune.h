/* `tycho tune`: the layouts of a model for a world and a cluster, ranked by predicted step time.
 * From a compiled plan (its model, batch, precision and the rest kept), every combination of
 *   tp in the divisors of n_heads up to a node's GPUs, pp in the divisors of n_layers, virtual
 *   stages 1 or 2 (interleaved 1F1B when 2, 1F1B otherwise), dp = world / (tp·pp), batch.micro in
 *   1, 2, 4, 8, zero 1, 2 and 3 (2 and 3 with each zero_every choice: gradients reduce-scattered
 *   every micro-batch or once a step; under 3 also parameters gathered every micro-batch or once
 *   a step), recompute none / attn_core / full,
 *   mesh.ep over the divisors of dp that divide model.moe.experts (a MoE plan; 1 for a dense one),
 *   sequence parallelism on whenever tp > 1 (the same bytes as without, less memory), key/value
 *   heads replicated when tp exceeds n_kv_heads, stages "balanced", mesh.cp 1
 * and, only when none of those fits (a sequence too long for a rank's activations) and the
 * runtime runs context parallelism with the plan (plan_cp_refused), the same search again with
 * mesh.cp over the divisors of the world above 1 whose 2 · cp chunks divide batch.seq (dp =
 * world / (tp·cp·pp)),
 * that compiles (plan_validate) is billed (bill_predict, every pipeline rank) and priced
 * (cost_predict); those whose every rank fits the device with the asked headroom are ranked by
 * step time. */
#ifndef TYCHO_CHECK_TUNE_H
#define TYCHO_CHECK_TUNE_H
#include <stddef.h>
#include <stdio.h>

#include "plan/cluster.h"
#include "plan/plan.h"

struct tune_choice {
  int tp, pp, v, dp, micro, zero, sp, kv_replicate;
  int ep;                  /* mesh.ep (1: none) */
  int cp;                  /* mesh.cp (1: none) */
  int moe;                 /* the model has model.moe: the written plan states mesh.ep, 1 included */
  int grads_step, params_step; /* zero_every.grads / .params = "step" (zero ≥ 2 / zero 3), else "micro_batch" */
  uint8_t recompute;       /* enum plan_recompute bits, the same for every layer */
  int zb;                  /* 1: schedule zb-h1 (v 1, pp > 1), priced with its W-held memory; 0: 1F1B or interleaved */
  double step, mfu, tokens_per_s, max_bytes, headroom;
};

struct tune_result {
  int n_tried, n_valid, n_fit;
  struct tune_choice *best; /* (n_best) the fastest that fit, fastest first */
  int n_best;
  struct tune_choice runnable; /* the fastest that fit among those `tycho run` runs
                                * (tune_choice_runs), */
  int have_runnable;           /* whether it is in best or not; 0: none fit */
  double seconds;          /* the search's own time */
};

/* Whether `tycho run` runs choice c (layout/supported.c): zb-h1 on dense layers under the ZeRO
 * stages and zero_every choices the split backward runs under (bill_split_runs_zero:
 * ZeRO 0 and 1, ZeRO 2 and 3 with "step"); every other layout. */
int tune_choice_runs(const struct tune_choice *c);

/* Searches the layouts of `base` for `world` ranks on `c`, keeping the `keep` fastest that fit
 * with at least `headroom` (a fraction of device memory) to spare. 0 ok; nonzero with a message. */
int tune_search(const struct plan *base, int world, const struct cluster *c, double headroom, int keep,
                struct tune_result *out, char *err, size_t err_size);
void tune_result_free(struct tune_result *r);
/* Writes to f the plan file of a choice, for the path out_path it will have: the base plan
 * plan_path, the `n_sets` --set overrides `sets` tune compiled it with (applied as --set applies
 * them), and the layout fields over both (tycho.extend). The base is loaded by `require` when a
 * module name finds exactly that file from out_path's folder (the search path a plan there
 * has); otherwise (a file name with dots, a folder outside that search path, a namesake found
 * first) its text is written in, as it was when tuned. 0 ok; -1 with a message in err. */
int tune_write_plan(FILE *f, const char *plan_path, const char *out_path, int n_sets, const char *const *sets,
                    const struct tune_choice *t, const char *command, char *err, size_t err_size);

#endif
