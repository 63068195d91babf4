/* Device memory as the runtime holds it, on a backend whose memory is not the host's: the
 * allocator's cache (alloc.h, "The cache") and the memory bill of a device plan (bill.h).
 *
 * counting_ops is kernel_ops_cpu with host_visible = 0 (the runtime stages through to_host and
 * from_host, and gives the table a device of its own in the allocator) and memory entries that
 * count their calls and can fail an allocation on demand, as a GPU that runs out would.
 *
 * The tests: over 6 steps of a tiny ZeRO-3 plan (which gathers and frees parameter units, and
 * allocates and frees gradient buckets and reduce-scatter outputs, every step) the backend's
 * mem_alloc and mem_free are not called once the first steps have filled the cache, and the
 * steps give the CPU trainer's bits (a reused block is zeroed as a fresh one is); an allocation
 * the backend fails once gives the whole cache back and succeeds on the retry; closing the
 * trainer gives every block back (as many frees as allocations). And the bill of a device = "cuda"
 * plan puts on the device exactly the activations and workspace the runtime allocates there for
 * it, in the kernels' element sizes, and the batch's ids on the host, in fp32 and in the bf16
 * mode (whose weight copies the model keeps on the device). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ops.h"
#include "layout/bill.h"
#include "runtime/model/alloc.h"
#include "runtime/model/backend.h"
#include "runtime/model/model.h"
#include "runtime/train/train.h"
#include "runtime_fixture.h"
#ifdef TYCHO_HAVE_CUDA_BACKEND
#include "cuda/cuda_backend.h"
#endif

static char ebuf[512];

static struct {
  long allocs, frees, failed; /* successful mem_alloc calls, mem_free calls, refused mem_alloc calls */
  long fail_next;             /* mem_alloc calls still to refuse */
  long live;
} counts;

static void *counting_mem_alloc(void *ctx, size_t n_bytes)
{
  (void)ctx;
  if (counts.fail_next > 0) {
    counts.fail_next--;
    counts.failed++;
    return NULL;
  }
  void *p = kernel_ops_cpu.mem_alloc(NULL, n_bytes);
  if (p) {
    counts.allocs++;
    counts.live++;
  }
  return p;
}

static void counting_mem_free(void *ctx, void *block)
{
  (void)ctx;
  if (!block)
    return;
  counts.frees++;
  counts.live--;
  kernel_ops_cpu.mem_free(NULL, block);
}

static struct kernel_ops counting_ops;
static int counting_ctx; /* the table's context: only its address matters (the allocator's device) */

static int use_counting(void)
{
  counting_ops = kernel_ops_cpu;
  counting_ops.name = "counting";
  counting_ops.host_visible = 0;
  counting_ops.mem_alloc = counting_mem_alloc;
  counting_ops.mem_free = counting_mem_free;
  return runtime_use_backend(&counting_ops, &counting_ctx);
}

static void tiny_plan(struct plan *p, int zero)
{
  struct fixture_shape s = { 2, 32, 4, 2, 64, 64, 16, 4, 2 };
  fixture_plan(p, s);
  p->zero = zero;
  p->layers = calloc((size_t)p->model.n_layers, sizeof *p->layers);
}

static int same_step(const struct train_step_stats *x, const struct train_step_stats *y, int s)
{
  int ok = memcmp(&x->loss, &y->loss, sizeof(double)) == 0 &&
           memcmp(&x->grad_norm, &y->grad_norm, sizeof(double)) == 0 && x->step == y->step;
  if (!ok)
    fprintf(stderr, "  step %d: loss %.17g / %.17g, norm %.17g / %.17g\n", s, x->loss, y->loss, x->grad_norm,
            y->grad_norm);
  return ok;
}

/* The steady state allocates nothing on the device, a failed allocation gives the cache back and
 * is retried, and close gives everything back. */
