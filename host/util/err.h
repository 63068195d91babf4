/* The one error path below the CLI: functions return a status and write a one-line message
 * naming the cause and the place into a caller's buffer (never exit(), never print). */
#ifndef TYCHO_ERR_H
#define TYCHO_ERR_H
#include <stddef.h>

/* Formats the message into err (when err is not NULL) and returns 1, so a failing function
 * can `return errf(err, err_size, "...")`. */
int errf(char *err, size_t err_size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
