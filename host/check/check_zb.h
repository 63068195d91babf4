/* What a zero-bubble schedule's W's hold (check_zb.c): after a split B a micro-batch still waits
 * for its W, which needs the linears' inputs (saved activations, its slot) and their output
 * gradients (a held area). Where the runtime runs the split backward (bill_split_runs: ZeRO 0
 * and 1, ZeRO 2 and 3 with zero_every "step") the bill (layout/bill.h) walks the split list,
 * counting both (in_bill: bytes 0, nothing beyond it); under ZeRO 2 and 3 with "micro_batch",
 * which the runtime refuses to split, the bill walks the schedule as whole backwards
 * (sched_merge_split: ZB-H1 read as 1F1B) and this counts the W's part, per pipeline rank, as a
 * line apart from the bill's categories. */
#ifndef TYCHO_CHECK_ZB_H
#define TYCHO_CHECK_ZB_H
#include <stdio.h>

#include "layout/bill.h"
#include "plan/plan.h"

struct check_zb_held {
  int extra;         /* peak in flight until W, less the bill's (whole-backward) peak */
  int pending;       /* most micro-batches past B whose W has not run */
  double slot_bytes; /* the bill's activations per slot (bytes[activations] / n_slots) */
  double dout_bytes; /* one micro-batch's linears' output gradients on this rank, at tp > 1 with
                      * their inputs (a held area: bill_split_held_bytes) */
  int in_bill;       /* 1: the bill counts all of it (bill_split_runs) */
  double bytes;      /* beyond the bill: extra · slot_bytes + pending · dout_bytes, or 0 in_bill */
};

/* For every pipeline rank (out: mesh.pp entries) from the plan's schedule; bills: each rank's
 * bill or NULL (then slot_bytes and bytes are 0). 0, or −1 with the schedule's message; a plan
 * whose schedule does not split its backwards gets zeros. */
int check_zb_held(const struct plan *p, const struct bill *bills, struct check_zb_held *out, char *err, size_t n);

/* Rank r's W-held bytes with its bill b: fills h->slot_bytes and h->bytes, returns h->bytes. */
double check_zb_rank_bytes(struct check_zb_held *h, const struct bill *b);

/* The lines `tycho check` prints under the memory table for a zero-bubble plan (shown ranks as
 * row_shown picks them: shown(rank) != 0); nothing for other plans. */
void check_zb_print(FILE *f, const struct plan *p, const struct bill *bills, int (*shown)(int rank, int pp));

#endif
