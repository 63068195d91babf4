/* The one error path below the CLI: functions return a status and write a one-line message
 * naming the cause and the place into a caller's buffer (never exit(), never print). Beside the
 * message, the calling thread keeps the class of its last fault, which decides the exit code
 * where the status becomes one (docs/design.md, "Exit codes"): an input error — bad content in a
 * file the user gave (weights, token files, checkpoint manifests and shards, cluster files) or a
 * lock held by another run — exits 2, like a plan error; anything else, a failure of the machine
 * or of a peer, exits 1. */
#ifndef TYCHO_ERR_H
#define TYCHO_ERR_H
#include <stddef.h>

/* The convention: a function that can fail returns 0, or −1 with a one-line message in its
 * caller's err, err_size; callers test `!= 0` or `< 0`. */

/* Formats the message into err (when err is not NULL) and returns −1, so a failing function
 * can `return errf(err, err_size, "...")`. */
int errf(char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* errf for a fault found in the content of an input the user gave, at the point it is found:
 * also marks the calling thread's error class as "input" (exit 2). */
int errf_input(char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Marks the calling thread's error class as "input" without a message (a reader that passes on
 * a message written elsewhere). Returns −1. */
int err_mark_input(void);
/* Forgets the class: at the start of each command or operation whose exit code it decides. */
void err_class_reset(void);
/* 1 when an input error was recorded on this thread since the last err_class_reset. */
int err_class_is_input(void);

#endif
