/* The element type of every tensor the CPU kernels and the runtime compute on: `real`.
 *
 * It is float, and double in the float64 proof build (cmake -DTYCHO_FLOAT64=ON). That build
 * exists to tell a layout bug from rounding: in fp32 two layouts of one plan differ by rounding
 * (1e-9 to 1e-5 after a few AdamW steps), in float64 by about 1e-15, so a layout that is right
 * reproduces the serial run to 1e-10 there and one that is wrong does not. This header is the
 * one place the type is chosen; kernels, runtime buffers, the optimizer and the messages the
 * runtime sends (COMM_REAL, host/comm/comm.h) all follow it. What stays float in both builds:
 * Philox's draws (kernels/philox.h), so masks and initial weights are the same numbers, and
 * the files tycho reads and writes (safetensors F32/F16/BF16, converted at the edge). */
#ifndef TYCHO_REAL_H
#define TYCHO_REAL_H
#include <math.h>

/* Element types a tensor can have, by their safetensors names. A tensor says which it holds (struct
 * model_param: dtype) and a kernel table which its `real` buffers are (struct kernel_ops:
 * compute_dtype); the runtime refuses a table whose type is not this build's `real`. bf16 and f16
 * appear in files (converted at the edge) and, later, in tables that compute in them (bf16 compute
 * with fp32 master weights: docs/design.md, "Kernels and backends"). */
enum tensor_dtype { TENSOR_F32, TENSOR_F64, TENSOR_BF16, TENSOR_F16, TENSOR_N_DTYPES };

static inline const char *tensor_dtype_name(enum tensor_dtype d)
{
  static const char *const names[TENSOR_N_DTYPES] = { "F32", "F64", "BF16", "F16" };
  return (unsigned)d < TENSOR_N_DTYPES ? names[d] : "?";
}

static inline int tensor_dtype_bytes(enum tensor_dtype d)
{
  return d == TENSOR_F64 ? 8 : d == TENSOR_F32 ? 4 : 2;
}

#ifdef TYCHO_FLOAT64
typedef double real;
#define REAL_TENSOR_DTYPE TENSOR_F64
#define REAL_IS_DOUBLE 1
#define REAL_NAME "float64"
#define REAL_DTYPE "F64" /* as safetensors and checkpoint manifests name it */
#define real_exp exp
#define real_sqrt sqrt
#else
typedef float real;
#define REAL_TENSOR_DTYPE TENSOR_F32
#define REAL_IS_DOUBLE 0
#define REAL_NAME "fp32"
#define REAL_DTYPE "F32"
#define real_exp expf
#define real_sqrt sqrtf
#endif

#endif
