/* The trainer's device (device.h). */
#include "runtime/model/device.h"

#include <stdio.h>
#include <string.h>

#include "comm/comm.h"
#include "layout/supported.h"
#include "runtime/model/backend.h"
#include "util/devices.h"
#include "util/err.h"

#ifdef TYCHO_HAVE_CUDA_BACKEND
#include "cuda/cuda_backend.h"
#endif

int runtime_local_rank(void)
{
  if (comm_world())
    return comm_local_rank();
  const int r = devices_local_rank_env();
  return r < 0 ? 0 : r;
}

int runtime_device_open(struct runtime_device *d, enum plan_device device, int local_rank, char *err,
                        size_t err_size)
{
  memset(d, 0, sizeof *d);
  char why[96];
  if (device == PLAN_DEVICE_CPU) {
    snprintf(d->text, sizeof d->text, "cpu");
    return 0;
  }
  if (device == PLAN_DEVICE_AUTO && !trainer_auto_device(why, sizeof why)) {
    snprintf(d->text, sizeof d->text, "cpu (auto: %s)", why);
    return 0;
  }
  d->count = devices_cuda_count();
  d->index = devices_pick(local_rank < 0 ? 0 : local_rank, d->count);
  if (d->index < 0) /* trainer_plan_supported refused it before: this is its backstop */
    return errf(err, err_size, "device = \"cuda\": no CUDA device visible");
#ifdef TYCHO_HAVE_CUDA_BACKEND
  char why_ctx[512];
  if (!(d->ctx = cuda_ctx_create(d->index, why_ctx, sizeof why_ctx)))
    return errf(err, err_size, "CUDA device %d of %d (local rank %d): %s", d->index, d->count, local_rank,
                why_ctx);
  if (runtime_use_backend(&kernel_ops_cuda, d->ctx)) {
    cuda_ctx_destroy(d->ctx);
    d->ctx = NULL;
    return errf(err, err_size, "CUDA device %d: the allocator has no room for another device", d->index);
  }
  d->cuda = 1;
  snprintf(d->text, sizeof d->text, "cuda %d of %d%s", d->index, d->count,
           device == PLAN_DEVICE_AUTO ? " (auto)" : "");
  return 0;
#else
  return errf(err, err_size, "device = \"cuda\": this build of tycho has no CUDA backend");
#endif
}

void *runtime_device_stream(const struct runtime_device *d)
{
#ifdef TYCHO_HAVE_CUDA_BACKEND
  return d->cuda ? cuda_ctx_stream(d->ctx) : NULL;
#else
  (void)d;
  return NULL;
#endif
}

void runtime_device_close(struct runtime_device *d)
{
#ifdef TYCHO_HAVE_CUDA_BACKEND
  if (d->cuda) {
    if (kernels_active_context() == d->ctx)
      runtime_use_backend(NULL, NULL); /* the device may not be current when it goes */
    runtime_drop_backend(&kernel_ops_cuda, d->ctx);
    cuda_ctx_destroy(d->ctx);
  }
#endif
  memset(d, 0, sizeof *d);
}
