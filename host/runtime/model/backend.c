/* runtime_use_backend (backend.h). */
#include "runtime/model/backend.h"

#include "runtime/model/alloc.h"

static struct {
  int id;
  const struct kernel_ops *ops;
  void *ctx;
} known[ALLOC_MAX_DEVICES];
static int n_known;

int runtime_use_backend(const struct kernel_ops *ops, void *ctx)
{
  if (!ops || ops->host_visible) {
    alloc_use_device(ALLOC_HOST);
    kernels_use(ops, ctx);
    return 0;
  }
  int id = -1;
  for (int i = 0; i < n_known && id < 0; i++)
    if (known[i].ops->mem_alloc == ops->mem_alloc && known[i].ops->mem_free == ops->mem_free &&
        known[i].ctx == ctx && alloc_device_name(known[i].id))
      id = known[i].id;
  if (id < 0) {
    /* cached (alloc.h): the step's blocks are reused, not allocated and freed on the device */
    const struct alloc_device dev = { ops->name, ops->mem_alloc, ops->mem_free, ctx, ops->zero };
    if ((id = alloc_device_add(&dev)) < 0)
      return -1;
    int slot = 0;
    while (slot < n_known && alloc_device_name(known[slot].id))
      slot++;
    known[slot].id = id;
    known[slot].ops = ops;
    known[slot].ctx = ctx;
    n_known += slot == n_known;
  }
  alloc_use_device(id);
  kernels_use(ops, ctx);
  return 0;
}

int runtime_drop_backend(const struct kernel_ops *ops, void *ctx)
{
  for (int i = 0; ops && i < n_known; i++)
    if (known[i].ops == ops && known[i].ctx == ctx && alloc_device_name(known[i].id)) {
      if (alloc_device_remove(known[i].id))
        return -1;
      known[i].id = -1; /* a free slot: no device has that id */
    }
  return 0;
}
