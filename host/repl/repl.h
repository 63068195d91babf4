/* `tycho repl`: an SPMD read-eval-print loop over every rank of the job (docs/repl.md).
 *
 * Rank 0 reads a chunk (readline on a terminal, else lines from stdin or a script file; a chunk
 * whose syntax error ends at <eof> takes continuation lines; `=expr` and a line that compiles as
 * `return <line>` print values), and broadcasts it on the REPL's own control group (not model
 * traffic). Every rank it targets (all by default; `@0`, `@2-3`, `@0,2`, `@dp=0`, `@tp=1,pp=0`
 * select ranks by number or by the mesh coordinates of the global trainer `t`) runs it under a
 * protected call with its `print` and `io.write` captured; the comm layer refuses any operation on
 * a group that reaches outside the targets (comm_restrict). Every rank's output, returned values
 * and error (with traceback) are gathered to rank 0 and shown once per chunk, identical lines of
 * several ranks collapsed under one prefix (`[0-3] ...`). Every chunk ends with that gather, so
 * no rank is left waiting; the session goes on after errors.
 *
 * Ctrl-C during a chunk asks every rank to stop at the next step boundary of `t:step(n)` (rank 0
 * traps it and the ranks agree at each boundary on the REPL's group); a second one within 2 s
 * ends the job. At the prompt Ctrl-C clears the line.
 *
 * Served by a front-end (repl_options.frontend: `tycho repl --frontend DIR`, the ranks a
 * front-end started), nothing is read here: every rank takes the chunks from its own connection
 * to the front-end (repl/link.h), sends its output as it is produced and the chunk's end, and
 * takes interrupts at any time; rank 0 answers completion requests. */
#ifndef TYCHO_REPL_H
#define TYCHO_REPL_H
#include <lua.h>
#include <stddef.h>
#include <stdio.h>

struct repl_options {
  const char *plan;         /* opened as the global `t` on every rank first, or NULL */
  const char *script;       /* read chunks from this file instead of stdin, or NULL */
  const char *const *sets;  /* --set path=value for the plan */
  int n_sets;
  double timeout;           /* the comm watchdog's seconds during the session (> 0) */
  /* served by a front-end (repl --frontend DIR): every rank connects to DIR/sock, says hello
   * with the token in DIR/token, and takes its chunks from there (repl/link.h); NULL: rank 0
   * reads them */
  const char *frontend;
  /* opens the libraries a chunk sees in L (the standard ones and the tycho module) */
  void (*open_libs)(lua_State *L);
  /* objects the garbage collector set aside whose closing is collective (dropped trainers):
   * their serial numbers, and closing a list of them (every rank the same list). NULL: none */
  int (*collected)(unsigned long long *serials, int max);
  void (*close_collected)(const unsigned long long *serials, int n);
};

/* Runs the session on every rank (collective over the world, after comm_init). Returns the exit
 * code: 0; 1 when reading from a script or a pipe and some chunk failed on some rank; 2 for bad
 * options (err says which); the code of quit(code) / os.exit(code) when a chunk asked. */
int repl_run(const struct repl_options *o, char *err, size_t err_size);

/* The stop hook of `t:step(n)` (bindings/tycho_runtime.h): before each step every rank asks;
 * rank 0's pending Ctrl-C is broadcast on the REPL's interrupt group, so every rank gets the
 * same answer (1: stop). 0 outside a session and in a chunk that runs on part of the job. */
int repl_stop_requested(void *ctx);

/* Parses a selector (the text after '@', up to the first space): rank numbers and ranges
 * ("0", "2-3", "0,2-3"), or mesh coordinates ("dp=0", "tp=1,pp=0": all must hold). For numbers
 * fills members (n flags) and returns 0; for coordinates returns 1 and leaves the test to
 * repl_selector_match; −1 with err when it is neither. */
int repl_parse_selector(const char *sel, int n, unsigned char *members, char *err, size_t err_size);
/* 1 when coordinates tp, dp, pp satisfy the coordinate selector sel; −1 with err when sel names
 * another axis. */
int repl_selector_match(const char *sel, int tp, int dp, int pp, char *err, size_t err_size);

/* `tycho run PLAN --listen ADDR` (repl_attach.c): a REPL a front-end attaches to with `tycho repl
 * --attach ADDR`, served between steps with `t` the job's trainer. ADDR is a Unix socket path
 * (created 0600) or HOST:PORT; the session token is written to ADDR.token (or
 * tycho-listen-PORT.token), mode 0600, and a connection must present it; one front-end at a
 * time; refusals are logged on `log`. While attached, training goes on between chunks unless a
 * chunk called t:pause() (then the ranks wait for chunks until t:resume() or detach()).
 * detach(), quit(), Ctrl-D or a closed front-end leave the job training. */
struct repl_attach_options {
  const char *addr;
  FILE *log;                 /* rank 0: the job's output (NULL elsewhere) */
  void (*open_libs)(lua_State *L);
  /* sets the global t in L to the job's trainer, borrowed: closing it is the job's */
  void (*bind_trainer)(lua_State *L, void *trainer);
  int (*collected)(unsigned long long *serials, int max);
  void (*close_collected)(const unsigned long long *serials, int n);
};
/* Listens (rank 0) and opens the session's state on every rank. Collective; 0, or −1 with err. */
int repl_attach_open(const struct repl_attach_options *o, char *err, size_t err_size);
/* Between two steps: serves what the front-end sent (*step: the trainer's step, read as chunks
 * move it, for the log). Collective; 0, or −1 with err when the comm layer failed. */
int repl_attach_between_steps(void *trainer, const long long *step, char *err, size_t err_size);
/* Closes the socket (its file and the token file removed) and the session's state. */
void repl_attach_close(void);

#endif
