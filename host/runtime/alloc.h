/* The one allocator of the runtime, and the memory bill it keeps (DESIGN 3.6). Every buffer the
 * trainer owns — parameters, gradients, optimizer state, activations, comm buffers, workspace —
 * comes from alloc_bytes with its category, so the bytes in use and the high-water mark of each
 * category are known exactly and can be held against the cost model's prediction.
 *
 * One bill per process (one device per process). Not thread-safe: allocate from the thread that
 * drives the run, never from inside a parallel region. */
#ifndef TYCHO_RUNTIME_ALLOC_H
#define TYCHO_RUNTIME_ALLOC_H
#include <stddef.h>
#include <stdio.h>

#include "real.h"

enum alloc_category {
  ALLOC_PARAMS, ALLOC_GRADS, ALLOC_OPTIMIZER, ALLOC_ACTIVATIONS, ALLOC_COMM, ALLOC_WORKSPACE,
  ALLOC_N_CATEGORIES
};

struct alloc_bill {
  size_t n_bytes[ALLOC_N_CATEGORIES];    /* in use now */
  size_t peak_bytes[ALLOC_N_CATEGORIES]; /* high-water mark of each category */
  size_t total_bytes, total_peak_bytes;  /* all categories together (the total's own peak) */
  size_t n_live;                         /* blocks not yet freed */
};

/* n_bytes of zeroed memory, 64-byte aligned, billed to `category`; NULL when out of memory or
 * over the cap of alloc_set_limit (n_bytes 0 gives a valid, unique block). */
void *alloc_bytes(enum alloc_category category, size_t n_bytes);
/* n_elems reals: alloc_bytes(category, n_elems · sizeof(real)), with the product checked. */
real *alloc_reals(enum alloc_category category, size_t n_elems);
/* Caps the bytes in use over every category (0: no cap): a block that would go over it is
 * refused as if memory had run out. For the tests of what runs out of memory, and for callers
 * that want a budget. */
void alloc_set_limit(size_t n_bytes);
/* Reserves bytes[c] more in each category c for blocks to come (a trainer reserves its memory
 * bill at open, so a step's buffers cannot run into the cap half-way through): from then on the
 * cap counts, per category, the bytes in use or the bytes reserved, whichever is more. -1 when
 * that would exceed the cap now (*over, when given: the category reserved furthest past what it
 * holds); nothing is reserved then. Allocation itself never draws on a reservation: the bill's
 * peaks stay the blocks' own. */
int alloc_reserve(const size_t bytes[ALLOC_N_CATEGORIES], int *over);
/* Gives back what alloc_reserve(bytes) reserved. */
void alloc_unreserve(const size_t bytes[ALLOC_N_CATEGORIES]);
/* Frees a block from alloc_bytes and takes it off the bill; NULL is ignored. */
void alloc_free(void *block);

const struct alloc_bill *alloc_bill(void);
/* Sets every peak to the bytes in use now (to measure one phase). */
void alloc_reset_peaks(void);
const char *alloc_category_name(enum alloc_category category);
/* One line: "memory peak: params 3.1 MiB, grads ..., total ... MiB". */
void alloc_print_peaks(FILE *out);
/* The same line for any bill (another rank's), after `label` instead of "memory peak". */
void alloc_print_bill_peaks(FILE *out, const char *label, const struct alloc_bill *b);

#endif
