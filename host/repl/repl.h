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
 * ends the job. At the prompt Ctrl-C clears the line. */
#ifndef TYCHO_REPL_H
#define TYCHO_REPL_H
#include <lua.h>
#include <stddef.h>

struct repl_options {
  const char *plan;         /* opened as the global `t` on every rank first, or NULL */
  const char *script;       /* read chunks from this file instead of stdin, or NULL */
  const char *const *sets;  /* --set path=value for the plan */
  int n_sets;
  double timeout;           /* the comm watchdog's seconds during the session (> 0) */
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

#endif
