/* What the CUDA kernel tests share (tests/cuda/, ctest label `cuda`): every CUDA entry against
 * the CPU table's (kernel_ops_cpu, the reference) on the same inputs. Without a device a test
 * prints why and exits 77, which ctest reports as *skipped* (SKIP_RETURN_CODE), never passed.
 *
 * cuda_test_open() makes the context (fixture_ctx) or skips; dev_upload / dev_download move
 * host arrays through the table's own entries; rel_l2 and max_rel compare a result with its
 * reference. Each test states its bound and why, as tests/unit/check.h asks. */
#ifndef TYCHO_TEST_CUDA_FIXTURE_H
#define TYCHO_TEST_CUDA_FIXTURE_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "cuda/cuda_backend.h"
#include "ops.h"

#define CUDA_SKIP 77

static void *fixture_ctx;

/* The CUDA context on device 0, or exit 77 (skipped) when there is none. */
static inline void cuda_test_open(void)
{
  if (cuda_device_count() == 0) {
    printf("skipped: no CUDA device (cudaGetDeviceCount sees none)\n");
    exit(CUDA_SKIP);
  }
  char err[512];
  fixture_ctx = cuda_ctx_create(0, err, sizeof err);
  if (!fixture_ctx) {
    fprintf(stderr, "CUDA context: %s\n", err);
    exit(1);
  }
}

/* A device copy of n_bytes of host memory (NULL-safe for n 0). */
static inline void *dev_upload(const void *host, size_t n_bytes)
{
  void *d = kernel_ops_cuda.mem_alloc(fixture_ctx, n_bytes);
  if (d && n_bytes)
    kernel_ops_cuda.from_host(fixture_ctx, d, host, n_bytes);
  return d;
}

static inline void *dev_zeros(size_t n_bytes) { return kernel_ops_cuda.mem_alloc(fixture_ctx, n_bytes); }

static inline void dev_download(void *host, const void *dev, size_t n_bytes)
{
  kernel_ops_cuda.to_host(fixture_ctx, host, dev, n_bytes);
}

static inline void dev_free(void *dev) { kernel_ops_cuda.mem_free(fixture_ctx, dev); }

/* The context's first failure, as a CHECK: every test ends with it. */
#define CHECK_CUDA_OK() CHECK_MSG(cuda_ctx_sync(fixture_ctx) == 0 && !cuda_ctx_error(fixture_ctx)[0], "%s", \
                                  cuda_ctx_error(fixture_ctx))

/* Uniform in [-scale, scale), from a fixed LCG (the same inputs on every run). */
static inline void fill_uniform(real *x, size_t n, uint64_t seed, double scale)
{
  uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x[i] = (real)(scale * ((double)(s >> 11) / 9007199254740992.0 * 2.0 - 1.0));
  }
}

/* ‖a − b‖ / ‖b‖ (‖a − b‖ when b is 0). */
static inline double rel_l2(const real *a, const real *b, size_t n)
{
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    den += (double)b[i] * b[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* max |a − b| / max |b| (max |a − b| when b is 0). */
static inline double max_rel(const real *a, const real *b, size_t n)
{
  double d = 0, m = 0;
  for (size_t i = 0; i < n; i++) {
    d = fmax(d, fabs((double)a[i] - b[i]));
    m = fmax(m, fabs((double)b[i]));
  }
  return m > 0 ? d / m : d;
}

#endif
