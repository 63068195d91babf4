/* launch.h: this executable on N ranks through a launcher. */
#define _POSIX_C_SOURCE 200809L
#include "util/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
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

/* The launcher's argv: the template's words ("{n}" → count) then self and args; words points
 * into *words (a copy of the template). NULL with err (2 in *code for a template without {n}). */
static const char **launch_argv(const char *tmpl, char *words, size_t words_size, char *count, size_t count_size,
                                int n_ranks, const char *self, const char *const *args, int n_args, int *code,
                                char *err, size_t err_size)
{
  if (!strstr(tmpl, "{n}")) {
    snprintf(err, err_size, "--launcher '%s': write {n} where the rank count goes, e.g. --launcher 'srun -n {n}'", tmpl);
    *code = 2;
    return NULL;
  }
  snprintf(words, words_size, "%s", tmpl);
  snprintf(count, count_size, "%d", n_ranks);
  const int max = 64 + n_args + 2;
  const char **argv = calloc((size_t)max, sizeof *argv);
  if (!argv) {
    snprintf(err, err_size, "out of memory");
    *code = -1;
    return NULL;
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
  return argv;
}

static void exec_launcher(const char **argv)
{
  execvp(argv[0], (char *const *)argv);
  fprintf(stderr, "tycho: cannot run %s: %s (name another with --launcher)\n", argv[0], strerror(errno));
  _exit(127);
}

int launch_self(const char *tmpl, int n_ranks, const char *self, const char *const *args, int n_args,
                double *seconds, char *err, size_t err_size)
{
  *seconds = 0;
  char words[4096], count[16];
  int code = 0;
  const char **argv = launch_argv(tmpl, words, sizeof words, count, sizeof count, n_ranks, self, args, n_args, &code,
                                  err, err_size);
  if (!argv)
    return code;
  printf("launch     %s", argv[0]);
  for (int i = 1; argv[i]; i++) printf(" %s", argv[i]);
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
  if (pid == 0)
    exec_launcher(argv);
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) {
      snprintf(err, err_size, "waiting for %s: %s", argv[0], strerror(errno));
      free(argv);
      return -1;
    }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  *seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (WIFSIGNALED(status))
    snprintf(err, err_size, "the launcher %s ended by signal %d after %.1f s", argv[0], WTERMSIG(status), *seconds);
  else if (code == 127) {
    snprintf(err, err_size, "%s could not start the ranks", argv[0]);
    code = -1;
  }
  free(argv);
  return code;
}

int launch_self_start(const char *tmpl, int n_ranks, const char *self, const char *const *args, int n_args,
                      pid_t *pid, int *out_fd, char *err, size_t err_size)
{
  *pid = -1;
  *out_fd = -1;
  char words[4096], count[16];
  int code = 0;
  const char **argv = launch_argv(tmpl, words, sizeof words, count, sizeof count, n_ranks, self, args, n_args, &code,
                                  err, err_size);
  if (!argv)
    return code;
  int p[2];
  if (pipe(p)) {
    snprintf(err, err_size, "cannot start %s: a pipe: %s", argv[0], strerror(errno));
    free(argv);
    return -1;
  }
  fcntl(p[0], F_SETFD, FD_CLOEXEC);
  pid_t child = fork();
  if (child < 0) {
    snprintf(err, err_size, "cannot start %s: %s", argv[0], strerror(errno));
    close(p[0]);
    close(p[1]);
    free(argv);
    return -1;
  }
  if (child == 0) {
    setpgid(0, 0);
    int in = open("/dev/null", O_RDONLY);
    if (in >= 0 && in != STDIN_FILENO) {
      dup2(in, STDIN_FILENO);
      close(in);
    }
    dup2(p[1], STDOUT_FILENO);
    dup2(p[1], STDERR_FILENO);
    if (p[1] != STDOUT_FILENO && p[1] != STDERR_FILENO)
      close(p[1]);
    /* the caller's handlers are not the launcher's: back to the defaults, nothing blocked */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    exec_launcher(argv);
  }
  setpgid(child, child); /* both sides: whichever runs first, the group exists before a signal to it */
  close(p[1]);
  free(argv);
  *pid = child;
  *out_fd = p[0];
  return 0;
}