static void the_step_reuses_device_blocks(void)
{
  enum { STEPS = 6 };
  struct plan p;
  tiny_plan(&p, 3);
  struct trainer a, b;
  struct train_step_stats cpu[STEPS], dev[STEPS];
  CHECK(runtime_use_backend(NULL, NULL) == 0);
  CHECK_MSG(trainer_open(&a, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  for (int s = 0; s < STEPS; s++) CHECK_MSG(trainer_step(&a, &cpu[s], ebuf, sizeof ebuf) == 0, "%s", ebuf);
  trainer_close(&a);

  memset(&counts, 0, sizeof counts);
  CHECK(use_counting() == 0);
  const int device = alloc_current_device();
  CHECK_MSG(trainer_open(&b, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  CHECK(runtime_use_backend(NULL, NULL) == 0);
  printf("after open: mem_alloc %ld, mem_free %ld\n", counts.allocs, counts.frees);
  long allocs[5], frees[5];
  for (int s = 0; s < 5; s++) {
    CHECK_MSG(trainer_step(&b, &dev[s], ebuf, sizeof ebuf) == 0, "%s", ebuf);
    allocs[s] = counts.allocs;
    frees[s] = counts.frees;
    printf("after step %d: mem_alloc %ld, mem_free %ld, %zu blocks live\n", s + 1, allocs[s], frees[s],
           alloc_device_bill(device)->n_live);
  }
  /* From step 2 on the cache has every size a step asks for: no call reaches the device. */
  for (int s = 2; s < 5; s++)
    CHECK_MSG(allocs[s] == allocs[1] && frees[s] == frees[1], "step %d: mem_alloc %ld (%ld after step 2), "
              "mem_free %ld (%ld after step 2)", s + 1, allocs[s], allocs[1], frees[s], frees[1]);

  /* Between steps the cache holds ZeRO-3's units, buckets and outputs, idle. An allocation the
   * device refuses once gives them all back and is retried. */
  size_t n_idle = 0, idle_bytes = 0;
  CHECK(alloc_device_cache(device, &n_idle, &idle_bytes) == 0);
  CHECK_MSG(n_idle > 0 && idle_bytes > 0, "%zu idle blocks, %zu bytes", n_idle, idle_bytes);
  CHECK(idle_bytes % ALLOC_CLASS_BYTES == 0);
  const long frees0 = counts.frees, allocs0 = counts.allocs;
  counts.fail_next = 1;
  void *odd = alloc_bytes_on(device, ALLOC_WORKSPACE, 3 * 1000 * 1000 + 7); /* a size no step asks for */
  CHECK(odd != NULL && alloc_device_of(odd) == device);
  CHECK(counts.failed == 1 && counts.fail_next == 0);
  CHECK_MSG(counts.frees == frees0 + (long)n_idle, "mem_free %ld, expected %ld + %zu idle blocks", counts.frees,
            frees0, n_idle);
  CHECK(counts.allocs == allocs0 + 1);
  CHECK(alloc_device_cache(device, &n_idle, &idle_bytes) == 0 && n_idle == 0 && idle_bytes == 0);
  alloc_free(odd); /* into the cache: live blocks remain (the trainer's) */
  CHECK(alloc_device_cache(device, &n_idle, &idle_bytes) == 0 && n_idle == 1);
  /* ... and the step after that refills the cache and gives the same bits */
  CHECK_MSG(trainer_step(&b, &dev[5], ebuf, sizeof ebuf) == 0, "%s", ebuf);
  for (int s = 0; s < STEPS; s++) CHECK(same_step(&cpu[s], &dev[s], s));

  trainer_close(&b);
  CHECK_MSG(counts.allocs == counts.frees && counts.live == 0, "close: %ld allocations, %ld frees",
            counts.allocs, counts.frees);
  CHECK(alloc_device_bill(device)->n_live == 0 && alloc_device_bill(device)->total_bytes == 0);
  CHECK(alloc_device_cache(device, &n_idle, &idle_bytes) == 0 && n_idle == 0 && idle_bytes == 0);
  plan_free(&p);
}

/* The bill of a device plan (device = "cuda", fp32: its element sizes, its host memory apart)
 * against what the runtime allocates for that plan on a device whose memory is not the host's: a
 * model of the plan and its activations made there hold exactly the activations and the workspace
 * the bill puts on the device, and the batch's ids are the host's part. (A bf16 cuda plan is
 * refused by the runtime until the GPU keeps bf16 weight copies: its bill is the plan's.) */
static void the_device_bill_is_what_the_device_holds(void)
{
  struct plan gpu;
  tiny_plan(&gpu, 0);
  gpu.device = PLAN_DEVICE_CUDA;
  for (int lowp = 0; lowp < 2; lowp++) { /* fp32, then the bf16 mode (the CPU's, on the device) */
    gpu.precision.compute = lowp ? PLAN_BF16 : PLAN_FP32;
    /* billed with the device table selected, as the trainer bills its plan (the attention's
     * scratch is the selected table's size) */
    if (!REAL_IS_DOUBLE)
      CHECK(use_counting() == 0);
    struct bill bill;
    CHECK_MSG(bill_predict(&gpu, 0, &bill, ebuf, sizeof ebuf) == 0, "%s", ebuf);
    /* host memory: the batch (inputs, targets: ints; a sample index per row), nothing else here */
    const double batch =
      2.0 * gpu.batch.micro * gpu.batch.seq * sizeof(int) + (double)gpu.batch.micro * sizeof(uint64_t);
    CHECK(bill.host[ALLOC_WORKSPACE] == batch && bill.host_total == batch);
    for (int k = 0; k < ALLOC_N_CATEGORIES; k++) CHECK(k == ALLOC_WORKSPACE || bill.host[k] == 0);
    if (REAL_IS_DOUBLE) /* the CUDA runtime is the fp32 build's: this build does not keep its sizes */
      continue;
    const int device = alloc_current_device();
    alloc_reset_peaks(); /* the device's, which held the test before's */
    struct model m;
    struct model_acts acts;
    CHECK_MSG(model_create_table_tp(&m, &gpu, NULL, 0, 0, ebuf, sizeof ebuf) == 0, "%s", ebuf);
    CHECK_MSG(model_acts_create(&acts, &m, gpu.batch.micro, gpu.batch.seq, ebuf, sizeof ebuf) == 0, "%s", ebuf);
    /* the bf16 mode keeps bf16 copies of the matmul weights on the device, billed with the params */
    CHECK(m.bf16 == lowp && (m.n_bf16 > 0) == lowp);
    if (lowp) {
      const size_t before = alloc_device_bill(device)->n_bytes[ALLOC_PARAMS];
      CHECK_MSG(model_bf16_alloc(&m) == 0, "no room for the bf16 copies");
      CHECK(alloc_device_bill(device)->n_bytes[ALLOC_PARAMS] - before == m.n_bf16 * sizeof(bf16));
    }
    CHECK(runtime_use_backend(NULL, NULL) == 0);
    const struct alloc_bill *d = alloc_device_bill(device);
    static const enum alloc_category laid_out[] = { ALLOC_ACTIVATIONS, ALLOC_WORKSPACE };
    for (int i = 0; i < 2; i++) {
      const enum alloc_category c = laid_out[i];
      CHECK_MSG(bill.bytes[c] - bill.host[c] == (double)d->n_bytes[c],
                "%s (%s): billed on the device %.0f bytes, the device holds %zu", alloc_category_name(c),
                lowp ? "bf16" : "fp32", bill.bytes[c] - bill.host[c], d->n_bytes[c]);
    }
    model_acts_free(&acts);
    model_free(&m);
    CHECK(d->n_live == 0 && counts.live == 0);
#ifdef TYCHO_HAVE_CUDA_BACKEND
    /* `tycho check` (the CPU's table selected) bills a cuda plan's attention scratch at the CUDA
     * table's size, not the CPU's */
    struct bill checked;
    CHECK_MSG(bill_predict(&gpu, 0, &checked, ebuf, sizeof ebuf) == 0, "%s", ebuf);
    const int B = gpu.batch.micro, T = gpu.batch.seq, NH = gpu.model.n_heads, HS = gpu.model.dim / NH;
    /* (the CPU's bf16 mode packs its attention's bf16 operands in its scratch; the CUDA table has
     * no bf16 attention entries, so its bf16 mode bills the fp32 scratch) */
    CHECK(kernel_ops_cuda.attention_scratch_n_elems_bf16 == NULL && kernel_ops_cuda.attention_forward_bf16 == NULL);
    const double cpu_scratch = (double)(lowp ? kernel_ops_cpu.attention_scratch_n_elems_bf16
                                             : kernel_ops_cpu.attention_scratch_n_elems)(NULL, B, T, NH, NH, HS);
    const double extra = ((double)kernel_ops_cuda.attention_scratch_n_elems(NULL, B, T, NH, NH, HS) - cpu_scratch) *
                         sizeof(float);
    CHECK_MSG(checked.bytes[ALLOC_WORKSPACE] - bill.bytes[ALLOC_WORKSPACE] == extra,
              "workspace billed by check %.0f, with the device table %.0f: %.0f apart, the tables' scratch %.0f",
              checked.bytes[ALLOC_WORKSPACE], bill.bytes[ALLOC_WORKSPACE],
              checked.bytes[ALLOC_WORKSPACE] - bill.bytes[ALLOC_WORKSPACE], extra);
#endif
  }
  plan_free(&gpu);
}

TEST_MAIN(TEST(the_step_reuses_device_blocks), TEST(the_device_bill_is_what_the_device_holds))
