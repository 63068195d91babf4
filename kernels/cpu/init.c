/* Process-wide CPU setup for the kernels: thread counts of OpenBLAS and OpenMP, and
 * flush-to-zero. Denormal floats (which appear late in training, in tiny gradients and Adam
 * moments) make sgemm up to ~100x slower on some x86 CPUs; FTZ/DAZ turns them into zeros, as
 * GPUs do anyway. MXCSR is per thread and copied only into threads created afterwards, hence
 * the order: one BLAS thread, set the mode, then grow OpenMP's pool. OpenBLAS stays on one
 * thread: the kernels share a product's row tiles among the OpenMP threads themselves (blas.h). */
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>

#include "blas.h"
#include "kernels.h"
#include "real.h"
#include "vec.h"

#include <stdio.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

static volatile int pool_started;

int kernels_init_cpu(int n_threads)
{
  if (n_threads < 1) n_threads = 1;
  int pool_predates_mode = openblas_get_num_threads() > 1;
  openblas_set_num_threads(1);
#if defined(__x86_64__)
  _mm_setcsr(_mm_getcsr() | 0x8040); /* bit 15 flush-to-zero, bit 6 denormals-are-zero */
#endif
  omp_set_num_threads(n_threads);
  /* the pool, started now, inherits the mode and a mask without the asynchronous signals */
  kernels_compute_begin();
#pragma omp parallel num_threads(n_threads)
  pool_started = omp_get_thread_num(); /* a body the compiler keeps: an empty region is elided */
  kernels_compute_end();
  return pool_predates_mode;
}

static _Thread_local int compute_depth;
static _Thread_local sigset_t compute_saved;

void kernels_compute_begin(void)
{
  if (compute_depth++ > 0)
    return;
  sigset_t async;
  sigfillset(&async);
  static const int synchronous[] = { SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS };
  for (size_t i = 0; i < sizeof synchronous / sizeof synchronous[0]; i++)
    sigdelset(&async, synchronous[i]);
  pthread_sigmask(SIG_BLOCK, &async, &compute_saved);
}

void kernels_compute_end(void)
{
  if (compute_depth > 0 && --compute_depth == 0)
    pthread_sigmask(SIG_SETMASK, &compute_saved, NULL);
}

int kernels_blas_shares_openmp_pool(void)
{
  return openblas_get_parallel() == 2; /* 0 sequential, 1 its own pthreads, 2 OpenMP */
}

const char *kernels_cpu_description(char *buf, size_t n)
{
  const char *isa = REAL_IS_DOUBLE ? "scalar (float64)" : vec_isa_name(vec_current());
  snprintf(buf, n, "%s element-wise kernels, products on %s in row tiles, OpenBLAS %s (%s)", isa,
           gemm_engine(), openblas_get_corename(),
           kernels_blas_shares_openmp_pool() ? "OpenMP build" : "pthread build");
  return buf;
}
