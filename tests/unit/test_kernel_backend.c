/* The model and the optimizer compute only through the kernel table (kernels/ops.h): a backend
 * that wraps kernel_ops_cpu and counts every call, selected with kernels_use before a trainer
 * opens, trains a tiny plan (2 layers, dropout 0.1, 2 micro-batches, clipping on) for 2 steps to
 * the very bits of the same plan on the CPU table (losses, norms, parameters), and sees a call
 * of every entry a one-rank run uses. A kernel the runtime called by name would still give the
 * same bits but leave its entry at 0 here. The vocabulary-shard entries (encoder_*_shard,
 * crossentropy_shard_*) and copy_rows run only under tensor parallelism and context
 * parallelism's blocks (attention_cp_*) only in its ring, so they are left out of the count, and
 * so are mem_alloc and mem_free: the table is host-visible, so its memory is the host
 * allocator's. The trainer keeps the table it opened with after the selection goes back to the CPU's. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <dirent.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ops.h"
#include "bf16.h"
#include "runtime/model/alloc.h"
#include "runtime/model/weights.h"
#include "runtime/state/ckpt.h"
#include "runtime/train/train.h"
#include "runtime_fixture.h"

static char msg[512];

/* One counter per entry of the table, made from its list (ops_list.h): an entry added there
 * is counted and forwarded here with no change to this file. */
enum entry {
#define KERNEL_OP(ret, op, params, args) ENTRY_##op,
#include "ops_list.h"
  N_ENTRIES
};

static const char *const entry_names[N_ENTRIES] = {
#define KERNEL_OP(ret, op, params, args) #op,
#include "ops_list.h"
};

/* The counting backend's context: the calls per entry and the table and context it wraps. */
struct counter {
  long calls[N_ENTRIES];
  const struct kernel_ops *inner;
  void *inner_ctx;
};

static const struct counter *count(void *ctx, enum entry e)
{
  struct counter *c = ctx;
  c->calls[e]++;
  return c;
}

