/* Showing (rank 0) what every rank of a REPL chunk printed: one prefix per set of ranks, identical
 * lines of several ranks collapsed under one prefix (`[0-3] ...`). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "repl/repl_internal.h"

/* ---- showing (rank 0) ---- */

struct lines {
  int n;
  char **at; /* pointers into the rank's text, 0-terminated lines */
};

static void split_lines(char *text, struct lines *l)
{
  l->n = 0;
  l->at = NULL;
  if (!text || !*text)
    return;
  int cap = 8;
  l->at = malloc((size_t)cap * sizeof *l->at);
  char *s = text;
  while (*s && l->at) {
    if (l->n == cap) {
      cap *= 2;
      char **grown = realloc(l->at, (size_t)cap * sizeof *l->at);
      if (!grown)
        break;
      l->at = grown;
    }
    l->at[l->n++] = s;
    char *nl = strchr(s, '\n');
    if (!nl)
      break;
    *nl = 0;
    s = nl + 1;
  }
}

/* Lines [from[r], to[r]) of each rank r that ran (l[r].at != NULL), printed line by line when
 * every rank has as many, identical lines of several ranks under one prefix; else rank by rank,
 * ranks with the same lines under one prefix. */
static void show_range(struct lines *l, const int *from, const int *to, int size, unsigned char *set,
                       unsigned char *done, FILE *out)
{
  char ranks[512];
  int same_count = 1, n_lines = -1;
  for (int r = 0; r < size; r++) {
    if (!l[r].at)
      continue;
    if (n_lines < 0)
      n_lines = to[r] - from[r];
    same_count = same_count && to[r] - from[r] == n_lines;
  }
  if (n_lines < 0)
    return;
  if (same_count) {
    for (int i = 0; i < n_lines; i++) {
      memset(done, 0, (size_t)size);
      for (int r = 0; r < size; r++) {
        if (done[r] || !l[r].at)
          continue;
        const char *line = l[r].at[from[r] + i];
        memset(set, 0, (size_t)size);
        for (int q = r; q < size; q++)
          if (!done[q] && l[q].at && strcmp(l[q].at[from[q] + i], line) == 0)
            set[q] = done[q] = 1;
        comm_format_ranks(set, size, ranks, sizeof ranks);
        fprintf(out, "[%s] %s\n", ranks, line);
      }
    }
    return;
  }
  memset(done, 0, (size_t)size);
  for (int r = 0; r < size; r++) {
    if (done[r] || !l[r].at)
      continue;
    memset(set, 0, (size_t)size);
    for (int q = r; q < size; q++) {
      int same = !done[q] && l[q].at && to[q] - from[q] == to[r] - from[r];
      for (int i = 0; same && i < to[r] - from[r]; i++)
        same = strcmp(l[q].at[from[q] + i], l[r].at[from[r] + i]) == 0;
      if (same)
        set[q] = done[q] = 1;
    }
    comm_format_ranks(set, size, ranks, sizeof ranks);
    for (int i = from[r]; i < to[r]; i++) fprintf(out, "[%s] %s\n", ranks, l[r].at[i]);
  }
}

/* Prints every rank's output under rank prefixes: the lines every rank begins with and ends with
 * once for all of them, what lies between as show_range does. So a value all ranks return after
 * lines only rank 0 printed (t:step's progress) still shows once: [0-3] 4.1677. */
void repl_show(char **texts, const int *status, int size, FILE *out)
{
  if (size == 1) {
    if (texts[0])
      fputs(texts[0], out);
    return;
  }
  struct lines *l = calloc((size_t)size, sizeof *l);
  unsigned char *set = calloc((size_t)size, 1), *done = calloc((size_t)size, 1);
  int *from = calloc((size_t)size, sizeof *from), *to = calloc((size_t)size, sizeof *to);
  if (!l || !set || !done || !from || !to) {
    for (int r = 0; r < size; r++)
      if (texts[r])
        fprintf(out, "[%d] %s", r, texts[r]);
    goto out;
  }
  int n_ran = 0, shortest = -1;
  for (int r = 0; r < size; r++) {
    if (!(status[r] & RANK_RAN))
      continue;
    if (!texts[r]) {
      fprintf(out, "[%d] (its output was lost: rank 0 had no memory for it)\n", r);
      continue;
    }
    split_lines(texts[r], &l[r]);
    if (!l[r].at) { /* nothing printed: take part with no lines */
      static char *none[1];
      l[r].at = none;
      l[r].n = 0;
    }
    n_ran++;
    shortest = shortest < 0 || l[r].n < shortest ? l[r].n : shortest;
  }
  if (!n_ran)
    goto out;
  /* the common first and last lines (not overlapping in the shortest output) */
  int head = 0, tail = 0;
  for (;; head++) {
    int same = head < shortest;
    const char *first = NULL;
    for (int r = 0; same && r < size; r++)
      if (l[r].at) {
        if (!first)
          first = l[r].at[head];
        same = strcmp(l[r].at[head], first) == 0;
      }
    if (!same)
      break;
  }
  for (;; tail++) {
    int same = head + tail < shortest;
    const char *last = NULL;
    for (int r = 0; same && r < size; r++)
      if (l[r].at) {
        const char *x = l[r].at[l[r].n - 1 - tail];
        if (!last)
          last = x;
        same = strcmp(x, last) == 0;
      }
    if (!same)
      break;
  }
  memset(set, 0, (size_t)size);
  for (int r = 0; r < size; r++) set[r] = l[r].at != NULL;
  char ranks[512];
  comm_format_ranks(set, size, ranks, sizeof ranks);
  int any = -1;
  for (int r = 0; r < size && any < 0; r++) any = l[r].at ? r : -1;
  for (int i = 0; i < head; i++) fprintf(out, "[%s] %s\n", ranks, l[any].at[i]);
  if (head || tail) {
    for (int r = 0; r < size; r++) {
      from[r] = head;
      to[r] = l[r].at ? l[r].n - tail : head;
    }
    /* ranks with nothing between print nothing there */
    show_range(l, from, to, size, set, done, out);
  } else {
    for (int r = 0; r < size; r++) {
      from[r] = 0;
      to[r] = l[r].n;
    }
    show_range(l, from, to, size, set, done, out);
  }
  memset(set, 0, (size_t)size);
  for (int r = 0; r < size; r++) set[r] = l[r].at != NULL;
  for (int i = tail; i > 0; i--) fprintf(out, "[%s] %s\n", ranks, l[any].at[l[any].n - i]);
out:
  for (int r = 0; l && r < size; r++)
    if (l[r].n)
      free(l[r].at);
  free(l);
  free(set);
  free(done);
  free(from);
  free(to);
}
