/* The CUDA backend's kernel table (cuda_backend.h): every entry of kernels/ops_list.h, each
 * cuda_<op>, defined in the .cu files beside this one. Its memory is the device's
 * (host_visible 0): the runtime reaches it through the memory entries only
 * (host/runtime/model/hostview.h). */
#include "cuda_backend.h"
#include "../ops.h"

#include <string.h>

static struct kernel_ops make_table(void)
{
  struct kernel_ops t;
  memset(&t, 0, sizeof t);
  t.name = "cuda";
  t.compute_dtype = REAL_TENSOR_DTYPE;
  t.host_visible = 0;
#define KERNEL_OP(ret, op, params, args) t.op = cuda_##op;
#define KERNEL_OP_BF16_OPT(ret, op, params, args) /* none here: the fp32 entries stand in */
#include "../ops_list.h"
  return t;
}

extern "C" const struct kernel_ops kernel_ops_cuda = make_table();
