/* The CUDA device probe (devices.h). */
#include "util/devices.h"

#include <stdlib.h>

#ifdef TYCHO_HAVE_CUDA_BACKEND
#include "cuda/cuda_backend.h"
#endif

int devices_cuda_built(void)
{
#ifdef TYCHO_HAVE_CUDA_BACKEND
  return 1;
#else
  return 0;
#endif
}

int devices_cuda_count(void)
{
#ifdef TYCHO_HAVE_CUDA_BACKEND
  /* the driver's answer does not change within a process; the first call initialises CUDA */
  static int known = -1;
  if (known < 0)
    known = cuda_device_count();
  return known;
#else
  return 0;
#endif
}

int devices_pick(int local_rank, int count)
{
  return count < 1 || local_rank < 0 ? -1 : local_rank % count;
}

static int env_index(const char *name)
{
  const char *s = getenv(name);
  char *end;
  if (!s || !*s)
    return -1;
  long v = strtol(s, &end, 10);
  return *end || v < 0 || v > 1 << 30 ? -1 : (int)v;
}

int devices_local_rank_env(void)
{
  const int ompi = env_index("OMPI_COMM_WORLD_LOCAL_RANK");
  return ompi >= 0 ? ompi : env_index("SLURM_LOCALID");
}
