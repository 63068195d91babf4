/* Thread count and thread-library environment (threads.h). */
#define _POSIX_C_SOURCE 200809L
#include "runtime/train/threads.h"

#include "kernels.h"

#include <stdlib.h>
#include <unistd.h>

static int threads_from_env(void)
{
  const char *env = getenv("OMP_NUM_THREADS");
  if (env && *env) {
    char *end;
    long n = strtol(env, &end, 10);
    if (n > 0 && n <= 4096)
      return (int)n;
  }
  return 0;
}

int threads_count(void)
{
  return threads_per_rank(1);
}

int threads_per_rank(int ranks_on_node)
{
  int n = threads_from_env();
  if (n > 0)
    return n;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  n = (int)(cpus > 0 ? cpus : 1) / (ranks_on_node > 1 ? ranks_on_node : 1);
  return n > 0 ? n : 1;
}

void threads_exec_with_settings(char **argv)
{
  if (getenv("TYCHO_THREAD_SETTINGS"))
    return; /* already re-executed, or the user opted out */
  int changed = 0;
  /* one pool (OpenBLAS's OpenMP build): its threads wait actively between regions, as nothing
   * else spins beside them; two pools: passive, or each pool's spinning starves the other's */
  if (!getenv("OMP_WAIT_POLICY"))
    changed |= setenv("OMP_WAIT_POLICY", kernels_blas_shares_openmp_pool() ? "active" : "passive", 1) == 0;
  if (!getenv("OPENBLAS_NUM_THREADS"))
    changed |= setenv("OPENBLAS_NUM_THREADS", "1", 1) == 0;
  if (changed && setenv("TYCHO_THREAD_SETTINGS", "1", 1) == 0)
    execv("/proc/self/exe", argv);
}
