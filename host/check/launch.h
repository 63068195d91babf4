/* Starting this executable on N ranks through a launcher command: `tycho rehearse` and
 * `tycho calibrate`, run by hand, start their own ranks. */
#ifndef TYCHO_CHECK_LAUNCH_H
#define TYCHO_CHECK_LAUNCH_H
#include <stddef.h>

/* The default launcher template, "{n}" the rank count: with Open MPI
 * "mpirun --oversubscribe -np {n}" (a rehearsal runs more ranks than the machine has cores),
 * run as root with --allow-run-as-root too (root asked for the run: Open MPI's guard against
 * running as root by accident is answered as its own option allows); else "mpiexec -n {n}". */
const char *launch_default(void);

/* This executable's own path, into buf (argv0 when /proc/self/exe cannot be read): a launcher
 * given /proc/self/exe would read it as its own. Returns buf. */
const char *launch_self_path(char *buf, size_t n, const char *argv0);

/* 1 when this process was started by a launcher (Open MPI, MPICH/Hydra or PMIx, srun). */
int launch_under_launcher(void);

/* Runs `TEMPLATE-words self args...` (the template split on blanks, a word "{n}" replaced by
 * n_ranks) and waits for it; OPENBLAS_NUM_THREADS and OMPI_MCA_mpi_yield_when_idle are set to 1
 * for the ranks when unset. Prints the command on stdout first ("launch     ..."). Returns the
 * launcher's exit status (1 when a signal ended it) with its wall time in *seconds; −1 with err
 * when it could not be started (127 from the child: no such program); 2 with err for a
 * template without {n}. */
int launch_self(const char *tmpl, int n_ranks, const char *self, const char *const *args, int n_args,
                double *seconds, char *err, size_t err_size);

#endif
