/* Inside the REPL: the session's state and what repl.c (the session, Ctrl-C, running a chunk),
 * repl_read.c (selectors, reading a chunk, tab completion, the plan's open), repl_agree.c (the
 * chunk broadcast, dropped trainers), repl_show.c (showing every rank's output), repl_attach.c
 * (a running job's REPL) and the front-end share. Not for use outside host/repl/. */
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
  /* served by a front-end (repl --frontend): the connection, or −1 */
  int link_fd;
  int link_broken;        /* a send failed: the front-end is gone, nothing more is sent */
  struct strbuf line;     /* output not sent yet (a partial line) */
  size_t out_total;       /* bytes of output this chunk took (the OUTPUT_MAX_BYTES cut) */
  int line_open;          /* the last byte sent was not a newline */
  unsigned long long ops_at_chunk; /* comm_ops_started() when the running chunk began */
  /* attached to a running job (repl_attach.c): rank 0 looks for the front-end's Ctrl-C at each
   * step boundary of a chunk (sets interrupt_pending), or NULL */
  void (*poll_interrupt)(void);
};
extern struct repl_session *const repl_state;

/* Where rank 0 reads chunks from: set up by repl_run, read by repl_read_chunk. */
struct reader {
  FILE *in;
  int tty, echo;
  int eof;
  const char *history; /* the history file each chunk read on a terminal is appended to, or NULL */
};

/* repl_read.c: the next chunk into b, its selector (without '@'; empty for every rank) into sel.
 * 0, or −1 at the end of input. */
int repl_read_chunk(struct reader *r, lua_State *L, struct strbuf *b, char *sel, size_t sel_size);
/* repl_read.c: the completions of word (the text before the cursor: "t.", "t:ste", "tycho.op") in
 * L: globals, a table's fields after '.', a value's fields (its metatable's __fields list) and
 * methods after '.', methods after ':'. Each full word (prefix included) and a newline into out,
 * sorted, without repeats; returns how many. Metamethods that fail give no names. */
int repl_completions(lua_State *L, const char *word, struct strbuf *out);
#ifdef TYCHO_HAVE_READLINE
/* repl_read.c: readline's completion of the word at the cursor (rank 0), by repl_completions. */
char **repl_complete_names(const char *text, int start, int end);
#endif

/* repl.c: the first chunk of a session with a plan, `t = tycho.open("PLAN", {"path=value", ...})`,
 * appended to b. */
void repl_open_chunk(struct strbuf *b, const char *plan, const char *const *sets, int n_sets);

/* repl.c, for the attached session (repl_attach.c) as for repl_run: */
struct repl_options;
/* print, io.write, quit and os.exit captured into the session's output; help (repl_install_help). */
void repl_install_capture(lua_State *L);
/* repl_read.c: the global help (tycho.help, where the state has the module) and the REPL's own
 * commands for it to list. */
void repl_install_help(lua_State *L);
/* Rank 0's chunk message ("kind code", selector, code) broadcast on the REPL's group; every rank
 * gets it in *msg (malloc'd; NULL when it had no room). idle: the others' wait sleeps (the wait
 * for a person's next chunk), the same on every rank. 0, or −1 with err. Collective. */
int repl_exchange_chunk(int kind, int code_exit, const char *sel, const char *code, size_t n, int idle, char **msg,
                        size_t *msg_n, char *err, size_t err_size);
/* Runs one chunk message on every rank it selects (collective): RANK_* flags into *flags. 0, or
 * −1 with err when the comm layer failed. */
int repl_run_message(lua_State *L, const char *sel, const char *code, size_t code_n, int have, int *flags,
                     char *err, size_t err_size);
/* After a chunk: trainers every rank dropped are closed (collective). 0, or −1 with err. */
int repl_close_dropped(const struct repl_options *o, lua_State *L, char *err, size_t err_size);

/* After a chunk (collective): every rank's RANK_* flags, quit code and output (the session's
 * out) gathered to rank 0 on the REPL's group and shown there on `out` (repl_show); rank 0 sets
 * *any_failed when some rank failed and *first_quit (when still < 0) to the lowest quitting
 * rank's code. 0, or −1 with err. */
int repl_gather_show(int flags, int quit_code, const char *what, FILE *out, int *any_failed, int *first_quit,
                     char *err, size_t err_size);

/* repl_show.c: every rank's output under rank prefixes, identical lines collapsed. */
void repl_show(char **texts, const int *status, int size, FILE *out);

#endif
