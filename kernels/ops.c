/* Which kernel table new models capture (ops.h). The one piece of state in kernels/: set
 * before any model exists and read when one is created, so it needs no lock. */
#include "ops.h"

static const struct kernel_ops *active = &kernel_ops_cpu;
static void *active_ctx;

void kernels_use(const struct kernel_ops *ops, void *ctx)
{
  active = ops ? ops : &kernel_ops_cpu;
  active_ctx = ops ? ctx : NULL;
}

const struct kernel_ops *kernels_active(void)
{
  return active;
}

void *kernels_active_context(void)
{
  return active_ctx;
}
