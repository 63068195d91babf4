/* The CUDA backend's kernel table (kernels/ops.h is the contract; kernels/cpu/ the reference every
 * entry is tested against, tests/cuda/): its execution context, the check macros and every
 * entry's prototype. Built only where CMake finds the CUDA toolkit, in the fp32 build
 * (`real` is float here; the float64 proof build is the CPU's).
 *
 * The context is the `ctx` of kernels_use: one stream and one cuBLAS handle on one device. Calls
 * on it are ordered by the stream; nothing here synchronises with the host except to_host,
 * from_host (its host buffer may be reused on return), mem_alloc and mem_free, and sumsq (which
 * returns a value).
 *
 * Math modes. The context's cuBLAS handle is in CUBLAS_PEDANTIC_MATH: the fp32 products
 * (cublasSgemm) compute in fp32, never TF32, so the exactness tests hold the CPU's bounds. The bf16
 * products (cublasGemmEx: bf16 operands, fp32 output, CUBLAS_COMPUTE_32F) switch the handle to
 * CUBLAS_DEFAULT_MATH for their call only, which lets cuBLAS run them on tensor cores (fp32
 * accumulation), and put it back to pedantic after; a bf16 product's bits may then differ from
 * the CPU's by the accumulation order (the bf16 bound), an fp32 product's never depend on it.
 *
 * Errors. Kernel entries return nothing (ops.h), so a failed CUDA, cuBLAS or NCCL call records
 * the first failure in the context, with file:line, the call and the library's message, and the
 * entry returns; the status entry (cuda_status) hands it to the runtime, which stops the step
 * and reports it.
 * Nothing here exits. */
#ifndef TYCHO_KERNELS_CUDA_BACKEND_H
#define TYCHO_KERNELS_CUDA_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#include "../bf16.h"
#include "../ops.h"
#include "../real.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Devices the driver sees; 0 without a driver or a device (cudaGetDeviceCount's error is "no
 * GPU", never a failure). */
int cuda_device_count(void);
/* A context on device `device`: its stream and cuBLAS handle. NULL with a message in err. */
void *cuda_ctx_create(int device, char *err, size_t err_size);
void cuda_ctx_destroy(void *ctx);
/* ctx's stream (a cudaStream_t): where the comm layer's NCCL operations go, ordered with the
 * kernels (comm/comm.h, comm_stream_set). */
void *cuda_ctx_stream(void *ctx);
/* The first failure recorded in ctx ("" none): file:line, the call, the library's message. */
const char *cuda_ctx_error(const void *ctx);
/* Waits for everything issued on ctx; 0, or -1 with the failure recorded. */
int cuda_ctx_sync(void *ctx);
/* The table: kernels_use(&kernel_ops_cuda, ctx). */
extern const struct kernel_ops kernel_ops_cuda;

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_runtime.h>
#include <cublas_v2.h>

struct cuda_ctx {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
  int failed;
  char err[512];
};

/* Records "file:line: what: message" as ctx's first failure; returns 1 (failed) so callers
 * can write `if (CUDA_CHECK(c, call)) return;`. */
int cuda_record(struct cuda_ctx *c, const char *file, int line, const char *what, const char *message);
const char *cuda_blas_message(cublasStatus_t s);

#define CUDA_CHECK(c, call) ([&]() -> int { cudaError_t e_ = (call); \
  return e_ == cudaSuccess ? 0 : cuda_record((c), __FILE__, __LINE__, #call, cudaGetErrorString(e_)); }())
#define CUBLAS_CHECK(c, call) ([&]() -> int { cublasStatus_t s_ = (call); \
  return s_ == CUBLAS_STATUS_SUCCESS ? 0 : cuda_record((c), __FILE__, __LINE__, #call, cuda_blas_message(s_)); }())
/* After a kernel launch: the launch's own error (bad configuration), not the kernel's result. */
#define CUDA_LAUNCHED(c) CUDA_CHECK((c), cudaGetLastError())

static inline struct cuda_ctx *cuda_of(void *ctx) { return (struct cuda_ctx *)ctx; }
/* Blocks of `threads` covering n items (at least 1). */
static inline unsigned cuda_blocks(size_t n, unsigned threads)
{
  size_t b = (n + threads - 1) / threads;
  return b == 0 ? 1u : b > 0x7fffffffu ? 0x7fffffffu : (unsigned)b;
}
#endif

#ifdef __cplusplus
extern "C" {
#endif
/* ---- the entries (ops_list.h's), cuda_<op>, defined across the .cu files here ---- */
#define KERNEL_OP(ret, op, params, args) ret cuda_##op(void *ctx, KERNEL_UNPACK params);
#define KERNEL_OP_BF16_OPT(ret, op, params, args)
#include "../ops_list.h"

#ifdef __cplusplus
}
#endif
#endif
