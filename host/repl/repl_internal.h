/* Inside the REPL: the session's state and what repl.c (the session, Ctrl-C, running a chunk),
 * repl_read.c (selectors, reading a chunk, tab completion) and repl_show.c (showing every rank's
 * output) share. Not for use outside host/repl/. */
#ifndef TYCHO_REPL_INTERNAL_H
#define TYCHO_REPL_INTERNAL_H
#include <lua.h>
#include <signal.h>
#include <stdio.h>

#include "util/strbuf.h"

struct comm_group;

enum { LINE_MAX_BYTES = 8192, OUTPUT_MAX_BYTES = 256 * 1024 };
enum chunk_kind { CHUNK_RUN = 1, CHUNK_QUIT = 2 };
enum rank_status { RANK_RAN = 1, RANK_FAILED = 2, RANK_QUIT = 4 };

/* The session's state, one per process: repl.c's S, which repl_state points to. */
struct repl_session {
  struct comm_group *world, *group, *interrupt_group; /* the REPL's own groups (split of the world) */
  int rank, size;
  int restricted;        /* the running chunk targets part of the job */
  lua_State *L;
  struct strbuf out;     /* what this rank's chunk printed */
  int out_cut;           /* bytes dropped past OUTPUT_MAX_BYTES */
  int quit_code, quit;   /* a chunk called quit(code) / os.exit(code) */
  volatile sig_atomic_t interrupt_pending, in_chunk, at_prompt;
  int chunk_interrupted; /* a step boundary of this chunk stopped it (agreed: the same everywhere) */
  double last_interrupt;
};
extern struct repl_session *const repl_state;

/* Where rank 0 reads chunks from: set up by repl_run, read by repl_read_chunk. */
struct reader {
  FILE *in;
  int tty, echo;
  int eof;
};

/* repl_read.c: the next chunk into b, its selector (without '@'; empty for every rank) into sel.
 * 0, or −1 at the end of input. */
int repl_read_chunk(struct reader *r, lua_State *L, struct strbuf *b, char *sel, size_t sel_size);
#ifdef TYCHO_HAVE_READLINE
/* repl_read.c: readline's completion of the word at the cursor (rank 0). */
char **repl_complete_names(const char *text, int start, int end);
#endif

/* repl_show.c: every rank's output under rank prefixes, identical lines collapsed. */
void repl_show(char **texts, const int *status, int size, FILE *out);

#endif
