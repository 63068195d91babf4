/* The one error path below the CLI: functions return a status and write a one-line message
 * naming the cause and the place into a caller's buffer (never exit(), never print). */
#ifndef TYCHO_ERR_H
#define TYCHO_ERR_H
#include <stddef.h>

/* The convention: a function that can fail returns 0, or −1 with a one-line message in its
 * caller's err, err_size; callers test `!= 0` or `< 0`. */

/* Formats the message into err (when err is not NULL) and returns −1, so a failing function
 * can `return errf(err, err_size, "...")`. */
int errf(char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
