/* The data sources behind data_source_open (source.h): token files and the addition corpus. */
#include "data/source.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "data/addition.h"
#include "data/text_cache.h"
#include "util/err.h"

/* ---- token files ---- */

static void tokens_train_window(const struct data_source *s, uint64_t w, int *inputs, int *targets)
{
  tokens_fill(&s->train, w, s->shuffle, s->seed, inputs, targets);
}

static void tokens_val_window(const struct data_source *s, uint64_t w, int *inputs, int *targets)
{
  tokens_fill(&s->val, w, false, 0, inputs, targets);
}

static const struct data_source_ops tokens_ops = { "tokens", tokens_train_window, tokens_val_window, NULL };
static const struct data_source_ops tokens_no_val_ops = { "tokens", tokens_train_window, NULL, NULL };

/* ---- the synthetic addition corpus ---- */

static void addition_train(const struct data_source *s, uint64_t w, int *inputs, int *targets)
{
  addition_window(w, s->seq_len, s->seed, inputs, targets);
}

static void addition_val(const struct data_source *s, uint64_t w, int *inputs, int *targets)
{
  addition_val_window(w, s->seq_len, s->seed, inputs, targets);
}

static void addition_problem(const struct data_source *s, uint64_t j, int *prompt, int *answer)
{
  addition_eval_problem(j, s->seed, prompt, answer);
}

static const struct data_source_ops addition_ops = { "addition", addition_train, addition_val, addition_problem };

/* train.eval_batches against the validation set: the evaluator reads eval_batches · G windows
 * from window 0 (and as many held-out problems), and a window past the set's end would wrap round
 * to its start, so those batches would repeat windows and the evaluation run on with no end the
 * data sets. Refused (an input error: exit 2) naming the field, the value and the largest allowed. */
static int check_eval_batches(const struct data_source *s, const struct plan *p, char *err, size_t n)
{
  const long long want = p->train.eval_batches, G = p->batch.global;
  if (want <= 0 || !s->ops->val_window)
    return 0;
  const int S = s->seq_len;
  uint64_t windows, problems = UINT64_MAX;
  char set[PLAN_PATH_MAX + 64];
  if (s->ops->eval_problem) { /* addition: the held-out problems' stream, ADDITION_N_HELD_OUT long */
    windows = ((uint64_t)ADDITION_N_HELD_OUT * ADDITION_PROBLEM_BYTES - 1) / (uint64_t)S;
    if (S >= s->prompt_tokens + s->answer_tokens - 1) /* the accuracy's problems too */
      problems = ADDITION_N_HELD_OUT;
    snprintf(set, sizeof set, "the synthetic addition's held-out set of %d problems", ADDITION_N_HELD_OUT);
  } else {
    windows = tokens_epoch_windows(&s->val);
    if (s->text.map)
      snprintf(set, sizeof set, "the last %" PRIu64 " tokens of data.text (data.val_fraction)", s->val.n_tokens);
    else
      snprintf(set, sizeof set, "data.val %s", s->val.path);
  }
  const uint64_t most = (windows < problems ? windows : problems) / (uint64_t)G;
  if ((uint64_t)want <= most)
    return 0;
  return errf_input(err, n, "%s: train.eval_batches = %lld is more than the validation set holds: %s gives %" PRIu64
                    " windows of batch.seq + 1 = %d tokens, %lld (batch.global) to a batch; at most %" PRIu64,
                    plan_where(p, "train.eval_batches"), want, set, problems < windows ? problems : windows, S + 1, G, most);
}

/* data.text: the cache rank 0 made at run start (train_run), mapped and checked against
 * model.vocab, its last data.val_fraction of tokens (rounded down) the validation set and the
 * rest the training set, each at least one window of batch.seq + 1 tokens. */
static int open_text(struct data_source *s, const struct plan *p, char *err, size_t n)
{
  struct text_cache_info info;
  char why[1536];
  if (text_cache_locate(p, &info, err, n))
    return -1;
  if (!info.cached)
    return errf(err, n, "data.text: the token cache %s is not there (rank 0 makes it at the start of tycho run)",
                info.path);
  if (tokens_open(&s->text, info.path, p->model.vocab, p->batch.seq, why, sizeof why))
    return errf(err, n, "data.text: %s", why);
  const uint64_t all = s->text.n_tokens, nv = (uint64_t)((double)all * p->data.val_fraction),
                 need = (uint64_t)p->batch.seq + 1;
  if (all - nv < need || (nv && nv < need)) {
    data_source_close(s);
    return errf_input(err, n, "%s: data.text gives %" PRIu64 " tokens, %" PRIu64 " of them the validation set "
                      "(data.val_fraction = %g); each set needs batch.seq + 1 = %" PRIu64 " tokens at least",
                      plan_where(p, nv && nv < need ? "data.val_fraction" : "data.text"), all, nv,
                      p->data.val_fraction, need);
  }
  s->train = s->text;
  s->train.map = NULL;
  s->train.path = NULL;
  s->train.n_tokens = all - nv;
  if (nv) {
    s->val = s->train;
    if (s->val.tokens32)
      s->val.tokens32 += all - nv;
    else
      s->val.tokens += all - nv;
    s->val.n_tokens = nv;
  }
  s->ops = nv ? &tokens_ops : &tokens_no_val_ops;
  snprintf(s->description, sizeof s->description, "%s (data.text: %" PRIu64 " training, %" PRIu64
           " validation tokens)", info.path, all - nv, nv);
  if (check_eval_batches(s, p, err, n)) {
    data_source_close(s);
    return -1;
  }
  return 0;
}

int data_source_open(struct data_source *s, const struct plan *p, char *err, size_t n)
{
  memset(s, 0, sizeof *s);
  s->seq_len = p->batch.seq;
  s->shuffle = p->data.shuffle != 0;
  s->seed = (uint64_t)p->seeds.value[PLAN_SEED_DATA];
  if (!strcmp(p->data.synthetic, "addition")) {
    s->ops = &addition_ops;
    snprintf(s->description, sizeof s->description, "synthetic addition");
    s->prompt_tokens = ADDITION_PROMPT_TOKENS; /* within TRAIN_MAX_PROBLEM_TOKENS (train.h) */
    s->answer_tokens = ADDITION_ANSWER_TOKENS;
    if (addition_check_vocab(p->model.vocab, err, n))
      return -1;
    return check_eval_batches(s, p, err, n);
  }
  if (p->data.n_text)
    return open_text(s, p, err, n);
  if (!p->data.train[0])
    return errf(err, n, "%s: data: nothing to train on; give data.train (a token file), data.text or "
                "data.synthetic = \"addition\"", plan_where(p, "data"));
  char why[768];
  if (tokens_open(&s->train, p->data.train, p->model.vocab, p->batch.seq, why, sizeof why))
    return errf(err, n, "data.train: %s", why);
  if (p->data.val[0] && tokens_open(&s->val, p->data.val, p->model.vocab, p->batch.seq, why, sizeof why)) {
    data_source_close(s);
    return errf(err, n, "data.val: %s", why);
  }
  s->ops = s->val.n_tokens ? &tokens_ops : &tokens_no_val_ops;
  snprintf(s->description, sizeof s->description, "%s", p->data.train);
  if (check_eval_batches(s, p, err, n)) {
    data_source_close(s);
    return -1;
  }
  return 0;
}

void data_source_close(struct data_source *s)
{
  tokens_close(&s->train);
  tokens_close(&s->val);
  tokens_close(&s->text);
  memset(s, 0, sizeof *s);
}
