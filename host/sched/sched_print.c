/* How a simulated step looks to a user (sched.h): the per-rank text timeline `tycho check`
 * prints, drawn the way one draws a pipeline by hand, and the same facts as JSON. */
#include "sched.h"

#include <ctype.h>
#include <string.h>

#define TIMELINE_DEFAULT_WIDTH 120
#define TIMELINE_MAX_COLUMNS 1000000
/* A pipeline of more than ROWS_ALL ranks shows its first ROWS_HEAD and last ROWS_TAIL, as
 * `tycho check`'s rank table does: the text stays short and its cost linear. */
enum { ROWS_ALL = 16, ROWS_HEAD = 8, ROWS_TAIL = 4 };

static int row_shown(int rank, int pp)
{
  return pp <= ROWS_ALL || rank < ROWS_HEAD || rank >= pp - ROWS_TAIL;
}

static int is_compute(int op)
{
  return op == SCHED_FWD || op == SCHED_BWD || op == SCHED_RECOMPUTE || op == SCHED_REDUCE_GRADS ||
         op == SCHED_OPTIMIZER || op == SCHED_BWD_B || op == SCHED_BWD_W;
}

/* Chunk c as a letter, "a" for chunk 0 ("c27" past the alphabet); nothing without virtual stages. */
static void chunk_name(const struct sched *s, int c, char *buf, size_t n)
{
  if (s->v == 1)
    snprintf(buf, n, "%s", "");
  else if (c < 26)
    snprintf(buf, n, "%c", 'a' + c);
  else
    snprintf(buf, n, "c%d", c);
}

/* "F3", "B12", "R3", "W3" (a split list's B is its input-gradient half, W the weight gradient);
 * with virtual stages the chunk follows: "F3b" (chunk 1). */
static void cell_label(const struct sched *s, const struct sched_instr *in, char *buf, size_t n)
{
  const char *op = in->op == SCHED_FWD ? "F" : in->op == SCHED_BWD || in->op == SCHED_BWD_B ? "B"
                   : in->op == SCHED_BWD_W ? "W" : in->op == SCHED_RECOMPUTE ? "R"
                   : in->op == SCHED_REDUCE_GRADS ? "G" : "OPT";
  char chunk[16] = "";
  if (in->stage >= 0)
    chunk_name(s, in->stage / s->pp, chunk, sizeof chunk);
  if (in->op == SCHED_OPTIMIZER)
    snprintf(buf, n, "%s", op);
  else if (in->op == SCHED_REDUCE_GRADS)
    snprintf(buf, n, "%s%s", op, chunk);
  else
    snprintf(buf, n, "%s%d%s", op, in->mb, chunk);
}

/* The shortest forward or backward (or B, W): each of them covers at least one column's middle (a
 * shorter recompute or reduction may fall between two middles and not show). */
static double quantum(const struct sched *s, const struct sched_sim *r)
{
  double q = 0;
  for (int rank = 0; rank < s->pp; rank++)
    for (int i = 0; i < s->ranks[rank].n; i++) {
      double d = r->ranks[rank].end[i] - r->ranks[rank].start[i];
      int op = s->ranks[rank].instr[i].op;
      if ((op == SCHED_FWD || op == SCHED_BWD || op == SCHED_BWD_B || op == SCHED_BWD_W) && d > 0 && (q == 0 || d < q))
        q = d;
    }
  return q;
}

/* Prints a built line without its trailing spaces. */
static void put_line(FILE *f, struct strbuf *b)
{
  size_t n = b->n;
  while (n > 0 && b->s[n - 1] == ' ')
    n--;
  fprintf(f, "%.*s\n", (int)n, b->s ? b->s : "");
  b->n = 0;
}

/* One rank's row: for column c, the compute instruction running at time (c + 1/2)·q. */
static void print_row(FILE *f, struct strbuf *b, const struct sched *s, const struct sched_sim *r, int rank,
                      double q, int columns, int head, int tail, int width)
{
  const struct sched_list *l = &s->ranks[rank];
  const struct sched_sim_rank *sr = &r->ranks[rank];
  int i = 0, last = -1;
  for (int c = 0; c < columns; c++) {
    double mid = (c + 0.5) * q;
    while (i < l->n && (sr->end[i] <= mid || !is_compute(l->instr[i].op) || sr->end[i] == sr->start[i]))
      i++;
    int active = i < l->n && sr->start[i] <= mid;
    char label[32];
    if (!active)
      snprintf(label, sizeof label, ".");
    else if (i == last)
      snprintf(label, sizeof label, "--");
    else
      cell_label(s, &l->instr[i], label, sizeof label);
    if (active)
      last = i;
    if (c < head || c >= columns - tail)
      sb_printf(b, "%-*s", width, label);
    else if (c == head)
      sb_puts(b, "... ");
  }
  put_line(f, b);
}

