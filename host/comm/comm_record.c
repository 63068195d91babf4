/* The flight recorder (docs/design.md, "Collectives"): the last N operation records and caller
 * spans in rings, and the per-(group, op) counters. Rings keep a fixed amount of memory however
 * long a run is; the counters never forget, so counted traffic can be compared with predicted
 * traffic. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"

#define ctx comm_ctx

int comm_recorder_init(int capacity)
{
  ctx.records = calloc((size_t)capacity, sizeof *ctx.records);
  ctx.spans = calloc((size_t)capacity, sizeof *ctx.spans);
  if (!ctx.records || !ctx.spans) {
    comm_recorder_free();
    return -1;
  }
  ctx.n_records_cap = capacity;
  ctx.n_records = ctx.n_spans = 0;
  return 0;
}

int comm_reserve_records(int capacity)
{
  pthread_mutex_lock(&ctx.lock);
  const int have = ctx.n_records_cap;
  pthread_mutex_unlock(&ctx.lock);
  if (capacity <= have)
    return 0;
  struct comm_record *records = calloc((size_t)capacity, sizeof *records);
  struct comm_span *spans = calloc((size_t)capacity, sizeof *spans);
  if (!records || !spans) {
    free(records);
    free(spans);
    return -1;
  }
  pthread_mutex_lock(&ctx.lock);
  /* every record and span stays at its id modulo the capacity: a record still in flight is
   * updated by its id */
  if (ctx.records) {
    uint64_t cap = (uint64_t)ctx.n_records_cap, keep = ctx.n_records < cap ? ctx.n_records : cap;
    keep = keep < (uint64_t)capacity ? keep : (uint64_t)capacity;
    for (uint64_t id = ctx.n_records - keep; id < ctx.n_records; id++)
      records[id % (uint64_t)capacity] = ctx.records[id % cap];
    uint64_t keep_spans = ctx.n_spans < cap ? ctx.n_spans : cap;
    keep_spans = keep_spans < (uint64_t)capacity ? keep_spans : (uint64_t)capacity;
    for (uint64_t k = ctx.n_spans - keep_spans; k < ctx.n_spans; k++)
      spans[k % (uint64_t)capacity] = ctx.spans[k % cap];
  }
  free(ctx.records);
  free(ctx.spans);
  ctx.records = records;
  ctx.spans = spans;
  ctx.n_records_cap = capacity;
  pthread_mutex_unlock(&ctx.lock);
  return 0;
}

void comm_recorder_free(void)
{
  free(ctx.records);
  free(ctx.spans);
  ctx.records = NULL;
  ctx.spans = NULL;
  ctx.n_records_cap = 0;
}

uint64_t comm_recorder_add(const struct comm_record *rec)
{
  uint64_t id = ctx.n_records++;
  ctx.records[id % (uint64_t)ctx.n_records_cap] = *rec;
  return id;
}

void comm_recorder_update(uint64_t id, const struct comm_record *rec)
{
  if (ctx.n_records - id <= (uint64_t)ctx.n_records_cap) /* not yet overwritten */
    ctx.records[id % (uint64_t)ctx.n_records_cap] = *rec;
}

int comm_recorder_last(struct comm_record *out, int max)
{
  uint64_t cap = (uint64_t)ctx.n_records_cap, have = ctx.n_records < cap ? ctx.n_records : cap;
  int k = max < 0 ? 0 : (uint64_t)max < have ? max : (int)have;
  for (int i = 0; i < k; i++)
    out[i] = ctx.records[(ctx.n_records - (uint64_t)k + (uint64_t)i) % cap];
  return k;
}

int comm_recorder_spans(struct comm_span *out, int max)
{
  uint64_t cap = (uint64_t)ctx.n_records_cap, have = ctx.n_spans < cap ? ctx.n_spans : cap;
  int k = max < 0 ? 0 : (uint64_t)max < have ? max : (int)have;
  for (int i = 0; i < k; i++)
    out[i] = ctx.spans[(ctx.n_spans - (uint64_t)k + (uint64_t)i) % cap];
  return k;
}

int comm_records(struct comm_record *out, int max)
{
  pthread_mutex_lock(&ctx.lock);
  int k = ctx.records ? comm_recorder_last(out, max) : 0;
  pthread_mutex_unlock(&ctx.lock);
  return k;
}

void comm_trace_work(const char *name, int stage, int mb, double flops, double t_begin, double t_end)
{
  pthread_mutex_lock(&ctx.lock);
  if (ctx.spans) {
    struct comm_span *s = &ctx.spans[ctx.n_spans++ % (uint64_t)ctx.n_records_cap];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->t_begin = t_begin;
    s->t_end = t_end;
    s->step = ctx.step;
    s->stage = stage;
    s->mb = mb;
    s->flops = flops;
    s->series[0] = '\0';
  }
  pthread_mutex_unlock(&ctx.lock);
}

void comm_trace_counter(const char *name, const char *series, double value)
{
  const double t = comm_now();
  pthread_mutex_lock(&ctx.lock);
  if (ctx.spans) {
    struct comm_span *s = &ctx.spans[ctx.n_spans++ % (uint64_t)ctx.n_records_cap];
    snprintf(s->name, sizeof s->name, "%s", name);
    snprintf(s->series, sizeof s->series, "%s", series);
    s->t_begin = s->t_end = t;
    s->step = ctx.step;
    s->stage = s->mb = -1;
    s->flops = value;
  }
  pthread_mutex_unlock(&ctx.lock);
}

void comm_trace_span(const char *name, double t_begin, double t_end)
{
  comm_trace_work(name, -1, -1, 0.0, t_begin, t_end);
}

struct comm_counter comm_counter_get(const struct comm_group *g, enum comm_op op)
{
  struct comm_counter c = { 0, 0 };
  if (!g || !g->state || (unsigned)op >= COMM_N_OPS)
    return c;
  pthread_mutex_lock(&ctx.lock);
  c = g->state->counters[op];
  pthread_mutex_unlock(&ctx.lock);
  return c;
}

void comm_counters_reset(void)
{
  pthread_mutex_lock(&ctx.lock);
  for (int i = 0; i < ctx.n_groups; i++)
    memset(ctx.groups[i]->state->counters, 0, sizeof ctx.groups[i]->state->counters);
  pthread_mutex_unlock(&ctx.lock);
}

uint64_t comm_group_seq(const struct comm_group *g)
{
  if (!g || !g->state)
    return 0;
  pthread_mutex_lock(&ctx.lock);
  uint64_t seq = g->state->seq;
  pthread_mutex_unlock(&ctx.lock);
  return seq;
}

unsigned long long comm_ops_started(void)
{
  pthread_mutex_lock(&ctx.lock);
  unsigned long long n = ctx.ops_started;
  pthread_mutex_unlock(&ctx.lock);
  return n;
}
