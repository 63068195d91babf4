/* Fewer threads while other work uses the CPUs a rank was given, the full count again when they
 * are free. A thread that waits at the end of a parallel region for a partner the system has
 * descheduled in favour of another program wastes its core: on 2 cores beside one busy process,
 * two threads ran the tiny plan at 17-51% of their speed alone, where one thread keeps a core to
 * itself. The kernels' results do not depend on the thread count (kernels/cpu/blas.h), so the
 * count can change between steps. */
#ifndef TYCHO_RUNTIME_THREADS_ADAPT_H
#define TYCHO_RUNTIME_THREADS_ADAPT_H

#include <stddef.h>

/* The thread count for the next steps (pure): `cpus` CPUs in the mask, at most `max` threads, `n`
 * now, `others` CPUs' worth of time that other processes used on the mask's CPUs over the last
 * window. The target is the free CPUs rounded to the nearest (at least 1, at most max). Fewer is
 * taken at once; more only when two windows in a row ask for it (*up_votes counts them). */
int threads_adapt_decide(int max, int cpus, int n, double others, int *up_votes);

/* The busy time, in clock ticks, of the CPUs listed in cpus[0..n_cpus) from /proc/stat's text
 * (user, nice, system, irq, softirq and steal of each "cpuN" line). Returns 0, or -1 when a
 * listed CPU has no line. */
int threads_adapt_busy_ticks(const char *proc_stat, const int *cpus, int n_cpus, unsigned long long *ticks);

/* Turns adaptation on for this process with `max` threads (OpenMP's count now), where max > 1,
 * `enabled` and /proc/stat can be read; `enabled` is 0 where the count was set by hand
 * (OMP_NUM_THREADS) or the node's ranks share one mask (their threads would count as other
 * work). Returns whether it is on. */
int threads_adapt_start(int max, int enabled);
int threads_adapt_on(void);
/* The CPUs in the mask adaptation watches (0 when it is off). */
int threads_adapt_cpus(void);

/* Between steps: at most every quarter second, measures what other processes used of the mask's
 * CPUs since the last call and sets OpenMP's thread count for the steps that follow. Returns the
 * count the next steps run with; *others gets the CPUs' worth the others used (negative when
 * nothing was measured). */
int threads_adapt_tick(double *others);

#endif