/* The time at every fifth column (and where the shown tail starts), aligned with the rows. */
static void print_ruler(FILE *f, struct strbuf *b, double q, int columns, int head, int tail, int width)
{
  int spill = 0; /* characters of the last number running into the following cells */
  for (int c = 0; c < columns; c++) {
    if (c >= head && c < columns - tail) {
      if (c == head)
        sb_puts(b, "... ");
      spill = 0;
      continue;
    }
    if (c % 5 == 0 || c == columns - tail) {
      char num[32];
      int len = snprintf(num, sizeof num, "%.4g", c * q);
      int room = ((c < head ? head : columns) - c) * width - 1; /* up to the cut or the end */
      if (len <= room && spill == 0) {
        sb_puts(b, num);
        spill = len;
      }
    }
    for (int k = spill; k < width; k++)
      sb_puts(b, " ");
    spill = spill > width ? spill - width : 0;
  }
  put_line(f, b);
}

void sched_print_timeline(FILE *f, const struct sched *s, const struct sched_sim *r, int max_width)
{
  if (max_width <= 0)
    max_width = TIMELINE_DEFAULT_WIDTH;
  double q = quantum(s, r);
  int columns = q > 0 ? (int)(r->makespan / q + 0.5) : 0;
  if (q > 0 && columns * q < r->makespan * (1 - 1e-9))
    columns++;
  if (columns > TIMELINE_MAX_COLUMNS) { /* absurd cost ratios: coarser columns, short ones may hide */
    q = r->makespan / TIMELINE_MAX_COLUMNS;
    columns = TIMELINE_MAX_COLUMNS;
  }
  /* cell width: the longest label, a space after it */
  int width = 3;
  for (int rank = 0; rank < s->pp; rank++)
    for (int i = 0; i < s->ranks[rank].n; i++) {
      char label[32];
      if (!is_compute(s->ranks[rank].instr[i].op) || r->ranks[rank].end[i] == r->ranks[rank].start[i])
        continue;
      cell_label(s, &s->ranks[rank].instr[i], label, sizeof label);
      if ((int)strlen(label) + 1 > width)
        width = (int)strlen(label) + 1;
    }
  char prefix[32];
  int prefix_width = snprintf(prefix, sizeof prefix, "rank %d | ", s->pp - 1);
  int head = columns, tail = 0;
  if (prefix_width + columns * width > max_width) {
    int fit = (max_width - prefix_width - 4) / width;
    if (fit < 2)
      fit = 2;
    head = fit - fit / 2;
    tail = fit / 2;
  }

  fprintf(f, "schedule %s: pp %d", plan_schedule_name(s->kind), s->pp);
  if (s->v > 1)
    fprintf(f, " × %d virtual stages", s->v);
  fprintf(f, ", %d micro-batch%s; one column = %.3g time unit%s\n", s->m, s->m == 1 ? "" : "es", q,
          q == 1 ? "" : "s");
  struct strbuf b;
  sb_init(&b);
  sb_printf(&b, "%-*s| ", prefix_width - 2, "time");
  print_ruler(f, &b, q, columns, head, tail, width);
  for (int rank = 0; rank < s->pp; rank++) {
    if (!row_shown(rank, s->pp)) {
      if (rank == ROWS_HEAD)
        fprintf(f, "%*s   (%d more ranks; --json lists every rank)\n", prefix_width - 3, "...",
                s->pp - ROWS_HEAD - ROWS_TAIL);
      continue;
    }
    sb_printf(&b, "rank %*d | ", prefix_width - 8, rank);
    print_row(f, &b, s, r, rank, q, columns, head, tail, width);
  }
  sb_free(&b);
  if (head < columns)
    fprintf(f, "(%d of %d columns shown: the first %d and the last %d; the middle repeats the steady "
            "state)\n", head + tail, columns, head, tail);
  fprintf(f, "F<mb> forward, B<mb> backward%s, R<mb> recompute, -- still running, . idle%s%s\n",
          s->split ? " (its input gradient), W<mb> weight gradient" : "", s->costs.reduce_grads > 0 ? ", G gradient reduction" : "", s->costs.optimizer > 0 ? ", OPT optimizer" : "");
  if (s->v > 1) {
    fprintf(f, "chunks:");
    for (int c = 0; c < s->v; c++) {
      if (c == 3 && s->v > 4) {
        fprintf(f, ", ...");
        break;
      }
      char name[16];
      chunk_name(s, c, name, sizeof name);
      fprintf(f, "%s %s = stages %d..%d", c ? "," : "", name, c * s->pp, (c + 1) * s->pp - 1);
    }
    fputc('\n', f);
  }
  fprintf(f, "makespan %.6g, bubble %.1f%% (idle / (pp × makespan)) = %.1f%% of the ideal time (idle / busy)\n",
          r->makespan, 100 * r->bubble_fraction, 100 * r->bubble_over_ideal);
  fprintf(f, "peak in-flight %smicro-batches per rank%s:", s->v > 1 ? "chunk " : "",
          s->split ? " (held until W)" : "");
  for (int rank = 0; rank < s->pp; rank++)
    if (row_shown(rank, s->pp))
      fprintf(f, " %d", r->ranks[rank].peak_inflight);
    else if (rank == ROWS_HEAD)
      fprintf(f, " ... (%d more)", s->pp - ROWS_HEAD - ROWS_TAIL);
  if (s->v > 1)
    fprintf(f, " (each 1/%d of a rank's layers)", s->v);
  fputc('\n', f);
}

