/* Signals during the steps: a process whose handler runs thousands of times while it trains (a
 * child sends SIGUSR1 every ~20-50 µs) trains the same weights as one left alone, and does not
 * crash. oneDNN's jitted sgemm (the fp32 products where the build has it) does not survive a
 * handler running on its thread; the kernels' threads hold the asynchronous signals while they
 * compute (kernels_compute_begin), so a handler runs on a thread that does not, or after. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L
#include <omp.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>

#include "check.h"
#include "kernels.h"
#include "plan/compile.h"
#include "runtime/train/train.h"
#include "plan_fixture.h"
#include "runtime_fixture.h"

static char err[2048];
static volatile sig_atomic_t caught;
static volatile long *sent; /* shared with the child: the signals it sent */

static void on_usr1(int sig)
{
  (void)sig;
  caught++;
}

enum { STEPS = 25 };

/* kernels_init_cpu starts the OpenMP threads with the asynchronous signals blocked, and leaves
 * the caller's mask as it was (runs first: no parallel region has started a thread before). */
static void the_pool_starts_with_signals_held(void)
{
  sigset_t before, after;
  pthread_sigmask(SIG_BLOCK, NULL, &before);
  kernels_init_cpu(3);
  pthread_sigmask(SIG_BLOCK, NULL, &after);
  CHECK(sigismember(&before, SIGUSR1) == sigismember(&after, SIGUSR1));
  CHECK(!sigismember(&after, SIGINT));
  int held[3] = { -1, -1, -1 };
#pragma omp parallel num_threads(3)
  {
    sigset_t m;
    pthread_sigmask(SIG_BLOCK, NULL, &m);
    held[omp_get_thread_num()] = sigismember(&m, SIGINT) && sigismember(&m, SIGTERM) &&
                                 sigismember(&m, SIGUSR1) && !sigismember(&m, SIGSEGV);
  }
  CHECK(held[0] == 0); /* the caller, outside kernels_compute_begin */
  CHECK_MSG(held[1] == 1 && held[2] == 1, "the pool's threads hold the signals: %d %d", held[1], held[2]);
  kernels_compute_begin();
  kernels_compute_begin(); /* nests */
  kernels_compute_end();
  sigset_t m;
  pthread_sigmask(SIG_BLOCK, NULL, &m);
  CHECK(sigismember(&m, SIGINT));
  kernels_compute_end();
  pthread_sigmask(SIG_BLOCK, NULL, &m);
  CHECK(!sigismember(&m, SIGINT));
  omp_set_num_threads(1);
}

/* Trains STEPS steps and an evaluation from the plan's seeds; with `storm`, a child process
 * sends SIGUSR1 to this one all the while. */
static int train(const struct plan *p, int storm, struct trainer *t, double *val_loss)
{
  if (trainer_open(t, p, NULL, err, sizeof err) != TRAIN_OK) {
    CHECK_MSG(0, "%s", err);
    return 1;
  }
  pid_t child = -1;
  if (storm) {
    const pid_t parent = getpid();
    child = fork();
    if (child == 0) {
      const struct timespec gap = { 0, 20000 };
      for (;;) {
        if (kill(parent, SIGUSR1) != 0)
          _exit(0);
        ++*sent;
        nanosleep(&gap, NULL);
      }
    }
  }
  int rc = 0;
  struct train_step_stats st;
  for (int s = 0; s < STEPS && !rc; s++)
    rc = trainer_step(t, &st, err, sizeof err);
  struct train_eval_stats ev;
  if (!rc)
    trainer_eval(t, &ev);
  if (child > 0) {
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
  }
  CHECK_MSG(rc == 0, "%s", err);
  *val_loss = ev.val_loss;
  return rc;
}

static void a_signal_storm_changes_nothing(void)
{
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sigemptyset(&sa.sa_mask);
  CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
  sent = mmap(NULL, sizeof *sent, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CHECK(sent != MAP_FAILED);
  if (sent == MAP_FAILED)
    return;
  struct plan p;
  if (fixture_compile("tests/plans/good/train_small.lua", 1, NULL, 0, &p))
    return;
  for (int threads = 1; threads <= 2; threads++) {
    omp_set_num_threads(threads);
    static struct trainer quiet, stormy;
    double vq = 0, vs = 0;
    caught = 0;
    *sent = 0;
    if (train(&p, 0, &quiet, &vq))
      return;
    if (train(&p, 1, &stormy, &vs)) {
      trainer_close(&quiet);
      return;
    }
    /* signals that come while every thread holds them merge into one pending: fewer handled */
    printf("%d thread%s: %ld signals sent, %d handled, during %d steps and an evaluation\n", threads,
           threads == 1 ? "" : "s", *sent, (int)caught, STEPS);
    CHECK(*sent > 100); /* ~1,500-4,700 on a quiet 2-core machine; fewer under load */
    CHECK(caught > 0);
    CHECK(fixture_params_equal(&quiet.model, &stormy.model));
    CHECK(vq == vs);
    trainer_close(&quiet);
    trainer_close(&stormy);
  }
  signal(SIGUSR1, SIG_DFL);
}

TEST_MAIN(TEST(the_pool_starts_with_signals_held), TEST(a_signal_storm_changes_nothing))
