/* The host's access to tensor memory. Every tensor the runtime computes on lives in the memory
 * of its model's backend (kernels/ops.h: m->k, m->kctx); the runtime never dereferences it. What
 * the host must read or write — initialization, weights and checkpoints in and out, the loss
 * sum, the greedy argmax, ids handed to kernels — goes through a view: on a host-visible backend
 * (the CPU) the memory itself, so nothing is copied; on another backend a host block
 * (alloc_host_bytes, billed as workspace on the host) that open fills from the backend when asked
 * and close writes back when asked. Copies between tensors go through the backend's copy entries
 * directly (k->copy, k->copy_rows, k->zero). */
#ifndef TYCHO_RUNTIME_HOSTVIEW_H
#define TYCHO_RUNTIME_HOSTVIEW_H
#include <stddef.h>

#include "ops.h"

/* A host view of n_bytes at p (backend memory of k, ctx): filled from p when `read`, else
 * undefined (zero on a fresh staging block). NULL when out of host memory (never on a
 * host-visible backend); n_bytes 0 gives a valid view. */
void *hostview_open(const struct kernel_ops *k, void *ctx, const void *p, size_t n_bytes, int read);
/* A read-only view (hostview_open with read) of what leaves the device — checkpoint pieces,
 * exports, a tensor read from Lua — handed out only when the backend reports no pending failure
 * (its status entry, asked once the bytes are read): else NULL with the backend's message in err,
 * so nothing a failed call left stale is written or shown. NULL too when out of host memory
 * ("out of host memory for N bytes"). End it with hostview_close(k, ctx, p, view, n_bytes, 0). */
const void *hostview_read(const struct kernel_ops *k, void *ctx, const void *p, size_t n_bytes, char *err,
                          size_t err_size);
/* Ends a view from hostview_open(k, ctx, p, n_bytes, ...): its bytes written to p when `write`,
 * the staging block freed. view NULL is ignored. */
void hostview_close(const struct kernel_ops *k, void *ctx, void *p, void *view, size_t n_bytes,
                    int write);

/* Small reads that cannot fail: Σ x[i] over n_elems reals, in index order in double (the loss
 * sum), read through a stack buffer in chunks. */
double hostview_sum(const struct kernel_ops *k, void *ctx, const real *x, size_t n_elems);
/* The index of the largest of the first n of row (a row of logits), the first on ties. */
int hostview_argmax(const struct kernel_ops *k, void *ctx, const real *row, int n);

#endif
