/* What `tycho run` shows a user (train_run.c), for every loop that trains: the progress line of
 * a step, the evaluation line and durations.
 * train_run prints them on its FILE; the REPL's trainer (bindings/tycho_runtime.c) hands the same
 * text to Lua's print, so a step looks the same in both. */
#ifndef TYCHO_RUNTIME_TRAIN_PROGRESS_H
#define TYCHO_RUNTIME_TRAIN_PROGRESS_H
#include <stddef.h>

#include "runtime/train/train.h"

/* "42.3s", "3m07s", "1h02m". Returns buf. */
const char *train_format_duration(char *buf, size_t n, double seconds);
/* The progress line of step s->step (0-based), without a newline:
 * "step  5/20 | loss 3.1234 | lr 3.00e-03 | grad norm 0.123 | 51234 tok/s | 1.2s | ETA 6.1s":
 * steps done out of `total`, the tokens per second of the steps since the last line, the time
 * since the loop began, and the time the loop still needs (`eta` seconds). */
void train_format_progress(char *buf, size_t n, const struct train_step_stats *s, long long total,
                           double tokens_per_sec, double elapsed, double eta);
/* "eval at step 10: val loss 2.3104, accuracy 12.5% (256 held-out problems)", without a
 * newline; 0 (buf empty) when the evaluation had nothing to measure, else 1. */
int train_format_eval(char *buf, size_t n, const struct train_eval_stats *e);

#endif
