/* The front-end's showing of each chunk's output (frontend_internal.h): every rank's lines queued
 * as they arrive, shown when all running ranks printed the same (once, under their prefix) or when
 * a line has waited SHOW_ALONE_AFTER for the others; the rest at the chunk's end as repl_show
 * collapses it. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "repl/frontend_internal.h"
#include "repl/repl_internal.h"
#include "util/strbuf.h"

double fe_now(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


static void push_line(struct rank_link *k, const char *s, size_t n, double at)
{
  if (k->n == k->cap) {
    if (k->head) { /* reuse the shown part */
      memmove(k->q, k->q + k->head, (size_t)(k->n - k->head) * sizeof *k->q);
      k->n -= k->head;
      k->head = 0;
    }
    if (k->n == k->cap) {
      int cap = k->cap ? 2 * k->cap : 16;
      struct pending *grown = realloc(k->q, (size_t)cap * sizeof *grown);
      if (!grown)
        return; /* the line is lost; the session goes on */
      k->q = grown;
      k->cap = cap;
    }
  }
  char *text = strndup(s, n);
  if (!text)
    return;
  k->q[k->n].text = text;
  k->q[k->n].at = at;
  k->n++;
}

void fe_output(struct rank_link *k, const char *s, size_t n)
{
  const double at = fe_now();
  sb_put(&k->partial, s, n);
  size_t from = 0;
  for (size_t i = 0; i < k->partial.n; i++)
    if (k->partial.s[i] == '\n') {
      push_line(k, k->partial.s + from, i - from, at);
      from = i + 1;
    }
  memmove(k->partial.s, k->partial.s + from, k->partial.n - from);
  k->partial.n -= from;
}

/* Shows the head line of every rank flagged in take, identical ones under one prefix. */
static void show_row(struct rank_link *rl, int n, const unsigned char *take, unsigned char *set, unsigned char *shown,
                     struct strbuf *out)
{
  char ranks[512];
  memset(shown, 0, (size_t)n);
  for (int r = 0; r < n; r++) {
    if (!take[r] || shown[r])
      continue;
    const char *line = rl[r].q[rl[r].head].text;
    memset(set, 0, (size_t)n);
    for (int s = r; s < n; s++)
      if (take[s] && !shown[s] && strcmp(rl[s].q[rl[s].head].text, line) == 0)
        set[s] = shown[s] = 1;
    comm_format_ranks(set, n, ranks, sizeof ranks);
    sb_printf(out, "[%s] %s\n", ranks, line);
  }
  for (int r = 0; r < n; r++)
    if (take[r])
      free(rl[r].q[rl[r].head++].text);
}

/* The lines that can be shown now into out: a line every rank still running has printed alike
 * (ranks done with nothing left stand aside), or lines waiting over SHOW_ALONE_AFTER for the
 * others. Returns the seconds until a waiting line is due, or −1 when none waits. */
double fe_show_ready(struct rank_link *rl, int n, struct strbuf *out)
{
  unsigned char *take = calloc((size_t)n, 1), *set = calloc((size_t)n, 1), *shown = calloc((size_t)n, 1);
  double due = -1;
  while (take && set && shown) {
    if (n == 1) { /* one rank: its lines as they are */
      struct rank_link *k = &rl[0];
      for (; k->head < k->n; k->head++) {
        sb_printf(out, "%s\n", k->q[k->head].text);
        free(k->q[k->head].text);
      }
      break;
    }
    int any = 0, ready = 1, alike = 1;
    const char *first = NULL;
    double oldest = 0;
    for (int r = 0; r < n; r++) {
      struct rank_link *k = &rl[r];
      if (k->head < k->n) {
        const char *line = k->q[k->head].text;
        if (!any || k->q[k->head].at < oldest)
          oldest = k->q[k->head].at;
        any = 1;
        if (!first)
          first = line;
        else if (strcmp(first, line) != 0)
          alike = 0;
      } else if (!k->done) {
        ready = 0;
      }
    }
    if (!any)
      break;
    const double t = fe_now();
    if (ready && alike) {
      for (int r = 0; r < n; r++) take[r] = rl[r].head < rl[r].n;
    } else {
      if (t - oldest < SHOW_ALONE_AFTER) {
        due = SHOW_ALONE_AFTER - (t - oldest);
        break;
      }
      for (int r = 0; r < n; r++)
        take[r] = rl[r].head < rl[r].n && t - rl[r].q[rl[r].head].at >= SHOW_ALONE_AFTER;
    }
    show_row(rl, n, take, set, shown, out);
  }
  free(take);
  free(set);
  free(shown);
  return due;
}

/* At the chunk's end: what is left of every rank's output, as the one-process REPL shows a
 * chunk's (repl_show: the lines all ranks end with once for all of them). */
void fe_show_rest(struct rank_link *rl, int n)
{
  int *status = calloc((size_t)n, sizeof *status);
  char **texts = calloc((size_t)n, sizeof *texts);
  for (int r = 0; r < n; r++) {
    struct rank_link *k = &rl[r];
    if (k->partial.n) { /* a last line without its newline */
      push_line(k, k->partial.s, k->partial.n, fe_now());
      k->partial.n = 0;
    }
  }
  if (status && texts && n > 1) {
    for (int r = 0; r < n; r++) {
      struct rank_link *k = &rl[r];
      status[r] = k->flags;
      struct strbuf t;
      sb_init(&t);
      sb_puts(&t, "");
      for (int i = k->head; i < k->n; i++) sb_printf(&t, "%s\n", k->q[i].text);
      texts[r] = t.failed ? NULL : t.s;
      if (!texts[r] && (k->flags & RANK_RAN))
        status[r] = 0;
    }
    repl_show(texts, status, n, stdout);
  } else { /* one rank; or, lacking memory above, line by line */
    struct strbuf out;
    sb_init(&out);
    fe_show_ready(rl, n, &out);
    if (out.n)
      fwrite(out.s, 1, out.n, stdout);
    sb_free(&out);
  }
  fflush(stdout);
  for (int r = 0; r < n; r++) {
    struct rank_link *k = &rl[r];
    for (int i = k->head; i < k->n; i++) free(k->q[i].text);
    k->head = k->n = 0;
    if (texts)
      free(texts[r]);
  }
  free(status);
  free(texts);
}
