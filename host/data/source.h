/* Where a trainer's tokens come from (docs/design.md, "Files tycho reads and writes"): one
 * interface for every data source, so the trainer asks for windows and never for a kind of data. A
 * source gives
 *   - training windows: window w = step·G + k (the contract of tokens.h), inputs and targets of
 *     seq_len tokens each;
 *   - validation windows, when it has a validation set;
 *   - held-out problems for the greedy-decoding evaluator, when it has them: a prompt of
 *     prompt_tokens tokens and the answer_tokens a model should generate after it.
 * Sources: token files (data.train, data.val; tokens.h), text tokenized into a cached token file
 * and split at data.val_fraction (data.text; text_cache.h), and the synthetic addition corpus
 * (data.synthetic = "addition"; addition.h). A new one is a `struct data_source_ops` and a line
 * in data_source_open. */
#ifndef TYCHO_DATA_SOURCE_H
#define TYCHO_DATA_SOURCE_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/tokens.h"
#include "plan/plan.h"

struct data_source;

struct data_source_ops {
  const char *kind;
  void (*train_window)(const struct data_source *s, uint64_t window, int *inputs, int *targets);
  /* NULL: no validation set */
  void (*val_window)(const struct data_source *s, uint64_t window, int *inputs, int *targets);
  /* NULL: no held-out problems. Problem j (any j ≥ 0): prompt and expected answer as token ids. */
  void (*eval_problem)(const struct data_source *s, uint64_t j, int *prompt, int *answer);
};

struct data_source {
  const struct data_source_ops *ops;
  char description[PLAN_PATH_MAX + 32]; /* for the run's header: "synthetic addition", a path */
  int seq_len;
  bool shuffle;
  uint64_t seed;                        /* seeds.data */
  int prompt_tokens, answer_tokens;     /* of eval_problem's problems; 0 without */
  struct tokens_file train, val;        /* token files (val.n_tokens 0 when none) */
  struct tokens_file text;              /* data.text's cache, whole: train and val are views into it
                                           (their map NULL: text owns the mapping) */
};

/* Opens the source the plan names (data.train and data.val, or data.synthetic) for windows of
 * batch.seq tokens with seeds.data, and checks it against model.vocab. 0 ok; nonzero with a
 * message naming the field. */
int data_source_open(struct data_source *s, const struct plan *p, char *err, size_t err_size);
/* Safe on a zeroed or already-closed source. */
void data_source_close(struct data_source *s);

#endif
