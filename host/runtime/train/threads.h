/* How many threads the kernels get, and the environment their libraries need to use them well.
 * Shared by the CLI and the benchmarks so both run the way `tycho run` does. */
#ifndef TYCHO_RUNTIME_THREADS_H
#define TYCHO_RUNTIME_THREADS_H

/* OMP_NUM_THREADS when set to a positive number, else the number of online CPUs. */
int threads_count(void);
/* The same for one of `ranks_on_node` ranks sharing the node: OMP_NUM_THREADS when set, else
 * the online CPUs divided among the ranks (at least 1). */
int threads_per_rank(int ranks_on_node);

/* libgomp and OpenBLAS read their settings from the environment when they load, before main
 * runs. OpenBLAS starts its pool before kernels_init_cpu can give it flush-to-zero, so where
 * OPENBLAS_NUM_THREADS is unset this sets 1 (kernels_init_cpu then grows OpenBLAS to the thread
 * count). Where OMP_WAIT_POLICY is unset it sets "active" when OpenBLAS is its OpenMP build (one
 * pool: nothing else spins beside its threads, and a region starts without waking them) and
 * "passive" when OpenBLAS has a pthread pool of its own (two pools: OpenMP threads spinning after
 * a region take the cores OpenBLAS's threads need next, 4x slower than one thread on 2 cores).
 * Then it re-executes the program once with the same arguments.
 * Call first thing in main, before any thread exists. Returns only when nothing needed doing or
 * exec failed (then the program goes on as it is). */
void threads_exec_with_settings(char **argv);

#endif
