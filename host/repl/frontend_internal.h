/* Inside the REPL's front-end: what frontend.c (the ranks, the prompt, Ctrl-C, the end) and
 * frontend_show.c (showing each chunk's output as it arrives) share. Not for use elsewhere. */
#ifndef TYCHO_REPL_FRONTEND_INTERNAL_H
#define TYCHO_REPL_FRONTEND_INTERNAL_H
#include <stddef.h>

#include "util/strbuf.h"

/* A line some ranks printed waits this long for the others' line before it is shown alone: so
 * lines all ranks print collapse, and progress only rank 0 prints still appears live. */
#define SHOW_ALONE_AFTER 0.3

struct pending {
  char *text;
  double at; /* when it arrived */
};

struct rank_link {
  int fd;
  int done, flags, quit_code;
  struct strbuf partial; /* output after its last newline */
  struct pending *q;     /* lines not shown yet: [head, n) */
  int head, n, cap;
};

/* The monotonic clock, in seconds. */
double fe_now(void);
/* A rank's output bytes: split into lines (a partial one kept), each queued with its time. */
void fe_output(struct rank_link *k, const char *s, size_t n);
/* The lines of ranks r[0..n) that can be shown now, into out: a line every rank still running
 * printed alike, or lines that waited SHOW_ALONE_AFTER for the others. The seconds until a waiting
 * line is due, or −1 when none waits. */
double fe_show_ready(struct rank_link *r, int n, struct strbuf *out);
/* At the chunk's end: every rank's remaining lines on stdout, collapsed as repl_show does; the
 * queues emptied. */
void fe_show_rest(struct rank_link *r, int n);

#endif
