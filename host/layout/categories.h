/* The categories of memory the runtime allocates (runtime/model/alloc.h bills every block to one)
 * and the memory bill predicts (layout/bill.h): one list, so the allocator's measured
 * peaks and the predicted bill name the same things. */
#ifndef TYCHO_LAYOUT_CATEGORIES_H
#define TYCHO_LAYOUT_CATEGORIES_H

enum alloc_category {
  ALLOC_PARAMS, ALLOC_GRADS, ALLOC_OPTIMIZER, ALLOC_ACTIVATIONS, ALLOC_COMM, ALLOC_WORKSPACE,
  ALLOC_CHECKPOINT, /* checkpoint.async's snapshot (host memory), from a save until its commit */
  ALLOC_N_CATEGORIES
};

/* "params", "grads", ...; "?" for a value outside the list. */
const char *alloc_category_name(enum alloc_category category);

#endif
