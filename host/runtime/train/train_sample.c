/* train.sample (train_sample.h): the prompt encoded with data.tokenizer, gen_run on rank 0's
 * model, the ids decoded back to text. */
#include "runtime/train/train_sample.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model/generate.h"
#include "text/tokenizer.h"

void train_sample_print(const struct trainer *t, FILE *out, long long step)
{
  const struct plan *p = t->plan;
  const struct model *m = &t->model;
  char err[1536];
  struct tokenizer *tok = NULL;
  struct tok_worker *w = NULL;
  struct tok_ids ids = { 0 };
  int *got = NULL, *prompt = NULL;
  char *text = NULL;
  size_t len = 0;
  const char *s = p->train.sample.prompt;
  int rc = tokenizer_load(&tok, p->data.tokenizer, err, sizeof err);
  if (!rc && !(w = tok_worker_new(tok)))
    rc = -1, snprintf(err, sizeof err, "out of memory");
  if (!rc)
    rc = tok_encode(w, s, strlen(s), &ids, err, sizeof err);
  if (!rc && (ids.n < 1 || ids.n > (size_t)m->config.max_seq))
    rc = -1, snprintf(err, sizeof err, "the prompt is %zu tokens; 1 to model.max_seq (%d) are allowed", ids.n,
                      m->config.max_seq);
  const long long budget = rc ? 0 : gen_budget(m, (int)ids.n, p->train.sample.max_tokens);
  if (!rc && (!(got = malloc((size_t)budget * sizeof *got)) || !(prompt = malloc(ids.n * sizeof *prompt))))
    rc = -1, snprintf(err, sizeof err, "out of memory");
  long long n = 0;
  if (!rc) {
    for (size_t i = 0; i < ids.n; i++)
      prompt[i] = (int)ids.v[i];
    const int64_t eos = tokenizer_eos(tok);
    const int eos_id = (int)eos;
    struct gen_request r = { 0 };
    r.prompt = prompt;
    r.P = (int)ids.n;
    r.max_tokens = p->train.sample.max_tokens;
    r.s.temperature = p->train.sample.temperature;
    r.s.top_k = p->train.sample.top_k;
    r.s.top_p = 1.0;
    r.s.seed = (uint64_t)p->train.sample.seed;
    r.eos = &eos_id;
    r.n_eos = eos >= 0;
    n = gen_run(m, &r, got, err, sizeof err);
    rc = n < 0 ? -1 : 0;
  }
  uint32_t *u = rc ? NULL : malloc((size_t)(n > 0 ? n : 1) * sizeof *u);
  if (!rc && !u)
    rc = -1, snprintf(err, sizeof err, "out of memory");
  for (long long i = 0; !rc && i < n; i++)
    u[i] = (uint32_t)got[i];
  if (!rc)
    rc = tok_decode(tok, u, (size_t)n, &text, &len, err, sizeof err);
  if (rc)
    fprintf(out, "sample at step %lld: not generated: %s\n", step, err);
  else
    fprintf(out, "sample at step %lld (train.sample):\n%s%.*s\n", step, s, (int)len, text);
  fflush(out);
  free(u);
  free(text);
  free(got);
  free(prompt);
  tok_ids_free(&ids);
  if (w)
    tok_worker_free(w);
  if (tok)
    tokenizer_free(tok);
}
