/* bf16 linear products through oneDNN's matmul primitive (bf16.h): bf16 source and weights,
 * fp32 destination and accumulation, the weight's row-major (OC, IC) layout read in place through
 * strides (no transposed copy). A primitive costs tens of microseconds to make, so each
 * (kind, shape) is made once and kept; its memory objects are rebound to the caller's buffers on
 * every call. The caller is one thread (the trainer's); oneDNN runs the product on the OpenMP pool
 * the other kernels use. */
#include "bf16.h"

#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#include <string.h>

enum kind { FORWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD_ACC };
static const char *const kind_names[] = { "forward", "input gradient", "weight gradient",
                                          "forward into a residual" };

struct entry {
  int used;
  enum kind kind;
  int BT, IC, OC;
  dnnl_primitive_t prim;
  dnnl_memory_t src, wei, dst;
  const char *impl;
};

enum { CACHE_ENTRIES = 64 };
static struct {
  int ready;
  dnnl_engine_t engine;
  dnnl_stream_t stream;
  struct entry entries[CACHE_ENTRIES];
  int next; /* round-robin slot to replace when full */
} dn;

static int dnnl_fail(dnnl_status_t s, const char *what, char *err, size_t err_size)
{
  snprintf(err, err_size, "oneDNN: %s failed (status %d)", what, (int)s);
  return 1;
}

#define DN(call, what)                                                                       \
  do {                                                                                       \
    dnnl_status_t s_ = (call);                                                               \
    if (s_ != dnnl_success)                                                                  \
      return dnnl_fail(s_, what, err, err_size);                                             \
  } while (0)

static int ready(char *err, size_t err_size)
{
  if (dn.ready)
    return 0;
  DN(dnnl_engine_create(&dn.engine, dnnl_cpu, 0), "creating the CPU engine");
  DN(dnnl_stream_create(&dn.stream, dn.engine, dnnl_stream_default_flags), "creating a stream");
  dn.ready = 1;
  return 0;
}

static void entry_free(struct entry *e)
{
  if (!e->used)
    return;
  dnnl_primitive_destroy(e->prim);
  dnnl_memory_destroy(e->src);
  dnnl_memory_destroy(e->wei);
  dnnl_memory_destroy(e->dst);
  memset(e, 0, sizeof *e);
}

/* The primitive of (kind, shape): found or made. */
static int get(enum kind kind, int BT, int IC, int OC, struct entry **out, char *err, size_t err_size)
{
  if (ready(err, err_size))
    return 1;
  for (int i = 0; i < CACHE_ENTRIES; i++) {
    struct entry *e = &dn.entries[i];
    if (e->used && e->kind == kind && e->BT == BT && e->IC == IC && e->OC == OC) {
      *out = e;
      return 0;
    }
  }
  /* src (M, K) · wei (K, N) = dst (M, N), each with its strides */
  dnnl_dim_t M, K, N;
  dnnl_dims_t src_strides, wei_strides;
  if (kind == FORWARD || kind == FORWARD_ACC) { /* inp (BT, IC) · weightᵀ: weight (OC, IC) read as (IC, OC) */
    M = BT, K = IC, N = OC;
    src_strides[0] = IC, src_strides[1] = 1;
    wei_strides[0] = 1, wei_strides[1] = IC;
  } else if (kind == BACKWARD_INPUT) { /* dout (BT, OC) · weight (OC, IC) */
    M = BT, K = OC, N = IC;
    src_strides[0] = OC, src_strides[1] = 1;
    wei_strides[0] = IC, wei_strides[1] = 1;
  } else { /* doutᵀ: dout (BT, OC) read as (OC, BT); · inp (BT, IC) */
    M = OC, K = BT, N = IC;
    src_strides[0] = 1, src_strides[1] = OC;
    wei_strides[0] = IC, wei_strides[1] = 1;
  }
  dnnl_dims_t src_dims = { M, K }, wei_dims = { K, N }, dst_dims = { M, N }, dst_strides = { N, 1 };
  dnnl_memory_desc_t src_md, wei_md, dst_md;
  DN(dnnl_memory_desc_init_by_strides(&src_md, 2, src_dims, dnnl_bf16, src_strides), "a source descriptor");
  DN(dnnl_memory_desc_init_by_strides(&wei_md, 2, wei_dims, dnnl_bf16, wei_strides), "a weights descriptor");
  DN(dnnl_memory_desc_init_by_strides(&dst_md, 2, dst_dims, dnnl_f32, dst_strides), "a destination descriptor");
  dnnl_matmul_desc_t md;
  DN(dnnl_matmul_desc_init(&md, &src_md, &wei_md, NULL, &dst_md), "a matmul descriptor");
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t ops = NULL;
  if (kind == BACKWARD_WEIGHT || kind == FORWARD_ACC) { /* += : the sum post-op reads the destination */
    DN(dnnl_primitive_attr_create(&attr), "primitive attributes");
    DN(dnnl_post_ops_create(&ops), "post-ops");
    DN(dnnl_post_ops_append_sum(ops, 1.0f), "the sum post-op");
    DN(dnnl_primitive_attr_set_post_ops(attr, ops), "setting the post-ops");
  }
  dnnl_primitive_desc_t pd;
  dnnl_status_t s = dnnl_primitive_desc_create(&pd, &md, attr, dn.engine, NULL);
  if (ops)
    dnnl_post_ops_destroy(ops);
  if (attr)
    dnnl_primitive_attr_destroy(attr);
  if (s != dnnl_success) {
    snprintf(err, err_size, "oneDNN: no bf16 matmul for the %s of a linear (%d × %d → %d; status %d)",
             kind_names[kind], BT, IC, OC, (int)s);
    return 1;
  }
  struct entry *e = NULL;
  for (int i = 0; i < CACHE_ENTRIES && !e; i++)
    if (!dn.entries[i].used)
      e = &dn.entries[i];
  if (!e) {
    e = &dn.entries[dn.next];
    dn.next = (dn.next + 1) % CACHE_ENTRIES;
    entry_free(e);
  }
  const char *impl = "?";
  dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
  s = dnnl_primitive_create(&e->prim, pd);
  /* the implementation's name is a static string of the library's */
  e->impl = impl;
  dnnl_primitive_desc_destroy(pd);
  if (s != dnnl_success)
    return dnnl_fail(s, "creating a matmul primitive", err, err_size);
  if (dnnl_memory_create(&e->src, &src_md, dn.engine, DNNL_MEMORY_NONE) != dnnl_success ||
      dnnl_memory_create(&e->wei, &wei_md, dn.engine, DNNL_MEMORY_NONE) != dnnl_success ||
      dnnl_memory_create(&e->dst, &dst_md, dn.engine, DNNL_MEMORY_NONE) != dnnl_success) {
    dnnl_primitive_destroy(e->prim);
    memset(e, 0, sizeof *e);
    snprintf(err, err_size, "oneDNN: creating memory objects failed");
    return 1;
  }
  e->used = 1;
  e->kind = kind;
  e->BT = BT, e->IC = IC, e->OC = OC;
  *out = e;
  return 0;
}

