/* kernel_ops_cpu: the CPU backend's table (ops.h). Each kernel entry drops the execution
 * context, which the CPU has no use for, and calls the free function of the same name
 * (kernels.h), so the kernels themselves exist once and their unit tests call them directly;
 * those entries are made from the list (ops_list.h), the memory and status entries are here. */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"

/* ---- memory: host memory, worked on in place ---- */

static void *cpu_mem_alloc(void *ctx, size_t n_bytes)
{
  (void)ctx;
  size_t rounded = (n_bytes + 63) / 64 * 64;
  void *p = aligned_alloc(64, rounded ? rounded : 64);
  if (p)
    memset(p, 0, rounded);
  return p;
}

static void cpu_mem_free(void *ctx, void *block)
{
  (void)ctx;
  free(block);
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t n_bytes)
{
  (void)ctx;
  if (n_bytes)
    memmove(dst, src, n_bytes);
}

static void cpu_copy_rows(void *ctx, void *dst, size_t dst_pitch, const void *src, size_t src_pitch,
                          size_t row_bytes, size_t n_rows)
{
  (void)ctx;
  for (size_t r = 0; r < n_rows; r++)
    memcpy((char *)dst + r * dst_pitch, (const char *)src + r * src_pitch, row_bytes);
}

static void cpu_zero(void *ctx, void *dst, size_t n_bytes)
{
  (void)ctx;
  if (n_bytes)
    memset(dst, 0, n_bytes);
}

static void cpu_to_host(void *ctx, void *host, const void *src, size_t n_bytes)
{
  (void)ctx;
  if (n_bytes)
    memcpy(host, src, n_bytes);
}

static void cpu_from_host(void *ctx, void *dst, const void *host, size_t n_bytes)
{
  (void)ctx;
  if (n_bytes)
    memcpy(dst, host, n_bytes);
}

static int cpu_status(void *ctx, char *err, size_t err_size)
{
  (void)ctx, (void)err, (void)err_size;
  return 0; /* every failure is reported by the call that has it */
}

/* ---- the kernels: the free function of the same name, without ctx ---- */

#define KERNEL_BACKEND(ret, op, params, args)
#define KERNEL_OP(ret, op, params, args)                                                          \
  static ret cpu_##op(void *ctx, KERNEL_UNPACK params)                                          \
  {                                                                                               \
    (void)ctx;                                                                                    \
    KERNEL_RETURN(ret) op args;                                                                   \
  }
#if REAL_IS_DOUBLE
#define KERNEL_OP_BF16(ret, op, params, args) /* no bf16 compute: the entries stay NULL */
#endif
#include "ops_list.h"

const struct kernel_ops kernel_ops_cpu = {
  .name = "cpu",
  .compute_dtype = REAL_TENSOR_DTYPE,
  .host_visible = 1,
#define KERNEL_OP(ret, op, params, args) .op = cpu_##op,
#if REAL_IS_DOUBLE
#define KERNEL_OP_BF16(ret, op, params, args)
#endif
#include "ops_list.h"
};
