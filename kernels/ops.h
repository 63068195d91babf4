/* The kernel table: every op the runtime computes a Llama-style model with, as one struct of
 * function pointers per backend, chosen at run time. This header and the list of entries it
 * includes (ops_list.h: each entry's arguments and semantics) are the contract a backend
 * implements; kernels/cpu/ is the reference (kernel_ops_cpu, its free functions in kernels.h).
 * Semantics follow Hugging Face LlamaForCausalLM, on `real` (real.h: fp32, or double in the
 * float64 proof build).
 *
 * Selection: kernels_use(table, ctx) names the table and context that models created from then on
 * capture (model_create*, host/runtime/model/model.h: m->k, m->kctx); a model keeps them for its life,
 * so changing the selection never touches a model already made. Every kernel call of the model,
 * the optimizer and the data-parallel optimizer goes through the model's table (optimizer.c and
 * dp_optim.c take it from the model they update), so a backend is a new table and a kernels_use
 * call, nothing under host/runtime. Set it before any model exists (it is not synchronised); the
 * default is kernel_ops_cpu with ctx NULL.
 *
 * Dimension legend:
 *   B    batch                       T    sequence length
 *   C    model dim (= NH * HS)       HS   head size
 *   NH   query heads                 NKV  key/value heads (NH % NKV == 0; grouped-query attention)
 *   F    ffn (intermediate) dim      V    vocabulary size
 *   Vp   padded vocabulary (>= V): the row stride of logits and of the embedding table
 *   BT   B * T, for ops that treat every token alike
 *
 * Conventions:
 *   - arguments in the order: ctx, outputs, saved-for-backward, inputs, parameters, sizes, then
 *     scalar settings (eps, learning rate, ...);
 *   - ctx is the one given to kernels_use with the table: the backend's execution context (a
 *     CUDA stream); the CPU table ignores it. Calls on one ctx take effect in call order;
 *   - every pointer is the backend's memory (host memory for the CPU table), err excepted;
 *     sizes and settings are values; only sumsq and status return a result to the host;
 *   - parameter gradients ACCUMULATE (+=), activation gradients ASSIGN (=);
 *   - row-major; activations are (BT, C), (BT, F), ...; a linear weight is stored as Hugging
 *     Face stores it, (OC, IC), and y = x · Wᵀ (no bias);
 *   - element counts are size_t and named n_elems; everything else is int;
 *   - kernels never allocate, never exit and keep no state; buffers that may alias are named;
 *   - results do not depend on the launch shape or thread count: sums run in a fixed order, and
 *     dropout masks come from Philox by logical element index (philox.h). */
#ifndef TYCHO_KERNELS_OPS_H
#define TYCHO_KERNELS_OPS_H
#include <stddef.h>
#include <stdint.h>

#include "bf16.h"
#include "real.h"

/* Helpers for the includers of ops_list.h: KERNEL_UNPACK drops an entry's params or args
 * parentheses; KERNEL_RETURN(ret) is `return` for an entry returning a value and nothing for a
 * void one, so a wrapper forwards either kind (a return type not below fails to compile: add
 * its line). */
#define KERNEL_UNPACK(...) __VA_ARGS__
#define KERNEL_RETURN(ret) KERNEL_RETURN_##ret
#define KERNEL_RETURN_void
#define KERNEL_RETURN_int return
#define KERNEL_RETURN_size_t return
#define KERNEL_RETURN_double return

/* The dropout of attention probabilities, drawn inside the kernel from Philox (no mask is
 * kept): element (b, h, i, j) — sample b, this call's query head h, query row i, key j — is
 * kept with scale 1/(1 − p) unless attention_drop_u(d, b, h, i, j, T) < p, the same number
 * dropout_mask draws for element (h·T + i)·T + j of sample b's (NH, T, T) block at offset
 * first. p == 0 or a NULL pointer: no dropout. */
struct attention_dropout {
  float p;
  uint64_t seed;
  uint32_t c1;              /* the training step */
  uint32_t c3;              /* (layer << 8) | site */
  uint64_t first;           /* element index of this call's head 0, row 0, key 0 (a tp rank's heads start at rank · NHl · T · T) */
  const uint32_t *samples;  /* (B) each sample's c2, host memory */
};

/* A block of context parallelism's ring attention (the attention_cp_* entries, ops_list.h): query
 * rows at global positions [q0, q0 + Tq) against keys [k0, k0 + Tk) of a T-long sequence, causal
 * by global position (row i sees keys ≤ i), dropout drawn with the global row, key and T (the
 * whole-sequence kernel's draws). A chunk is a row range of a rank's buffers: q_rows and kv_rows
 * are the rows per sample of the q/out/lse buffers and of the k/v buffers, and the pointers start
 * at the block's first row. Host memory, as struct attention_dropout. */
struct attention_block {
  int T;               /* the whole sequence's length */
  int q0, Tq;          /* the query rows' global positions */
  int k0, Tk;          /* the keys' */
  int q_rows, kv_rows; /* rows per sample of the q/out/lse buffers and of the k/v buffers */
};

struct kernel_ops {
  const char *name; /* "cpu", ... */
  /* The element type of every `real` buffer the entries take (real.h): a model refuses a table
   * whose type is not its build's (REAL_TENSOR_DTYPE). */
  enum tensor_dtype compute_dtype;
  /* 1 when the backend's memory is host memory (the CPU): the runtime may then work on it in
   * place instead of staging through to_host/from_host, and the allocator bills it as the host's
   * (no device of its own). */
  int host_visible;
  /* The entries, each `ret (*op)(void *ctx, params)`: their list and contracts are ops_list.h. */
#define KERNEL_OP(ret, op, params, args) ret (*op)(void *ctx, KERNEL_UNPACK params);
#include "ops_list.h"
};

/* The CPU backend (kernels/cpu/ops.c): the free functions of kernels.h; ctx ignored. */
extern const struct kernel_ops kernel_ops_cpu;

/* The table and context models created from now on capture. ops NULL: back to the default,
 * kernel_ops_cpu with ctx NULL. */
void kernels_use(const struct kernel_ops *ops, void *ctx);
/* The selection kernels_use made (kernel_ops_cpu until the first call). */
const struct kernel_ops *kernels_active(void);
void *kernels_active_context(void);

#endif
