/* The CUDA backend's context, its errors and its memory entries (cuda_backend.h). Device memory
 * comes from plain cudaMalloc (never managed memory), zeroed, as ops.h asks of mem_alloc; the
 * runtime's allocator bills it by category on this backend's device (host/runtime/model/alloc.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"

int cuda_record(struct cuda_ctx *c, const char *file, int line, const char *what, const char *message)
{
  if (c && !c->failed) {
    const char *base = strrchr(file, '/');
    snprintf(c->err, sizeof c->err, "%s:%d: %.200s: %s", base ? base + 1 : file, line, what, message);
    c->failed = 1;
  }
  return 1;
}

const char *cuda_blas_message(cublasStatus_t s)
{
  const char *name = cublasGetStatusName(s), *text = cublasGetStatusString(s);
  static thread_local char buf[160];
  snprintf(buf, sizeof buf, "%s (%s)", name ? name : "?", text ? text : "?");
  return buf;
}

extern "C" int cuda_device_count(void)
{
  int n = 0; /* without a driver the call fails: that is "no GPU" */
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

extern "C" void *cuda_ctx_create(int device, char *err, size_t err_size)
{
  const int n = cuda_device_count();
  if (device < 0 || device >= n) {
    snprintf(err, err_size, "CUDA device %d: %d device%s visible", device, n, n == 1 ? "" : "s");
    return NULL;
  }
  struct cuda_ctx *c = (struct cuda_ctx *)calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, err_size, "out of host memory for a CUDA context");
    return NULL;
  }
  c->device = device;
  if (CUDA_CHECK(c, cudaSetDevice(device)) || CUDA_CHECK(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) ||
      CUBLAS_CHECK(c, cublasCreate(&c->blas)) || CUBLAS_CHECK(c, cublasSetStream(c->blas, c->stream)) ||
      /* fp32 products in fp32: no TF32 (the equivalence tests hold the CPU's bounds) */
      CUBLAS_CHECK(c, cublasSetMathMode(c->blas, CUBLAS_PEDANTIC_MATH))) {
    snprintf(err, err_size, "%s", c->err);
    cuda_ctx_destroy(c);
    return NULL;
  }
  return c;
}

extern "C" void *cuda_ctx_stream(void *ctx)
{
  return ctx ? (void *)cuda_of(ctx)->stream : NULL;
}

extern "C" void cuda_ctx_destroy(void *ctx)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (!c)
    return;
  if (c->blas)
    cublasDestroy(c->blas);
  if (c->stream)
    cudaStreamDestroy(c->stream);
  free(c);
}

extern "C" const char *cuda_ctx_error(const void *ctx)
{
  const struct cuda_ctx *c = (const struct cuda_ctx *)ctx;
  return c && c->failed ? c->err : "";
}

/* The status entry: a failure recorded by an entry, or one the stream reports without waiting
 * (a kernel's fault surfaces asynchronously, at the stream's next query). */
extern "C" int cuda_status(void *ctx, char *err, size_t err_size)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (!c->failed) {
    const cudaError_t e = cudaStreamQuery(c->stream);
    if (e != cudaSuccess && e != cudaErrorNotReady)
      cuda_record(c, __FILE__, __LINE__, "cudaStreamQuery(stream)", cudaGetErrorString(e));
  }
  if (!c->failed)
    return 0;
  snprintf(err, err_size, "%s", c->err);
  return -1;
}

extern "C" int cuda_ctx_sync(void *ctx)
{
  struct cuda_ctx *c = cuda_of(ctx);
  return CUDA_CHECK(c, cudaStreamSynchronize(c->stream)) ? -1 : 0;
}

/* ---- memory ---- */

extern "C" void *cuda_mem_alloc(void *ctx, size_t n_bytes)
{
  struct cuda_ctx *c = cuda_of(ctx);
  void *p = NULL;
  /* cudaMalloc aligns to 256 bytes; a 0-byte request gets a unique block of its own */
  if (cudaMalloc(&p, n_bytes ? n_bytes : 1) != cudaSuccess) {
    (void)cudaGetLastError(); /* out of memory: NULL, as ops.h says; not a failure of the stream */
    return NULL;
  }
  if (CUDA_CHECK(c, cudaMemsetAsync(p, 0, n_bytes ? n_bytes : 1, c->stream)) ||
      CUDA_CHECK(c, cudaStreamSynchronize(c->stream))) {
    cudaFree(p);
    return NULL;
  }
  return p;
}

extern "C" void cuda_mem_free(void *ctx, void *block)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (!block)
    return;
  /* the stream may still read it: freed after what was issued before */
  if (!CUDA_CHECK(c, cudaStreamSynchronize(c->stream)))
    CUDA_CHECK(c, cudaFree(block));
}

extern "C" void cuda_copy(void *ctx, void *dst, const void *src, size_t n_bytes)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (!n_bytes || dst == src)
    return;
  const char *d = (const char *)dst, *s = (const char *)src;
  if (d + n_bytes <= s || s + n_bytes <= d) {
    CUDA_CHECK(c, cudaMemcpyAsync(dst, src, n_bytes, cudaMemcpyDeviceToDevice, c->stream));
    return;
  }
  /* overlapping (ops.h allows it; cudaMemcpy does not): through a block of the stream's own */
  void *tmp = NULL;
  if (CUDA_CHECK(c, cudaMallocAsync(&tmp, n_bytes, c->stream)))
    return;
  if (!CUDA_CHECK(c, cudaMemcpyAsync(tmp, src, n_bytes, cudaMemcpyDeviceToDevice, c->stream)))
    CUDA_CHECK(c, cudaMemcpyAsync(dst, tmp, n_bytes, cudaMemcpyDeviceToDevice, c->stream));
  CUDA_CHECK(c, cudaFreeAsync(tmp, c->stream));
}

extern "C" void cuda_copy_rows(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                               size_t row_bytes, size_t n_rows)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (row_bytes && n_rows)
    CUDA_CHECK(c, cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, n_rows, cudaMemcpyDeviceToDevice,
                                    c->stream));
}

extern "C" void cuda_zero(void *ctx, void *dst, size_t n_bytes)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_bytes)
    CUDA_CHECK(c, cudaMemsetAsync(dst, 0, n_bytes, c->stream));
}

extern "C" void cuda_to_host(void *ctx, void *host, const void *src, size_t n_bytes)
{
  struct cuda_ctx *c = cuda_of(ctx);
  if (n_bytes && !CUDA_CHECK(c, cudaMemcpyAsync(host, src, n_bytes, cudaMemcpyDeviceToHost, c->stream)))
    CUDA_CHECK(c, cudaStreamSynchronize(c->stream)); /* the host reads it next */
}

extern "C" void cuda_from_host(void *ctx, void *dst, const void *host, size_t n_bytes)
{
  struct cuda_ctx *c = cuda_of(ctx);
  /* synchronous: the caller may reuse or free its host buffer on return */
  if (n_bytes && !CUDA_CHECK(c, cudaMemcpyAsync(dst, host, n_bytes, cudaMemcpyHostToDevice, c->stream)))
    CUDA_CHECK(c, cudaStreamSynchronize(c->stream));
}
