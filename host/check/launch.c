/* launch.h: this executable on N ranks through a launcher. */
#define _POSIX_C_SOURCE 200809L
#include "check/launch.h"

#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *launch_default(void)
{
#ifdef OMPI_MAJOR_VERSION
  return geteuid() == 0 ? "mpirun --allow-run-as-root --oversubscribe -np {n}" : "mpirun --oversubscribe -np {n}";
#else
  return "mpiexec -n {n}";
#endif
}

const char *launch_self_path(char *buf, size_t n, const char *argv0)
{
  ssize_t got = readlink("/proc/self/exe", buf, n - 1);
  if (got <= 0)
    snprintf(buf, n, "%s", argv0);
  else
    buf[got] = 0;
  return buf;
}

int launch_under_launcher(void)
{
  return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") ||
         (getenv("SLURM_STEP_ID") && getenv("SLURM_PROCID"));
}

static void default_env(const char *name)
{
  if (!getenv(name))
    setenv(name, "1", 1);
}

int launch_self(const char *tmpl, int n_ranks, const char *self, const char *const *args, int n_args,
                double *seconds, char *err, size_t err_size)
{
  *seconds = 0;
  if (!strstr(tmpl, "{n}")) {
    snprintf(err, err_size, "--launcher '%s': write {n} where the rank count goes, e.g. --launcher 'srun -n {n}'", tmpl);
    return 2;
  }
  char words[4096], count[16];
  snprintf(words, sizeof words, "%s", tmpl);
  snprintf(count, sizeof count, "%d", n_ranks);
  const int max = 64 + n_args + 2;
  const char **argv = calloc((size_t)max, sizeof *argv);
  if (!argv) {
    snprintf(err, err_size, "out of memory");
    return -1;
  }
  int n = 0;
  char *save = NULL;
  for (char *w = strtok_r(words, " \t", &save); w && n < 64; w = strtok_r(NULL, " \t", &save))
    argv[n++] = strcmp(w, "{n}") == 0 ? count : w;
  argv[n++] = self;
  for (int i = 0; i < n_args; i++) argv[n++] = args[i];
  argv[n] = NULL;
  /* many ranks on few cores: one BLAS thread each, and idle ranks give their core away */
  default_env("OPENBLAS_NUM_THREADS");
  default_env("OMPI_MCA_mpi_yield_when_idle");
  printf("launch     %s", argv[0]);
  for (int i = 1; i < n; i++) printf(" %s", argv[i]);
  printf("\n");
  fflush(stdout);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(err, err_size, "cannot start %s: %s", argv[0], strerror(errno));
    free(argv);
    return -1;
  }
  if (pid == 0) {
    execvp(argv[0], (char *const *)argv);
    fprintf(stderr, "tycho: cannot run %s: %s (name another with --launcher)\n", argv[0], strerror(errno));
    _exit(127);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      snprintf(err, err_size, "waiting for %s: %s", argv[0], strerror(errno));
      free(argv);
      return -1;
    }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  *seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (WIFSIGNALED(status))
    snprintf(err, err_size, "the launcher %s ended by signal %d after %.1f s", argv[0], WTERMSIG(status), *seconds);
  else if (code == 127) {
    snprintf(err, err_size, "%s could not start the ranks", argv[0]);
    code = -1;
  }
  free(argv);
  return code;
}
