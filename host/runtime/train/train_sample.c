/* train.sample (train_sample.h): the parameters gathered to rank 0 where it does not hold the
 * whole model, the prompt encoded with data.tokenizer, gen_run on rank 0's model (or the one-rank
 * model built from the gathered parameters), the ids decoded back to text. */
#include "runtime/train/train_sample.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "runtime/model/generate.h"
#include "runtime/train/packed.h"
#include "text/tokenizer.h"

/* Rank 0's part: prompt, generation from m, text on out. 0, or −1 with the message. */
static int sample_on(const struct plan *p, const struct model *m, FILE *out, long long step, char *err,
                     size_t err_size)
{
  struct tokenizer *tok = NULL;
  struct tok_worker *w = NULL;
  struct tok_ids ids = { 0 };
  int *got = NULL, *prompt = NULL;
  uint32_t *u = NULL;
  char *text = NULL;
  size_t len = 0;
  const char *s = p->train.sample.prompt;
  int rc = tokenizer_load(&tok, p->data.tokenizer, err, err_size);
  if (!rc && !(w = tok_worker_new(tok)))
    rc = -1, snprintf(err, err_size, "out of memory");
  if (!rc)
    rc = tok_encode(w, s, strlen(s), &ids, err, err_size);
  if (!rc && (ids.n < 1 || ids.n > (size_t)m->config.max_seq))
    rc = -1, snprintf(err, err_size, "the prompt is %zu tokens; 1 to model.max_seq (%d) are allowed", ids.n,
                      m->config.max_seq);
  const long long budget = rc ? 0 : gen_budget(m, (int)ids.n, p->train.sample.max_tokens);
  if (!rc && (!(got = malloc((size_t)budget * sizeof *got)) || !(prompt = malloc(ids.n * sizeof *prompt))))
    rc = -1, snprintf(err, err_size, "out of memory");
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
    n = gen_run(m, &r, got, err, err_size);
    rc = n < 0 ? -1 : 0;
  }
  if (!rc && !(u = malloc((size_t)(n > 0 ? n : 1) * sizeof *u)))
    rc = -1, snprintf(err, err_size, "out of memory");
  for (long long i = 0; !rc && i < n; i++)
    u[i] = (uint32_t)got[i];
  if (!rc)
    rc = tok_decode(tok, u, (size_t)n, &text, &len, err, err_size);
  if (!rc)
    fprintf(out, "sample at step %lld (train.sample):\n%s%.*s\n", step, s, (int)len, text);
  free(u);
  free(text);
  free(got);
  free(prompt);
  tok_ids_free(&ids);
  if (w)
    tok_worker_free(w);
  if (tok)
    tokenizer_free(tok);
  return rc ? -1 : 0;
}

void train_sample_print(struct trainer *t, FILE *out, long long step)
{
  const struct plan *p = t->plan;
  struct comm_group *world = t->world;
  char err[1536] = "";
  /* The same on every rank (the plan's layout): whether rank 0 lacks part of the parameters. */
  const int gather = world && world->size > 1 &&
                     (t->model.tp.size > 1 || p->mesh.pp > 1 || dp_master_sharded(&t->dp) || t->model.ep.size > 1);
  real *packed = NULL;
  size_t n_packed = 0;
  int rc = 0;
  if (gather) {
    rc = trainer_gather_packed(t, &packed, &n_packed, err, sizeof err);
    /* a rank's own failure (out of memory) said on rank 0 too; the run goes on */
    rc = comm_agree_err(world, rc, err, sizeof err, COMM_AGREE_NAME_RANK);
  }
  if (world && world->rank != 0) {
    free(packed);
    return; /* from here rank 0 alone: no collective */
  }
  if (!out) {
    free(packed);
    return;
  }
  struct model one;
  int have_one = 0;
  if (!rc && gather && !packed)
    rc = -1, snprintf(err, sizeof err, "the gather left rank 0 without the parameters");
  if (!rc && gather) {
    rc = model_from_packed_sparse(&one, &t->model.config, t->model.moe, packed, n_packed, err, sizeof err);
    have_one = !rc;
  }
  free(packed);
  if (!rc)
    rc = sample_on(p, have_one ? &one : &t->model, out, step, err, sizeof err);
  if (have_one)
    model_free(&one);
  if (rc)
    fprintf(out, "sample at step %lld: not generated: %s\n", step, err);
  fflush(out);
}
