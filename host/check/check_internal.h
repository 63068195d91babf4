/* Inside `tycho check`: the figures its text (check.c) and its JSON document (check_json.c) both
 * show, computed once in check.c. Not for use outside host/check/. */
#ifndef TYCHO_CHECK_INTERNAL_H
#define TYCHO_CHECK_INTERNAL_H
#include <stddef.h>

#include "plan/plan.h"
#include "layout/tp_layout.h"
#include "layout/categories.h"
#include "layout/bill.h"

/* The tensor-parallel collectives of one micro-batch (malloc'd, *n of them) and their ops' names. */
extern const char *const check_comm_op_names[];
struct tp_comm *check_tp_comms(const struct plan *p, int *n);

/* The runtime the figures describe, in one line. */
const char *check_runtime_note(const struct plan *p, char *buf, size_t n);

/* The memory bill: the categories in the order shown, which a plan shows, every stage's (or every
 * rank's, all) bill, and the sums of the model states and of the transient part. */
extern const enum alloc_category check_bill_order[ALLOC_N_CATEGORIES];
int check_bill_shows(const struct plan *p, int k);
struct bill *check_bills_of(const struct plan *p, int all, char *err, size_t n);
extern const enum alloc_category check_state_order[3];
extern const enum alloc_category check_transient_order[3];
double check_model_states_total(const struct bill *b);
double check_transient_bytes(const struct bill *b, enum alloc_category c);
double check_transient_total(const struct bill *b);
/* What a rank's bill puts on its device (bill.host: a cuda plan's host memory apart): the total
 * held against a device's memory; the whole total on the CPU. */
double check_device_total(const struct bill *b);

/* The names of the traffic prediction's collectives (bill.h, TRAFFIC_N_OPS). */
extern const char *const check_comm_names[TRAFFIC_N_OPS];

#endif
