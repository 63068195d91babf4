/* `tycho check PLAN --svg FILE`: one self-contained SVG picture of the plan's training step — a
 * lane per pipeline rank with every forward, backward and recompute block where the schedule
 * simulator places it (the simulation `check` prints its timeline and bubble from), the idle
 * parts shaded — and below it each pipeline rank's memory bill as a stacked bar against the
 * device's memory (with a cluster file). */
#ifndef TYCHO_CHECK_SVG_H
#define TYCHO_CHECK_SVG_H
#include <stddef.h>

#include "plan/cluster.h"
#include "plan/plan.h"
#include "util/strbuf.h"

/* The picture into b (cluster: NULL, or the cluster that prices the step and holds the device
 * memory). Parts that cannot be computed (no schedule, no bill) are drawn as a line saying why. */
void check_svg(const struct plan *p, const struct cluster *cluster, struct strbuf *b);

/* The picture written to `path` atomically (PATH.tmp, synced, renamed over it). A symbolic link
 * at `path`, anything there that is not a regular file, or a folder that does not exist is
 * refused before anything is written: 2 with "--svg PATH: ..." in err. 0 ok; −1 when writing
 * fails (out of memory, a write or rename error). */
int check_svg_write(const struct plan *p, const struct cluster *cluster, const char *path, char *err,
                    size_t err_size);

#endif