static int run(enum kind kind, float *dst, const bf16 *src, const bf16 *wei, int BT, int IC, int OC, char *err,
               size_t err_size)
{
  if (BT == 0 || IC == 0 || OC == 0)
    return 0;
  struct entry *e;
  if (get(kind, BT, IC, OC, &e, err, err_size))
    return 1;
  DN(dnnl_memory_set_data_handle(e->src, (void *)src), "binding the source");
  DN(dnnl_memory_set_data_handle(e->wei, (void *)wei), "binding the weights");
  DN(dnnl_memory_set_data_handle(e->dst, dst), "binding the destination");
  dnnl_exec_arg_t args[3] = { { DNNL_ARG_SRC, e->src }, { DNNL_ARG_WEIGHTS, e->wei }, { DNNL_ARG_DST, e->dst } };
  DN(dnnl_primitive_execute(e->prim, dn.stream, 3, args), "a bf16 matmul");
  DN(dnnl_stream_wait(dn.stream), "waiting for a bf16 matmul");
  return 0;
}

/* oneDNN's bf16 matmul where it is fast (found once), else the widened products (bf16.h). */
static int widened(void)
{
  static int fast = -1;
  if (fast < 0) {
    char why[256];
    fast = bf16_matmul_available(NULL, why, sizeof why) == 0;
  }
  return !fast || bf16_widened_asked();
}

static int product(enum kind kind, float *dst, const bf16 *src, const bf16 *wei, int BT, int IC, int OC,
                   char *err, size_t err_size)
{
  static const int widened_kind[] = { [FORWARD] = BF16_LINEAR_FORWARD,
                                      [BACKWARD_INPUT] = BF16_LINEAR_BACKWARD_INPUT,
                                      [BACKWARD_WEIGHT] = BF16_LINEAR_BACKWARD_WEIGHT,
                                      [FORWARD_ACC] = BF16_LINEAR_FORWARD_ACC };
  if (widened())
    return linear_bf16_widened(widened_kind[kind], dst, src, wei, BT, IC, OC, err, err_size);
  return run(kind, dst, src, wei, BT, IC, OC, err, err_size);
}

int linear_bf16_forward(float *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                        char *err, size_t err_size)
{
  return product(FORWARD, out, inp, weight, BT, IC, OC, err, err_size);
}

int linear_bf16_forward_acc(float *out, const bf16 *inp, const bf16 *weight, int BT, int IC, int OC,
                            char *err, size_t err_size)
{
  return product(FORWARD_ACC, out, inp, weight, BT, IC, OC, err, err_size);
}

int linear_bf16_backward_input(float *dinp, const bf16 *dout, const bf16 *weight, int BT, int IC,
                               int OC, char *err, size_t err_size)
{
  return product(BACKWARD_INPUT, dinp, dout, weight, BT, IC, OC, err, err_size);
}

int linear_bf16_backward_weight(float *dweight, const bf16 *dout, const bf16 *inp, int BT, int IC,
                                int OC, char *err, size_t err_size)
{
  return product(BACKWARD_WEIGHT, dweight, dout, inp, BT, IC, OC, err, err_size);
}

const char *bf16_linear_path(char *buf, size_t n)
{
  const char *impl;
  char why[256];
  if (bf16_matmul_available(&impl, why, sizeof why))
    snprintf(buf, n, "fp32 products over bf16 operands widened (this CPU has no bf16 products)");
  else if (bf16_widened_asked())
    snprintf(buf, n, "fp32 products over bf16 operands widened (TYCHO_BF16=widen; oneDNN has %s)", impl);
  else
    snprintf(buf, n, "oneDNN %s", impl);
  return buf;
}

int bf16_matmul_available(const char **impl, char *err, size_t err_size)
{
  struct entry *e;
  if (impl)
    *impl = "none";
  if (get(FORWARD, 64, 64, 64, &e, err, err_size))
    return 1;
  if (impl)
    *impl = e->impl;
  if (strstr(e->impl, "ref")) {
    snprintf(err, err_size, "oneDNN has only its reference bf16 matmul on this CPU (%s): bf16 products "
             "at speed need AVX-512 BF16 or AMX", e->impl);
    return 1;
  }
  return 0;
}