static void json_op(struct json *j, int op)
{
  char name[32];
  snprintf(name, sizeof name, "%s", sched_op_name(op));
  for (char *c = name; *c; c++)
    *c = (char)tolower((unsigned char)*c);
  json_string(j, name);
}

static void json_costs(struct json *j, const char *key, const double *v, int n, const uint8_t *only)
{
  json_key(j, key);
  json_begin_array(j);
  for (int i = 0; i < n; i++)
    if (only && !only[i])
      json_null(j);
    else
      json_number(j, v[i]);
  json_end_array(j);
}

void sched_json(struct json *j, const struct sched *s, const struct sched_sim *r)
{
  json_begin_object(j);
  json_key(j, "kind"); json_string(j, plan_schedule_name(s->kind));
  json_key(j, "pp"); json_int(j, s->pp);
  json_key(j, "virtual_stages"); json_int(j, s->v);
  json_key(j, "microbatches"); json_int(j, s->m);
  json_key(j, "split_backward"); json_bool(j, s->split);
  json_key(j, "costs");
  json_begin_object(j);
  json_costs(j, "forward", s->costs.fwd, s->n_stages, NULL);
  json_costs(j, "backward", s->costs.bwd, s->n_stages, NULL);
  json_costs(j, "recompute", s->costs.recompute, s->n_stages, s->recompute);
  if (s->split)
    json_costs(j, "weight_gradient_share", s->costs.w_share, s->n_stages, NULL);
  json_key(j, "comm"); json_number(j, s->costs.comm);
  json_key(j, "reduce_grads"); json_number(j, s->costs.reduce_grads);
  json_key(j, "optimizer"); json_number(j, s->costs.optimizer);
  json_end_object(j);
  json_key(j, "makespan"); json_number(j, r->makespan);
  json_key(j, "idle"); json_number(j, r->idle);
  json_key(j, "bubble_fraction"); json_number(j, r->bubble_fraction);
  json_key(j, "bubble_over_ideal"); json_number(j, r->bubble_over_ideal);
  json_key(j, "ranks");
  json_begin_array(j);
  for (int rank = 0; rank < s->pp; rank++) {
    const struct sched_list *l = &s->ranks[rank];
    const struct sched_sim_rank *sr = &r->ranks[rank];
    json_begin_object(j);
    json_key(j, "rank"); json_int(j, rank);
    json_key(j, "busy"); json_number(j, sr->busy);
    json_key(j, "finish"); json_number(j, sr->finish);
    json_key(j, "peak_inflight"); json_int(j, sr->peak_inflight);
    json_key(j, "compute");
    json_begin_array(j);
    for (int i = 0; i < l->n; i++) {
      const struct sched_instr *in = &l->instr[i];
      if (!is_compute(in->op))
        continue;
      json_begin_object(j);
      json_key(j, "op"); json_op(j, in->op);
      if (in->stage >= 0) {
        json_key(j, "stage"); json_int(j, in->stage);
        json_key(j, "chunk"); json_int(j, in->stage / s->pp);
      }
      if (in->mb >= 0) {
        json_key(j, "mb"); json_int(j, in->mb);
      }
      json_key(j, "start"); json_number(j, sr->start[i]);
      json_key(j, "end"); json_number(j, sr->end[i]);
      json_end_object(j);
    }
    json_end_array(j);
    json_end_object(j);
  }
  json_end_array(j);
  json_end_object(j);
}
