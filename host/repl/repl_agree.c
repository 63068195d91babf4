/* The REPL's steps every rank takes together (repl_internal.h): rank 0's chunk broadcast on the
 * REPL's group, and after each chunk the agreement on the trainers the ranks dropped. */
#define _POSIX_C_SOURCE 200809L
#include <lauxlib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "repl/repl.h"
#include "repl/repl_internal.h"
#include "util/strbuf.h"

#define S (*repl_state)

/* A chunk message: "kind code", the selector and the code, 0-terminated each. Rank 0 builds it
 * from its arguments and broadcasts it; every rank (rank 0 too) gets it in *msg (malloc'd), or
 * NULL when it had no room (the bytes are still received, so nobody waits). */
int repl_exchange_chunk(int kind, int code_exit, const char *sel, const char *code, size_t n, int idle, char **msg,
                        size_t *msg_n, char *err, size_t err_size)
{
  *msg = NULL;
  *msg_n = 0;
  struct strbuf m;
  sb_init(&m);
  unsigned long long len = 0;
  if (S.rank == 0) {
    char head[32];
    int k = snprintf(head, sizeof head, "%d %d", kind, code_exit);
    sb_put(&m, head, (size_t)k + 1);
    sb_put(&m, sel, strlen(sel) + 1);
    sb_put(&m, code ? code : "", code ? n : 0);
    sb_put(&m, "", 1);
    if (m.failed) { /* a quit the others can act on, and the reason here */
      sb_free(&m);
      sb_init(&m);
      sb_put(&m, "2 1\0\0\0", 7);
      snprintf(err, err_size, "out of memory for a chunk of %zu bytes", n);
    }
    len = m.n;
  }
  /* idle: the wait for the next chunk sleeps (NULL: comm.h); else a wait at a step boundary */
  if (comm_control_bcast(S.group, &len, sizeof len, 0, idle ? NULL : "the attached REPL's check between steps", err,
                         err_size)) {
    sb_free(&m);
    return -1;
  }
  char *buf = S.rank == 0 ? m.s : malloc((size_t)len + 1);
  static char scratch[1 << 16];
  int rc = comm_control_bcast(S.group, buf ? buf : scratch,
                              buf ? (size_t)len : (len < sizeof scratch ? (size_t)len : sizeof scratch), 0,
                              "the REPL's chunk broadcast", err, err_size);
  if (rc) {
    if (S.rank != 0)
      free(buf);
    sb_free(&m);
    return -1;
  }
  if (S.rank == 0) { /* the strbuf's block is the message */
    m.s = NULL;
    sb_free(&m);
  }
  *msg = buf;
  *msg_n = (size_t)len;
  return 0;
}

/* After a chunk: a full collection on every rank, then the trainers every rank has set aside are
 * closed, in rank 0's order (a trainer only some ranks dropped waits until all have). */
int repl_close_dropped(const struct repl_options *o, lua_State *L, char *err, size_t err_size)
{
  enum { MAX_SET_ASIDE = 256 };
  if (!o->collected || !o->close_collected)
    return 0;
  lua_gc(L, LUA_GCCOLLECT);
  lua_gc(L, LUA_GCCOLLECT); /* finalizers ran in the first */
  unsigned long long mine[MAX_SET_ASIDE];
  int n = o->collected(mine, MAX_SET_ASIDE);
  n = n < MAX_SET_ASIDE ? n : MAX_SET_ASIDE;
  char **per = S.rank == 0 ? calloc((size_t)S.size, sizeof *per) : NULL;
  size_t *counts = S.rank == 0 ? calloc((size_t)S.size, sizeof *counts) : NULL;
  char *none[1] = { NULL };
  size_t zero[1] = { 0 };
  if ((S.rank == 0 && (!per || !counts)) ||
      comm_control_gather(S.group, mine, (size_t)n * sizeof *mine, 0, per ? per : none, counts ? counts : zero,
                          "the REPL's agreement on dropped trainers", err, err_size)) {
    free(per);
    free(counts);
    return -1;
  }
  unsigned long long all[MAX_SET_ASIDE + 1];
  int n_all = 0;
  if (S.rank == 0) { /* rank 0's that every other rank has too */
    for (int i = 0; i < n; i++) {
      int everywhere = 1;
      for (int q = 1; q < S.size && everywhere; q++) {
        const unsigned long long *theirs = (const unsigned long long *)per[q];
        const size_t k = per[q] ? counts[q] / sizeof *theirs : 0;
        int found = 0;
        for (size_t j = 0; j < k && !found; j++) {
          unsigned long long v;
          memcpy(&v, theirs + j, sizeof v);
          found = v == mine[i];
        }
        everywhere = found;
      }
      if (everywhere)
        all[1 + n_all++] = mine[i];
    }
    for (int q = 0; q < S.size; q++) free(per[q]);
  }
  free(per);
  free(counts);
  all[0] = (unsigned long long)n_all;
  if (comm_control_bcast(S.group, all, sizeof all, 0, "the REPL's agreement on dropped trainers", err, err_size))
    return -1;
  if (all[0])
    o->close_collected(all + 1, (int)all[0]);
  return 0;
}

int repl_gather_show(int flags, int quit_code, const char *what, FILE *out, int *any_failed, int *first_quit,
                     char *err, size_t err_size)
{
  struct strbuf reply;
  sb_init(&reply);
  sb_printf(&reply, "%d %d\n", flags, quit_code);
  sb_put(&reply, S.out.s ? S.out.s : "", S.out.n);
  char **per = S.rank == 0 ? calloc((size_t)S.size, sizeof *per) : NULL;
  size_t *counts = S.rank == 0 ? calloc((size_t)S.size, sizeof *counts) : NULL;
  char *none[1] = { NULL };
  size_t zero[1] = { 0 };
  int rc = comm_control_gather(S.group, reply.s ? reply.s : "1 0\n", reply.n ? reply.n : 4, 0, per ? per : none,
                               counts ? counts : zero, what, err, err_size);
  sb_free(&reply);
  if (!rc && S.rank == 0) {
    int *status = calloc((size_t)S.size, sizeof *status);
    char **texts = calloc((size_t)S.size, sizeof *texts);
    for (int q = 0; status && texts && q < S.size; q++) {
      int f = RANK_RAN, qc = 0;
      char *nl = per && per[q] ? strchr(per[q], '\n') : NULL;
      if (nl && sscanf(per[q], "%d %d", &f, &qc) == 2) {
        texts[q] = nl + 1;
      } else {
        f = RANK_RAN;
        texts[q] = NULL; /* lost: show says so */
      }
      status[q] = f;
      if (f & RANK_FAILED)
        *any_failed = 1;
      if ((f & RANK_QUIT) && *first_quit < 0)
        *first_quit = qc; /* the lowest quitting rank's code */
    }
    if (status && texts)
      repl_show(texts, status, S.size, out);
    fflush(out);
    free(status);
    free(texts);
  }
  for (int q = 0; per && q < S.size; q++) free(per[q]);
  free(per);
  free(counts);
  return rc;
}
