/* `tycho check` output: the compiled plan for people (compact at any world size) and as one
 * JSON document for programs (docs/check-json.md). */
#ifndef TYCHO_CHECK_H
#define TYCHO_CHECK_H
#include <stdio.h>

#include "plan/cluster.h"
#include "plan/plan.h"
#include "util/strbuf.h"

/* cluster: NULL, or the cluster to price the plan on (memory headroom, step time, MFU). */
void check_print_text(const struct plan *p, const struct cluster *cluster, FILE *f);
void check_write_json(const struct plan *p, const struct cluster *cluster, struct strbuf *b);
/* mesh.cp > 1 with what the runtime does not run under context parallelism (plan_cp_refused: a
 * sparse model, bf16 compute, device = "cuda", zb-h1): check, tune and rehearse have no figures
 * of the runtime's for it: -1 with the runtime's plan error, prefixed by `command`; else 0. */
int check_cp_refused(const struct plan *p, const char *command, char *err, size_t n);

#endif
