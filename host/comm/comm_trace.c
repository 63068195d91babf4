/* The trace (docs/design.md, "Files tycho reads and writes"): every rank's flight recorder and
 * caller spans, gathered to rank 0 and written as one Chrome trace-event JSON file (open it in
 * Perfetto or chrome://tracing). One process per rank; track 0 holds the caller's spans
 * ("compute"), then one track per group. A slice runs from the operation's start on the comm thread
 * to its end; how long it waited in the queue before that is in its args. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_internal.h"
#include "util/file.h"
#include "util/strbuf.h"

#define ctx comm_ctx
#define TRACK_NAMES_MAX 32

struct trace_rank {
  const struct comm_record *records;
  int n_records;
  const struct comm_span *spans;
  int n_spans;
};

static void json_meta(struct json *j, const char *what, int pid, int tid, const char *name)
{
  json_begin_object(j);
  json_key(j, "name"); json_string(j, what);
  json_key(j, "ph"); json_string(j, "M");
  json_key(j, "pid"); json_int(j, pid);
  json_key(j, "tid"); json_int(j, tid);
  json_key(j, "args"); json_begin_object(j); json_key(j, "name"); json_string(j, name); json_end_object(j);
  json_end_object(j);
}

/* Microseconds, kept to the nanosecond so the file stays short. */
static double trace_us(double seconds) { return round(seconds * 1e9) / 1e3; }

static void json_slice(struct json *j, const char *name, const char *cat, int pid, int tid, double t0, double t1)
{
  json_key(j, "name"); json_string(j, name);
  json_key(j, "cat"); json_string(j, cat);
  json_key(j, "ph"); json_string(j, "X");
  json_key(j, "pid"); json_int(j, pid);
  json_key(j, "tid"); json_int(j, tid);
  json_key(j, "ts"); json_number(j, trace_us(t0));
  json_key(j, "dur"); json_number(j, trace_us(t1 - t0));
}

/* The steps a trace keeps. */
struct trace_steps { long long first, last; };

static int in_steps(const struct trace_steps *k, long long step) { return step >= k->first && step <= k->last; }

static void trace_rank_events(struct json *j, int pid, const struct trace_rank *t, const struct trace_steps *keep)
{
  char tracks[TRACK_NAMES_MAX][COMM_NAME_MAX];
  int n_tracks = 0;
  char label[32];
  snprintf(label, sizeof label, "rank %d", pid);
  json_meta(j, "process_name", pid, 0, label);
  json_meta(j, "thread_name", pid, 0, "caller");
  for (int i = 0; i < t->n_spans; i++) {
    const struct comm_span *sp = &t->spans[i];
    if (!in_steps(keep, sp->step))
      continue;
    json_begin_object(j);
    if (sp->series[0]) { /* a counter: one series of a "C" event, which the viewers plot */
      json_key(j, "name"); json_string(j, sp->name);
      json_key(j, "ph"); json_string(j, "C");
      json_key(j, "pid"); json_int(j, pid);
      json_key(j, "ts"); json_number(j, trace_us(sp->t_begin));
      json_key(j, "args");
      json_begin_object(j);
      json_key(j, sp->series); json_number(j, sp->flops);
      json_end_object(j);
      json_end_object(j);
      continue;
    }
    json_slice(j, sp->name, "caller", pid, 0, sp->t_begin, sp->t_end);
    json_key(j, "args");
    json_begin_object(j);
    json_key(j, "step"); json_int(j, sp->step);
    if (sp->stage >= 0) { json_key(j, "stage"); json_int(j, sp->stage); }
    if (sp->mb >= 0) { json_key(j, "mb"); json_int(j, sp->mb); }
    if (sp->flops > 0) { json_key(j, "flops"); json_number(j, sp->flops); }
    json_end_object(j);
    json_end_object(j);
  }
  for (int i = 0; i < t->n_records; i++) {
    const struct comm_record *r = &t->records[i];
    if (r->t_end <= 0 || !in_steps(keep, r->step))
      continue; /* still in flight, or outside the steps kept */
    int track = 0;
    while (track < n_tracks && strcmp(tracks[track], r->group))
      track++;
    if (track == n_tracks && n_tracks < TRACK_NAMES_MAX) {
      snprintf(tracks[n_tracks++], COMM_NAME_MAX, "%s", r->group);
      snprintf(label, sizeof label, "comm %s", r->group);
      json_meta(j, "thread_name", pid, track + 1, label);
    }
    json_begin_object(j);
    json_slice(j, comm_op_name(r->op), "comm", pid, track + 1, r->t_start, r->t_end);
    json_key(j, "args");
    json_begin_object(j);
    json_key(j, "group"); json_string(j, r->group);
    json_key(j, "seq"); json_int(j, (long long)r->seq);
    json_key(j, "n_bytes"); json_int(j, (long long)r->n_bytes);
    json_key(j, "step"); json_int(j, r->step);
    json_key(j, "mb"); json_int(j, r->mb);
    if (r->peer >= 0) { json_key(j, "peer"); json_int(j, r->peer); }
    json_key(j, "queued_us"); json_number(j, trace_us(r->t_start - r->t_issue));
    json_key(j, "status"); json_string(j, r->status ? "failed" : "ok");
    json_end_object(j);
    json_end_object(j);
  }
}

