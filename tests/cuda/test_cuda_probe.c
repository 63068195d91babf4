/* The CUDA backend without and with a device (not labelled `cuda`: it runs everywhere).
 * Without a device (no driver: cudaGetDeviceCount fails) the count is 0 and a context is refused
 * by name, nothing exits. With one, a context opens with no failure recorded, blocks come zeroed,
 * and a failing call is recorded with the file, the
 * line and CUDA's message, and reported, not fatal: rows wider than their pitch. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "cuda/cuda_backend.h"
#include "ops.h"

static void test_count_and_context(void)
{
  const int n = cuda_device_count();
  CHECK(n >= 0);
  char err[512] = "";
  void *ctx = cuda_ctx_create(n, err, sizeof err); /* one past the last device: refused */
  CHECK(ctx == NULL);
  char want[64];
  snprintf(want, sizeof want, "CUDA device %d: %d device%s visible", n, n, n == 1 ? "" : "s");
  CHECK_MSG(strstr(err, want) != NULL, "\"%s\" lacks \"%s\"", err, want);
  if (n == 0) {
    printf("no CUDA device: count 0, a context refused (\"%s\")\n", err);
    return;
  }
  ctx = cuda_ctx_create(0, err, sizeof err);
  CHECK_MSG(ctx != NULL, "%s", err);
  if (!ctx)
    return;
  CHECK(cuda_ctx_error(ctx)[0] == 0 && cuda_ctx_sync(ctx) == 0);
  /* a 0-byte block is valid and unique; a zeroed block reads back as zeros */
  void *a = kernel_ops_cuda.mem_alloc(ctx, 0), *b = kernel_ops_cuda.mem_alloc(ctx, 4096);
  CHECK(a && b && a != b);
  unsigned char host[4096];
  memset(host, 0xff, sizeof host);
  kernel_ops_cuda.to_host(ctx, host, b, sizeof host);
  int zero = 1;
  for (size_t i = 0; i < sizeof host; i++) zero &= host[i] == 0;
  CHECK(zero);
  kernel_ops_cuda.mem_free(ctx, a);
  CHECK(cuda_ctx_error(ctx)[0] == 0);
  /* rows of 16 bytes at a pitch of 8: CUDA refuses the copy at once; the context records it */
  kernel_ops_cuda.copy_rows(ctx, b, 8, b, 8, 16, 2);
  const char *e = cuda_ctx_error(ctx);
  CHECK_MSG(strstr(e, "cuda_ctx.cu:") && strstr(e, "cudaMemcpy2DAsync") && strstr(e, "pitch"), "recorded: \"%s\"", e);
  printf("a refused copy, recorded: %s\n", e);
  kernel_ops_cuda.mem_free(ctx, b);
  cuda_ctx_destroy(ctx);
}

int main(void)
{
  static const struct test_case t[] = { TEST(test_count_and_context) };
  return test_run_all(t, (int)(sizeof t / sizeof t[0]));
}
