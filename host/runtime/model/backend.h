/* Choosing the backend a trainer runs on, at run time: the kernel table (kernels/ops.h) and,
 * when the table's memory is not the host's, its device in the allocator (alloc.h). Models and
 * trainers opened from then on capture both (m->k, m->kctx, m->device) and keep them for their
 * life. The default is the CPU: kernel_ops_cpu, context NULL, host memory. */
#ifndef TYCHO_RUNTIME_BACKEND_H
#define TYCHO_RUNTIME_BACKEND_H

#include "ops.h"

/* Makes (ops, ctx) the backend from now on; ops NULL goes back to the CPU. A table that is not
 * host_visible gets a device built from its mem_alloc/mem_free and ctx, cached through its zero
 * (alloc.h; the same device again when those are the same as an earlier call's), made the
 * allocator's current device. 0, or −1
 * when no device can be added (nothing changed then). */
int runtime_use_backend(const struct kernel_ops *ops, void *ctx);
/* Forgets the device runtime_use_backend made for (ops, ctx), before ctx goes: it is taken off
 * the allocator, so a later context at the same address gets a device of its own. It must hold
 * no block and not be current. 0 (also when there was none), or −1 when it cannot be removed. */
int runtime_drop_backend(const struct kernel_ops *ops, void *ctx);

#endif
