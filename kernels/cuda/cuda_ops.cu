/* The CUDA backend's kernel table (cuda_backend.h): every entry of kernels/ops.h, defined in the
 * .cu files beside this one. Its memory is the device's (host_visible 0): the runtime reaches it
 * through the memory entries only (host/runtime/hostview.h). */
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
  t.mem_alloc = cuda_mem_alloc;
  t.mem_free = cuda_mem_free;
  t.copy = cuda_copy;
  t.copy_rows = cuda_copy_rows;
  t.zero = cuda_zero;
  t.to_host = cuda_to_host;
  t.from_host = cuda_from_host;
  t.encoder_forward = cuda_encoder_forward;
  t.encoder_backward = cuda_encoder_backward;
  t.encoder_forward_shard = cuda_encoder_forward_shard;
  t.encoder_backward_shard = cuda_encoder_backward_shard;
  t.rmsnorm_forward = cuda_rmsnorm_forward;
  t.rmsnorm_backward = cuda_rmsnorm_backward;
  t.linear_forward = cuda_linear_forward;
  t.linear_backward = cuda_linear_backward;
  t.linear_forward_acc = cuda_linear_forward_acc;
  t.round_bf16 = cuda_round_bf16;
  t.linear_forward_bf16 = cuda_linear_forward_bf16;
  t.linear_forward_acc_bf16 = cuda_linear_forward_acc_bf16;
  t.linear_backward_bf16 = cuda_linear_backward_bf16;
  t.rmsnorm_forward_bf16 = cuda_rmsnorm_forward_bf16;
  t.swiglu_forward_bf16 = cuda_swiglu_forward_bf16;
  t.swiglu_forward_rows_bf16 = cuda_swiglu_forward_rows_bf16;
  t.adamw_update_bf16 = cuda_adamw_update_bf16;
  t.rope_table = cuda_rope_table;
  t.rope_forward = cuda_rope_forward;
  t.rope_backward = cuda_rope_backward;
  t.rope_forward_qkv = cuda_rope_forward_qkv;
  t.rope_backward_qkv = cuda_rope_backward_qkv;
  t.attention_scratch_n_elems = cuda_attention_scratch_n_elems;
  t.attention_forward = cuda_attention_forward;
  t.attention_backward = cuda_attention_backward;
  t.attention_forward_qkv = cuda_attention_forward_qkv;
  t.attention_backward_qkv = cuda_attention_backward_qkv;
  t.swiglu_forward = cuda_swiglu_forward;
  t.swiglu_backward = cuda_swiglu_backward;
  t.swiglu_forward_rows = cuda_swiglu_forward_rows;
  t.swiglu_backward_rows = cuda_swiglu_backward_rows;
  t.moe_router_forward = cuda_moe_router_forward;
  t.moe_route = cuda_moe_route;
  t.moe_dispatch = cuda_moe_dispatch;
  t.moe_dispatch_backward = cuda_moe_dispatch_backward;
  t.moe_combine = cuda_moe_combine;
  t.moe_combine_backward = cuda_moe_combine_backward;
  t.moe_aux_loss = cuda_moe_aux_loss;
  t.moe_router_backward = cuda_moe_router_backward;
  t.dropout_mask = cuda_dropout_mask;
  t.dropout_forward = cuda_dropout_forward;
  t.dropout_backward = cuda_dropout_backward;
  t.residual_forward = cuda_residual_forward;
  t.crossentropy_forward = cuda_crossentropy_forward;
  t.crossentropy_backward = cuda_crossentropy_backward;
  t.crossentropy_shard_max = cuda_crossentropy_shard_max;
  t.crossentropy_shard_sums = cuda_crossentropy_shard_sums;
  t.crossentropy_shard_finish = cuda_crossentropy_shard_finish;
  t.crossentropy_shard_backward = cuda_crossentropy_shard_backward;
  t.adamw_update = cuda_adamw_update;
  t.sumsq = cuda_sumsq;
  t.scale_inplace = cuda_scale_inplace;
  return t;
}

extern "C" const struct kernel_ops kernel_ops_cuda = make_table();
