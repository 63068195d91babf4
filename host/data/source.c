/* The data sources behind data_source_open (source.h): token files and the addition corpus. */
#include "data/source.h"

#include <stdio.h>
#include <string.h>

#include "data/addition.h"
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
    return addition_check_vocab(p->model.vocab, err, n);
  }
  if (!p->data.train[0])
    return errf(err, n, "%s: data: nothing to train on; give data.train (a token file) or "
                "data.synthetic = \"addition\"", plan_where(p, "data"));
  char why[768];
  if (tokens_open(&s->train, p->data.train, p->model.vocab, p->batch.seq, why, sizeof why))
    return errf(err, n, "data.train: %s", why);
  if (p->data.val[0] && tokens_open(&s->val, p->data.val, p->model.vocab, p->batch.seq, why, sizeof why)) {
    data_source_close(s);
    return errf(err, n, "data.val: %s", why);
  }
  s->ops = s->val.map ? &tokens_ops : &tokens_no_val_ops;
  snprintf(s->description, sizeof s->description, "%s", p->data.train);
  return 0;
}

void data_source_close(struct data_source *s)
{
  tokens_close(&s->train);
  tokens_close(&s->val);
  memset(s, 0, sizeof *s);
}
