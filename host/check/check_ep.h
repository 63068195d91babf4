/* `tycho check`'s expert-parallel parts (docs/moe.md, "Expert parallelism"; docs/check-json.md):
 * the ep groups of the mesh, the all-to-all of every sparse layer per micro-batch, and the ep
 * group's traffic of a step. Separate from check.c so that each file reads in one sitting. */
#ifndef TYCHO_CHECK_EP_H
#define TYCHO_CHECK_EP_H
#include <stdio.h>

#include "plan/plan.h"
#include "util/strbuf.h"

/* Bytes for people ("80.0 KiB"), as the rest of check.c writes them (defined there). */
const char *check_format_bytes(double v, char *buf, size_t n);

/* The ep group of `rank`: ep consecutive dp ranks of its data-parallel group, dp coordinates
 * q·ep .. q·ep + ep − 1 with q = dp / ep, in ep-rank order. Returns ep, members into `members`
 * (room for ep entries). */
int check_ep_members(const struct plan_mesh *m, int rank, int *members);

/* The edp group of `rank`: the dp ranks holding the same experts, dp coordinates r mod ep, r mod
 * ep + ep, ... (dp / ep of them, in edp-rank order). Returns dp / ep, members into `members`. */
int check_edp_members(const struct plan_mesh *m, int rank, int *members);

/* The mesh block's lines for the ep and edp groups (nothing at ep 1). */
void check_ep_print_groups(FILE *f, const struct plan *p);
/* The "all-to-all" block: per sparse layer and micro-batch, each exchange and its bytes from a
 * rank (nothing at ep 1). */
void check_ep_print_exchange(FILE *f, const struct plan *p);
/* The JSON of the same block ("ep_all_to_all"; null at ep 1). */
void check_ep_write_exchange_json(struct json *j, const struct plan *p);
/* The JSON "groups" entry "ep": every ep group once, numbered by its lowest rank in increasing
 * order (as mesh_group_index numbers the others). 0, or -1 out of memory. */
int check_ep_write_groups_json(struct json *j, const struct plan *p);
/* The same for "edp": every edp group once, in order of its lowest rank. 0, or -1 out of memory. */
int check_edp_write_groups_json(struct json *j, const struct plan *p);
/* Each rank's ep group number, into index (world entries). */
void check_ep_group_indices(const struct plan_mesh *m, int ep, int *index);

#endif
