/* How many threads the kernels get, and the environment their libraries need to use them well.
 * Shared by the CLI and the benchmarks so both run the way `tycho run` does. */
#ifndef TYCHO_RUNTIME_THREADS_H
#define TYCHO_RUNTIME_THREADS_H

#include <stddef.h>

/* What the process was given, each read by threads_per_rank from the system; 0 where a source
 * says nothing. */
struct threads_given {
  int omp_env;        /* OMP_NUM_THREADS as a positive number: the user's explicit count */
  int mask_cpus;      /* CPUs in the process's affinity mask (taskset, cpuset, a launcher's binding) */
  int mask_shared;    /* the mask is the launcher's own, so the node's ranks share it; 0 when it
                       * was narrowed for this rank (Open MPI's or Slurm's binding) */
  double quota_cpus;  /* the cgroup's CPU quota in CPUs (quota / period), shared by the node's ranks */
  int slurm_cpus;     /* SLURM_CPUS_PER_TASK: this rank's CPUs */
  int online_cpus;    /* the online CPUs, where no mask is known */
  int ranks_on_node;  /* ranks of this job on the node (at least 1) */
};

/* The thread count per rank from what was given (pure): OMP_NUM_THREADS when set; else the
 * fewest of the mask's CPUs (divided among the ranks only where they share it), the quota's
 * share of each rank and Slurm's CPUs per task; at least 1. Writes where the count came from
 * into why (e.g. "affinity mask: 1 CPU"). */
int threads_decide(const struct threads_given *g, char *why, size_t why_size);

/* The CPU quota of the cgroups /proc/self/cgroup's text names, in CPUs: the smallest of cgroup
 * v2's cpu.max and v1's cpu.cfs_quota_us / cpu.cfs_period_us over each named group and its
 * ancestors, the files read under root (/sys/fs/cgroup; a folder of the test's own in tests).
 * 0 when no quota is set or none can be read. */
double threads_cgroup_quota(const char *root, const char *proc_cgroup_text);

/* threads_per_rank(1). */
int threads_count(void);
/* The count for one of `ranks_on_node` ranks on the node, from this process's affinity mask,
 * cgroup quota, Slurm's environment and OMP_NUM_THREADS (threads_decide); remembered with its
 * reason for threads_reason. */
int threads_per_rank(int ranks_on_node);
/* Where the last threads_per_rank's count came from, e.g. "affinity mask: 2 CPUs"; "" before. */
const char *threads_reason(void);
/* Whether the last threads_per_rank's count may follow the CPUs' load (threads_adapt.h): not when
 * OMP_NUM_THREADS set it, nor when the node's ranks share one affinity mask. */
int threads_adaptable(void);

/* libgomp and OpenBLAS read their settings from the environment when they load, before main
 * runs. OpenBLAS starts its pool before kernels_init_cpu can give it flush-to-zero, so where
 * OPENBLAS_NUM_THREADS is unset this sets 1 (OpenBLAS stays on one thread: the kernels share the
 * products' tiles among OpenMP's threads). Where OMP_WAIT_POLICY and GOMP_SPINCOUNT are both
 * unset it sets how long an idle OpenMP thread spins before it sleeps: long enough to span the
 * gaps between a step's parallel regions (threads_adapt.h takes threads away when other work
 * wants the cores). Then it re-executes the program once with the same arguments. Call first
 * thing in main, before any thread exists. Returns only when nothing needed doing or exec failed
 * (then the program goes on as it is). */
void threads_exec_with_settings(char **argv);

#endif