static int write_json(const char *path, const struct trace_rank *ranks, int n_ranks, const struct trace_steps *keep,
                      char *err, size_t n)
{
  struct strbuf b;
  struct json j;
  sb_init(&b);
  json_init(&j, &b);
  json_begin_object(&j);
  json_key(&j, "traceEvents");
  json_begin_array(&j);
  for (int r = 0; r < n_ranks; r++)
    trace_rank_events(&j, r, &ranks[r], keep);
  json_end_array(&j);
  json_key(&j, "displayTimeUnit"); json_string(&j, "ms");
  json_end_object(&j);
  sb_puts(&b, "\n");
  int status = 0;
  char why[1024] = "";
  /* Written whole to PATH.tmp, synced and renamed (util/file.h): a full disk leaves the old file
   * (or none), never a cut one under the final name, and the message says why. A path that became
   * a FIFO, a device or a folder since the run began is refused, untouched; a link there is
   * replaced, its target left as it is. */
  if (b.failed)
    status = (snprintf(err, n, "comm trace: out of memory"), -1);
  else if (file_write_atomic(NULL, path, b.s, b.n, why, sizeof why))
    status = (snprintf(err, n, "comm trace: %s", why), -1);
  sb_free(&b);
  return status;
}

/* Gathers the records and spans to rank 0 (byte copies: every rank runs the same binary).
 * On rank 0, scratch holds 4 · size ints. */
static int gather(const struct trace_rank *mine, struct trace_rank *all, void **storage, int *scratch,
                  char *err, size_t n)
{
  MPI_Comm ctl = ctx.world->state->ctl;
  int counts[2] = { mine->n_records, mine->n_spans }, root = ctx.rank == 0;
  int *all_counts = scratch, *bytes = root ? scratch + 2 * ctx.size : NULL, *displs = root ? bytes + ctx.size : NULL;
  MPI_CHECK(MPI_Gather(counts, 2, MPI_INT, all_counts, 2, MPI_INT, 0, ctl), err, n);
  for (int what = 0; what < 2; what++) {
    size_t elem = what == 0 ? sizeof(struct comm_record) : sizeof(struct comm_span), total = 0;
    for (int r = 0; root && r < ctx.size; r++) {
      displs[r] = (int)total;
      bytes[r] = all_counts[2 * r + what] * (int)elem;
      total += (size_t)bytes[r];
    }
    if (root && !(storage[what] = malloc(total ? total : 1)))
      return snprintf(err, n, "comm trace: out of memory"), -1;
    const void *send = what == 0 ? (const void *)mine->records : (const void *)mine->spans;
    MPI_CHECK(MPI_Gatherv(send, counts[what] * (int)elem, MPI_BYTE, storage[what], bytes, displs, MPI_BYTE, 0, ctl),
              err, n);
    for (int r = 0; root && r < ctx.size; r++) {
      char *at = (char *)storage[what] + displs[r];
      if (what == 0) {
        all[r].records = (const struct comm_record *)(void *)at;
        all[r].n_records = all_counts[2 * r];
      } else {
        all[r].spans = (const struct comm_span *)(void *)at;
        all[r].n_spans = all_counts[2 * r + 1];
      }
    }
  }
  return 0;
}

int comm_trace_write(const char *path, char *err, size_t n)
{
  return comm_trace_write_steps(path, LLONG_MIN, LLONG_MAX, err, n);
}

int comm_trace_write_steps(const char *path, long long first, long long last, char *err, size_t n)
{
  const struct trace_steps keep = { first, last };
  if (!ctx.initialized)
    return snprintf(err, n, "comm_trace_write: comm_init has not run"), -1;
  int root = ctx.rank == 0;
  struct trace_rank mine = { 0 }, *all = root ? calloc((size_t)ctx.size, sizeof *all) : NULL;
  int *scratch = root ? malloc(4 * (size_t)ctx.size * sizeof *scratch) : NULL;
  struct comm_record *records = malloc((size_t)ctx.n_records_cap * sizeof *records);
  struct comm_span *spans = malloc((size_t)ctx.n_records_cap * sizeof *spans);
  void *storage[2] = { NULL, NULL };
  int status = 0;
  if (!records || !spans || (root && (!all || !scratch))) {
    status = (snprintf(err, n, "comm trace: out of memory"), -1);
  } else {
    pthread_mutex_lock(&ctx.lock);
    mine.n_records = comm_recorder_last(records, ctx.n_records_cap);
    mine.n_spans = comm_recorder_spans(spans, ctx.n_records_cap);
    pthread_mutex_unlock(&ctx.lock);
    mine.records = records;
    mine.spans = spans;
  }
  comm_control_begin("trace gathering");
  if (status) { /* still take part, with nothing, so the others do not wait */
    mine.n_records = mine.n_spans = 0;
  }
  char local_err[COMM_ERR_MAX];
  int gathered = status && root ? -1 /* no room on rank 0: the others wait for the watchdog */
               : gather(&mine, all, storage, scratch, status ? local_err : err, status ? sizeof local_err : n);
  if (!status)
    status = gathered;
  if (root && !status)
    status = write_json(path, all, ctx.size, &keep, err, n);
  int verdict = status;
  int rc = MPI_Bcast(&verdict, 1, MPI_INT, 0, ctx.world->state->ctl);
  comm_control_end();
  if (rc != MPI_SUCCESS && !status)
    status = comm_mpi_fail(rc, "MPI_Bcast", __FILE__, __LINE__, err, n);
  if (verdict && !status)
    status = (snprintf(err, n, "comm trace: rank 0 could not write %s", path), -1);
  free(storage[0]);
  free(storage[1]);
  free(records);
  free(spans);
  free(all);
  free(scratch);
  return status;
}