/* Each kernel: counted, then the wrapped table's entry with its context. */
#define KERNEL_BACKEND(ret, op, params, args)
#define KERNEL_OP(ret, op, params, args)                                                          \
  static ret counted_##op(void *ctx, KERNEL_UNPACK params)                                      \
  {                                                                                               \
    const struct counter *c = count(ctx, ENTRY_##op);                                             \
    KERNEL_RETURN(ret) c->inner->op(c->inner_ctx, KERNEL_UNPACK args);                            \
  }
#include "ops_list.h"

/* The memory entries pass through to the CPU's. The table is host-visible, so the allocator
 * bills its memory as the host's and takes it from the host allocator: mem_alloc and mem_free
 * are there for completeness and are not expected to be called. */
static void *counted_mem_alloc(void *ctx, size_t n_bytes)
{
  const struct counter *c = count(ctx, ENTRY_mem_alloc);
  return c->inner->mem_alloc(c->inner_ctx, n_bytes);
}

static void counted_mem_free(void *ctx, void *block)
{
  const struct counter *c = count(ctx, ENTRY_mem_free);
  c->inner->mem_free(c->inner_ctx, block);
}

static void counted_copy(void *ctx, void *dst, const void *src, size_t n_bytes)
{
  const struct counter *c = count(ctx, ENTRY_copy);
  c->inner->copy(c->inner_ctx, dst, src, n_bytes);
}

static void counted_copy_rows(void *ctx, void *dst, size_t dst_pitch, const void *src,
                              size_t src_pitch, size_t row_bytes, size_t n_rows)
{
  const struct counter *c = count(ctx, ENTRY_copy_rows);
  c->inner->copy_rows(c->inner_ctx, dst, dst_pitch, src, src_pitch, row_bytes, n_rows);
}

static void counted_zero(void *ctx, void *dst, size_t n_bytes)
{
  const struct counter *c = count(ctx, ENTRY_zero);
  c->inner->zero(c->inner_ctx, dst, n_bytes);
}

static void counted_to_host(void *ctx, void *host, const void *src, size_t n_bytes)
{
  const struct counter *c = count(ctx, ENTRY_to_host);
  c->inner->to_host(c->inner_ctx, host, src, n_bytes);
}

static void counted_from_host(void *ctx, void *dst, const void *host, size_t n_bytes)
{
  const struct counter *c = count(ctx, ENTRY_from_host);
  c->inner->from_host(c->inner_ctx, dst, host, n_bytes);
}

/* The status entry: the wrapped table's, unless the test makes a failure pending (as a GPU's
 * asynchronous fault is: every later ask reports it). */
static int status_failing;
static const char status_failure[] = "counting.cu:42: kernel fault: an illegal memory access was encountered";

static int counted_status(void *ctx, char *emsg, size_t emsg_size)
{
  const struct counter *c = count(ctx, ENTRY_status);
  if (status_failing) {
    snprintf(emsg, emsg_size, "%s", status_failure);
    return -1;
  }
  return c->inner->status(c->inner_ctx, emsg, emsg_size);
}

static const struct kernel_ops counting_ops = {
  .name = "counting",
  .compute_dtype = REAL_TENSOR_DTYPE,
  .host_visible = 1,
#define KERNEL_OP(ret, op, params, args) .op = counted_##op,
#include "ops_list.h"
};

/* Entries a one-rank run on a host-visible table need not call: the vocabulary-shard ones and
 * copy_rows (tensor parallelism's splits and gathers only), mem_alloc/mem_free (a
 * host-visible backend's memory is the host allocator's). */
/* Entries a step does not call: those of the other precision, the TP shard entries, and the
 * SwiGLU, RoPE and attention of separate gate, up, q, k and v (this plan runs them as one
 * product each: model_gate_up_fused, model_qkv_fused; the tensor-parallel and ZeRO-3
 * equivalence runs take the other path). */
static int uncounted_entry(enum entry e, int lowp, int moe)
{
  if (e >= ENTRY_moe_router_forward && e <= ENTRY_moe_router_backward)
    return !moe; /* a dense model has no router */
  const int bf16_entry = e == ENTRY_round_bf16 || e == ENTRY_linear_forward_bf16 ||
                         e == ENTRY_linear_backward_bf16 || e == ENTRY_rmsnorm_forward_bf16 ||
                         e == ENTRY_swiglu_forward_rows_bf16 || e == ENTRY_adamw_update_bf16 ||
                         e == ENTRY_attention_scratch_n_elems_bf16 || e == ENTRY_attention_forward_qkv_bf16 ||
                         e == ENTRY_attention_backward_qkv_bf16 || e == ENTRY_widen_bf16 ||
                         e == ENTRY_encoder_forward_bf16;
  /* bf16: every weight read from its copy, every parameter's copy written by AdamW */
  const int fp32_only = e == ENTRY_encoder_forward || e == ENTRY_adamw_update ||
                        e == ENTRY_linear_forward || e == ENTRY_linear_backward ||
                        e == ENTRY_rmsnorm_forward || e == ENTRY_swiglu_forward_rows ||
                        e == ENTRY_attention_scratch_n_elems || e == ENTRY_attention_forward_qkv ||
                        e == ENTRY_attention_backward_qkv;
  if (lowp ? fp32_only : bf16_entry)
    return 1;
  if (e == ENTRY_linear_forward_acc || e == ENTRY_linear_forward_acc_bf16)
    return 1; /* the residual folded into o's and down's products runs without dropout only */
  if (e == ENTRY_swiglu_forward || e == ENTRY_swiglu_backward || e == ENTRY_swiglu_forward_bf16 ||
      e == ENTRY_rope_forward || e == ENTRY_rope_backward || e == ENTRY_attention_forward ||
      e == ENTRY_attention_backward || e == ENTRY_attention_forward_bf16 || e == ENTRY_attention_backward_bf16)
    return 1;
  if (e == ENTRY_mem_alloc || e == ENTRY_mem_free || e == ENTRY_copy_rows)
    return 1;
  if (e >= ENTRY_attention_cp_scratch_n_elems && e <= ENTRY_attention_cp_backward)
    return 1; /* context parallelism's ring only */
  if (e == ENTRY_accumulate_bf16)
    return 1; /* precision.grads = "bf16" under ZeRO 2 and 3 only (mpi_dp_equiv.bf16_grads_*) */
  return e == ENTRY_encoder_forward_shard || e == ENTRY_encoder_backward_shard ||
         e == ENTRY_crossentropy_shard_max || e == ENTRY_crossentropy_shard_sums ||
         e == ENTRY_crossentropy_shard_finish || e == ENTRY_crossentropy_shard_backward;
}

static void tiny_plan(struct plan *p)
{
  struct fixture_shape s = { 2, 32, 4, 2, 64, 64, 16, 4, 2 };
  fixture_plan(p, s);
  p->model.dropout = 0.1;
  p->optimizer.grad_clip = 1e-3; /* below any gradient norm here: clipping scales */
}

static void counted_steps(int lowp, int moe)
{
  struct plan p;
  tiny_plan(&p);
  if (moe) { /* layer 1 sparse: 4 experts, top 2, at capacity (some assignments drop) */
    p.model.moe = (struct plan_moe){ .experts = 4, .top_k = 2, .ffn_dim = 24, .aux_loss = 0.01,
                                     .z_loss = 1e-3, .capacity_factor = 1.0, .n_layers = 1 };
    if (!p.layers) /* the fixture's plan has no layer table: all zero is every default */
      p.layers = calloc((size_t)p.model.n_layers, sizeof *p.layers);
    p.layers[1].moe = 1;
  }
  if (lowp)
    p.precision.compute = PLAN_BF16;
  const enum entry linear = lowp ? ENTRY_linear_forward_bf16 : ENTRY_linear_forward;
  struct train_step_stats cpu[2], counted[2];
  struct trainer a, b;

  CHECK(kernels_active() == &kernel_ops_cpu && kernels_active_context() == NULL);
  CHECK_MSG(trainer_open(&a, &p, NULL, msg, sizeof msg) == TRAIN_OK, "%s", msg);
  CHECK(a.model.k == &kernel_ops_cpu);
  for (int s = 0; s < 2; s++) CHECK_MSG(trainer_step(&a, &cpu[s], msg, sizeof msg) == 0, "%s", msg);

  struct counter c = { { 0 }, &kernel_ops_cpu, NULL };
  kernels_use(&counting_ops, &c);
  CHECK(kernels_active() == &counting_ops && kernels_active_context() == &c);
  CHECK_MSG(trainer_open(&b, &p, NULL, msg, sizeof msg) == TRAIN_OK, "%s", msg);
  CHECK(b.model.k == &counting_ops && b.model.kctx == &c);
  CHECK_MSG(trainer_step(&b, &counted[0], msg, sizeof msg) == 0, "%s", msg);
  /* Back to the CPU table: the trainer already open keeps the table it captured. */
  kernels_use(NULL, NULL);
  CHECK(kernels_active() == &kernel_ops_cpu && kernels_active_context() == NULL);
  const long after_one = c.calls[linear];
  CHECK_MSG(trainer_step(&b, &counted[1], msg, sizeof msg) == 0, "%s", msg);
  CHECK(after_one > 0 && c.calls[linear] == 2 * after_one);

  /* The same kernels on the same buffers in the same order: equal bits, not merely close. */
  for (int s = 0; s < 2; s++) {
    CHECK_MSG(memcmp(&cpu[s].loss, &counted[s].loss, sizeof(double)) == 0,
              "step %d: loss %.17g on the CPU table, %.17g counted", s, cpu[s].loss,
              counted[s].loss);
    CHECK_MSG(memcmp(&cpu[s].grad_norm, &counted[s].grad_norm, sizeof(double)) == 0,
              "step %d: norm %.17g vs %.17g", s, cpu[s].grad_norm, counted[s].grad_norm);
    CHECK(cpu[s].grad_norm > p.optimizer.grad_clip); /* clipping had work to do */
  }
  CHECK(fixture_params_equal(&a.model, &b.model));
  CHECK(cpu[0].loss > 3.0 && cpu[0].loss < 5.0); /* near ln 64: a real forward ran */

  for (int e = 0; e < N_ENTRIES; e++) {
    printf("%-28s %ld\n", entry_names[e], c.calls[e]);
    if (!uncounted_entry((enum entry)e, lowp, moe))
      CHECK_MSG(c.calls[e] > 0, "%s: no call through the table", entry_names[e]);
  }
  trainer_close(&a);
  trainer_close(&b);
}

static void a_counting_table_sees_every_kernel_call_and_the_same_bits(void)
{
  counted_steps(0, 0);
}

/* A model with a sparse layer: the router, routing, dispatch and combine go through the table. */
static void a_sparse_layer_computes_through_the_table_too(void)
{
  counted_steps(0, 1);
}

/* The same in bf16 compute: every bf16 entry goes through the table, none of the fp32 products. */
static void bf16_steps_go_through_the_table_too(void)
{
  if (REAL_IS_DOUBLE) { /* no bf16 compute in the float64 build: the table has no bf16 entries */
    CHECK(kernel_ops_cpu.linear_forward_bf16 == NULL);
    printf("no bf16 compute in this build\n");
    return;
  }
  counted_steps(1, 0); /* oneDNN's products or the widened ones, through the table alike */
}

static void kernels_use_null_goes_back_to_the_cpu_table(void)
{
  const struct kernel_ops *t = &kernel_ops_cpu;
  CHECK(strcmp(t->name, "cpu") == 0);
  CHECK(t->host_visible == 1);
  /* every entry set (the bf16 ones NULL in the float64 build) */
#define KERNEL_OP(ret, op, params, args) CHECK_MSG(t->op != NULL, "%s", #op);
#if REAL_IS_DOUBLE
#define KERNEL_OP_BF16(ret, op, params, args) CHECK_MSG(t->op == NULL, "%s", #op);
#endif
#include "ops_list.h"
  struct counter c = { { 0 }, &kernel_ops_cpu, NULL };
  kernels_use(&counting_ops, &c);
  CHECK(kernels_active() == &counting_ops);
  kernels_use(NULL, &c); /* the default's context is NULL, whatever was passed */
  CHECK(kernels_active() == &kernel_ops_cpu && kernels_active_context() == NULL);
  kernels_use(&kernel_ops_cpu, NULL);
  CHECK(kernels_active() == &kernel_ops_cpu && kernels_active_context() == NULL);

  /* A model made now captures the CPU table. */
  struct plan p;
  tiny_plan(&p);
  struct model m;
  CHECK_MSG(model_create(&m, &p.model, msg, sizeof msg) == 0, "%s", msg);
  CHECK(m.k == &kernel_ops_cpu && m.kctx == NULL);
  model_free(&m);
}

/* A table whose buffers are of another element type than this build's tensors is refused when a
 * model is made from it, naming both types, instead of computing on misread memory. */
static void a_table_of_another_element_type_is_refused(void)
{
  struct kernel_ops other = kernel_ops_cpu;
  other.name = "bf16-test";
  other.compute_dtype = TENSOR_BF16;
  struct plan p;
  tiny_plan(&p);
  struct trainer t;
  kernels_use(&other, NULL);
  const int rc = trainer_open(&t, &p, NULL, msg, sizeof msg);
  kernels_use(NULL, NULL);
  CHECK(rc == TRAIN_RUNTIME_ERROR);
  CHECK_STR_CONTAINS(msg, "the bf16-test kernel table computes in BF16; this build's tensors are ");
  CHECK_STR_CONTAINS(msg, tensor_dtype_name(REAL_TENSOR_DTYPE));
  /* and the tensors of a model say what they hold and where */
  struct model m;
  CHECK_MSG(model_create(&m, &p.model, msg, sizeof msg) == 0, "%s", msg);
  for (int i = 0; i < m.n_params; i++)
    CHECK(m.params[i].dtype == REAL_TENSOR_DTYPE && m.params[i].device == ALLOC_HOST);
  model_free(&m);
}

/* A failure the backend reports only through its status entry (a GPU's asynchronous fault)
 * stops training at the step whose check sees it: that step fails with the backend's message,
 * hands out no loss or norm, its update is not applied and the step count stays; the steps
 * before it are the CPU's. The runtime asks at least once per step. */
static void a_pending_backend_failure_stops_the_step_that_sees_it(void)
{
  struct plan p;
  tiny_plan(&p);
  struct train_step_stats st;
  struct trainer a, b;
  CHECK_MSG(trainer_open(&a, &p, NULL, msg, sizeof msg) == TRAIN_OK, "%s", msg);
  for (int s = 0; s < 2; s++) CHECK_MSG(trainer_step(&a, &st, msg, sizeof msg) == 0, "%s", msg);

  struct counter c = { { 0 }, &kernel_ops_cpu, NULL };
  kernels_use(&counting_ops, &c);
  CHECK_MSG(trainer_open(&b, &p, NULL, msg, sizeof msg) == TRAIN_OK, "%s", msg);
  kernels_use(NULL, NULL);
  for (int s = 0; s < 2; s++) CHECK_MSG(trainer_step(&b, &st, msg, sizeof msg) == 0, "%s", msg);
  CHECK(c.calls[ENTRY_status] >= 2);
  const long updates = c.calls[ENTRY_adamw_update];
  msg[0] = '\0';
  status_failing = 1; /* pending from the third step on */
  CHECK(trainer_step(&b, &st, msg, sizeof msg) != 0);
  CHECK_MSG(strcmp(msg, "step 3: counting.cu:42: kernel fault: an illegal memory access was encountered") == 0,
            "%s", msg);
  CHECK_MSG(st.loss == 0.0 && st.grad_norm == 0.0, "the failed step handed out loss %g, norm %g", st.loss,
            st.grad_norm); /* read back after the failure: not handed out */
  CHECK(b.step == 2);
  CHECK(c.calls[ENTRY_adamw_update] == updates); /* no update after the check */
  CHECK(fixture_params_equal(&a.model, &b.model)); /* the weights of two steps */
  /* a forward-backward alone hands out no loss either, and says why */
  trainer_clear_error(&b);
  const double loss = trainer_forward_backward(&b);
  CHECK_MSG(isnan(loss), "forward-backward on a failed backend returned loss %g", loss);
  CHECK(trainer_failed(&b) && strcmp(trainer_failed(&b), status_failure) == 0);
  status_failing = 0;
  trainer_close(&a);
  trainer_close(&b);
}

/* Entries of a folder but . and ..; -1 when it cannot be listed. */
static int folder_entries(const char *path)
{
  DIR *d = opendir(path);
  if (!d)
    return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

/* Nothing leaves the device while its backend holds a failure: a checkpoint save and an export
 * fail with the backend's message and write nothing (no step folder, no .tmp, no file), where the
 * same trainer saves and exports once the failure is gone. */
static void a_pending_backend_failure_fails_a_save_and_an_export_writing_nothing(void)
{
  struct plan p;
  tiny_plan(&p);
  p.train.eval_batches = 1;
  p.layers = calloc((size_t)p.model.n_layers, sizeof *p.layers); /* the manifest's plan hash reads it */
  struct train_step_stats st;
  struct trainer b;
  struct counter c = { { 0 }, &kernel_ops_cpu, NULL };
  kernels_use(&counting_ops, &c);
  CHECK_MSG(trainer_open(&b, &p, NULL, msg, sizeof msg) == TRAIN_OK, "%s", msg);
  kernels_use(NULL, NULL);
  CHECK_MSG(trainer_step(&b, &st, msg, sizeof msg) == 0, "%s", msg);

  char dir[] = "/tmp/tycho-kb-XXXXXX", ckdir[64], file[96], want[512];
  CHECK(mkdtemp(dir) != NULL);
  snprintf(ckdir, sizeof ckdir, "%s/ck", dir);
  snprintf(file, sizeof file, "%s/model.safetensors", dir);
  const char *first = b.model.params[0].name;
  status_failing = 1;
  msg[0] = '\0';
  CHECK(ckpt_save(&b, ckdir, 1, 2, msg, sizeof msg) != 0);
  snprintf(want, sizeof want, "checkpoint: the param piece of %s for %s/step_00000001.tmp/rank_00000.bin: %s",
           first, ckdir, status_failure);
  CHECK_MSG(strcmp(msg, want) == 0, "%s", msg);
  CHECK_MSG(folder_entries(ckdir) == 0, "%d entries left in %s", folder_entries(ckdir), ckdir);
  msg[0] = '\0';
  CHECK(weights_export(&b.model, file, msg, sizeof msg) != 0);
  snprintf(want, sizeof want, "export %s: '%s': %s", file, first, status_failure);
  CHECK_MSG(strcmp(msg, want) == 0, "%s", msg);
  CHECK(access(file, F_OK) != 0);
  struct train_eval_stats ev;
  trainer_eval(&b, &ev);
  CHECK(trainer_failed(&b) && strcmp(trainer_failed(&b), status_failure) == 0);
  CHECK(!ev.has_val_loss && ev.val_loss == 0.0 && !ev.has_accuracy);
  trainer_clear_error(&b);

  status_failing = 0; /* the same calls succeed without the failure */
  CHECK_MSG(ckpt_save(&b, ckdir, 1, 2, msg, sizeof msg) == 0, "%s", msg);
  CHECK(folder_entries(ckdir) == 1);
  CHECK_MSG(weights_export(&b.model, file, msg, sizeof msg) == 0, "%s", msg);
  CHECK(access(file, F_OK) == 0);
  trainer_close(&b);
  char rm[128];
  snprintf(rm, sizeof rm, "rm -rf %s", dir);
  CHECK(system(rm) == 0);
}

TEST_MAIN(TEST(a_counting_table_sees_every_kernel_call_and_the_same_bits),
          TEST(a_sparse_layer_computes_through_the_table_too), TEST(bf16_steps_go_through_the_table_too),
          TEST(a_table_of_another_element_type_is_refused),
          TEST(kernels_use_null_goes_back_to_the_cpu_table),
          TEST(a_pending_backend_failure_stops_the_step_that_sees_it),
          TEST(a_pending_backend_failure_fails_a_save_and_an_export_writing_nothing))
