/* `tycho repl -n N`: the front-end, the process at the user's terminal. It starts the N ranks
 * through a launcher (`repl --frontend DIR` on each), takes their connections over a Unix socket
 * in a private folder (repl/link.h), reads chunks (readline, history, completion asked of rank 0),
 * sends each to every rank and shows their output as it arrives, identical lines of several ranks
 * collapsed under one prefix (`[0-3] ...`). Ctrl-C during a chunk interrupts it on every rank; a
 * second one within 2 s ends the job. It never initialises MPI itself. */
#ifndef TYCHO_REPL_FRONTEND_H
#define TYCHO_REPL_FRONTEND_H
#include <stddef.h>

struct repl_frontend_options {
  const char *plan;        /* opened as the global `t` on every rank first, or NULL */
  const char *script;      /* read chunks from this file instead of stdin, or NULL */
  const char *const *sets; /* --set path=value for the plan */
  int n_sets;
  int ranks;               /* the ranks to start (≥ 1) */
  const char *launcher;    /* the launcher's template, "{n}" the rank count (util/launch.h) */
  const char *self;        /* this executable, started on every rank */
  double timeout;          /* the ranks' --timeout (the comm watchdog's seconds) */
  /* `tycho repl --attach ADDR`: no ranks started; one connection to a job's `tycho run
   * --listen ADDR` (repl.h), its token read from token_file (NULL: the one --listen wrote next
   * to ADDR). Ctrl-D, quit() and a second Ctrl-C detach; the job goes on. */
  const char *attach;
  const char *token_file;
};

/* Runs the session. Returns the exit code (as the one-process `tycho repl`: 0; 1 when reading
 * from a script or a pipe and some chunk failed; the code of quit(code); 130 after a second
 * Ctrl-C; 1 when a rank or the launcher ended the session, its message already printed); err
 * holds a message for main to report (2: bad options, before anything started), or is empty. */
int repl_frontend_run(const struct repl_frontend_options *o, char *err, size_t err_size);

#endif
