/* Starting this executable on N ranks through a launcher command: `tycho rehearse` and
 * `tycho calibrate`, run by hand, start their own ranks and wait; `tycho repl -n N` starts them
 * and goes on (the REPL's front-end). */
#ifndef TYCHO_UTIL_LAUNCH_H
#define TYCHO_UTIL_LAUNCH_H
#include <stddef.h>
#include <sys/types.h>

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

/* Starts the same command as launch_self without waiting and without printing it: the launcher
 * runs in a process group of its own (its pid is the group's id; a Ctrl-C at the terminal reaches
 * only the caller), with stdin from /dev/null and stdout and stderr into a pipe whose read end
 * (close-on-exec) goes to *out_fd. 0 with *pid; −1 with err when it could not be started (an
 * unknown program shows later as the launcher's exit code 127, its reason in the pipe); 2 with
 * err for a template without {n}. */
int launch_self_start(const char *tmpl, int n_ranks, const char *self, const char *const *args, int n_args,
                      pid_t *pid, int *out_fd, char *err, size_t err_size);

#endif
