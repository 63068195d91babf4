/* A backend whose memory the host cannot touch: the proof that the runtime reaches tensor memory
 * only through the kernel table's memory entries (kernels/ops.h, host/runtime/model/hostview.h).
 *
 * untouchable_ops (untouchable.h, shared with the multi-rank test of staged comm) wraps
 * kernel_ops_cpu with host_visible = 0. Its memory is one arena reserved
 * with mmap(PROT_NONE, MAP_NORESERVE) and handed out by bump allocation, 64-byte aligned, never
 * reused (so every block is zero, as mem_alloc must give it). While no entry of the table runs,
 * the used part of the arena is PROT_NONE: host code that reads or writes device memory directly
 * faults, and the SIGSEGV handler names the arena offset (and the block) and prints a backtrace
 * before _exit(1), so a stray host touch is a clear failure with the code that did it. Each entry
 * (every kernel, and copy, copy_rows, zero, to_host, from_host) makes the used arena readable and
 * writable, calls the CPU's entry and makes it PROT_NONE again (the protection is process-wide,
 * so the kernels' OpenMP and OpenBLAS threads inside the call are covered). Each entry also
 * records a pointer argument that is not device memory (a kernel handed a host array, a to_host
 * whose source is not on the device): the host cannot touch the device, nor can the device touch
 * the host.
 *
 * The tests: the protection itself works (a forked child that dereferences a block dies with the
 * message; the copy entries move bytes through it); a tiny plan (2 layers, dropout 0.1,
 * 2 micro-batches, clipping on) trains on the untouchable backend to the very bits of the CPU's
 * (losses, norms, parameters read back through hostview), with every block of the trainer
 * billed to the untouchable device and given back at close; evaluation, a checkpoint saved and
 * loaded into a fresh trainer that goes on training, and the exported weights, all equal to the
 * CPU's, byte for byte; a whole run (train_run: evaluation, metrics, checkpoints every 2 steps,
 * export) and its resumption, whose files are the CPU run's bytes; and weights loaded with
 * init.from onto the device, equal to the CPU's and training on to the same bits. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#if defined(__has_include)
#if __has_include(<execinfo.h>)
#include <execinfo.h>
#define HAVE_BACKTRACE 1
#endif
#endif

#include "bf16.h"
#include "check.h"
#include "ops.h"
#include "runtime/model/alloc.h"
#include "runtime/model/backend.h"
#include "runtime/state/ckpt.h"
#include "runtime/model/hostview.h"
#include "runtime/train/train.h"
#include "runtime/model/weights.h"
#include "runtime_fixture.h"

static char ebuf[512];

#include "untouchable.h"

/* ---- helpers ---- */

static void tiny_plan(struct plan *p)
{
  struct fixture_shape s = { 2, 32, 4, 2, 64, 64, 16, 4, 2 };
  fixture_plan(p, s);
  p->model.dropout = 0.1;
  p->optimizer.grad_clip = 1e-3; /* below any gradient norm here: clipping scales */
  /* The per-layer table the compiler fills (no split, no recompute, every layer on stage 0):
   * the fixture leaves it out, and the checkpoint's plan hash reads it. */
  p->layers = calloc((size_t)p->model.n_layers, sizeof *p->layers);
}

/* The parameters of d (any backend, read through host views) bitwise those of c (the CPU's). */
static int params_equal_through_views(const struct model *c, const struct model *d)
{
  if (c->n_params != d->n_params)
    return 0;
  int equal = 1;
  for (int i = 0; i < c->n_params && equal; i++) {
    const size_t n = c->params[i].n_elems, bytes = n * sizeof(real);
    if (d->params[i].n_elems != n || (c->params[i].data == NULL) != (d->params[i].data == NULL))
      return 0;
    if (!c->params[i].data)
      continue;
    const void *view = hostview_open(d->k, d->kctx, d->params[i].data, bytes, 1);
    if (!view)
      return 0;
    equal = memcmp(view, c->params[i].data, bytes) == 0;
    if (!equal)
      fprintf(stderr, "  parameter %d (%zu elements) differs\n", i, n);
    hostview_close(d->k, d->kctx, d->params[i].data, (void *)view, bytes, 0);
  }
  return equal;
}

static int same_step(const struct train_step_stats *x, const struct train_step_stats *y, int s)
{
  int ok = memcmp(&x->loss, &y->loss, sizeof(double)) == 0 &&
           memcmp(&x->grad_norm, &y->grad_norm, sizeof(double)) == 0 &&
           memcmp(&x->lr, &y->lr, sizeof(double)) == 0 && x->step == y->step;
  if (!ok)
    fprintf(stderr, "  step %d: loss %.17g / %.17g, norm %.17g / %.17g, lr %.17g / %.17g\n", s,
            x->loss, y->loss, x->grad_norm, y->grad_norm, x->lr, y->lr);
  return ok;
}

/* The bytes of a file (malloc'd; *n its size), or NULL. */
static unsigned char *slurp(const char *path, size_t *n)
{
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  unsigned char *buf = NULL;
  size_t size = 0, cap = 0;
  for (;;) {
    if (size == cap) {
      cap = cap ? 2 * cap : 65536;
      unsigned char *b = realloc(buf, cap);
      if (!b) {
        free(buf);
        fclose(f);
        return NULL;
      }
      buf = b;
    }
    size_t got = fread(buf + size, 1, cap - size, f);
    size += got;
    if (got == 0)
      break;
  }
  fclose(f);
  *n = size;
  return buf;
}

static int same_file(const char *x, const char *y)
{
  size_t nx = 0, ny = 0;
  unsigned char *bx = slurp(x, &nx), *by = slurp(y, &ny);
  int same = bx && by && nx == ny && nx > 0 && memcmp(bx, by, nx) == 0;
  if (!same)
    fprintf(stderr, "  %s (%zu bytes) and %s (%zu bytes) differ\n", x, nx, y, ny);
  free(bx);
  free(by);
  return same;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static void remove_tree(const char *dir)
{
  nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- the tests ---- */

/* The protection is real: a child that dereferences a block (reading, then writing) dies with the
 * handler's message naming the block's offset; through the table's entries the same block takes
 * and gives back bytes. */
/* Runs touch(arg) in a forked child with its stderr captured in out (NUL-terminated); the
 * child's wait status, or -1. The child ends with _exit(0) when touch returns. */
static int in_child(void (*touch)(void *), void *arg, char *out, size_t out_size)
{
  int fds[2];
  if (pipe(fds) != 0)
    return -1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    touch(arg);
    _exit(0);
  }
  close(fds[1]);
  size_t n = 0;
  ssize_t got;
  while ((got = read(fds[0], out + n, out_size - 1 - n)) > 0) n += (size_t)got;
  out[n] = '\0';
  close(fds[0]);
  int status = 0;
  return waitpid(pid, &status, 0) == pid ? status : -1;
}

static void read_a_fresh_block(void *arg)
{
  const size_t *offset = arg;
  volatile char *b = untouchable_ops.mem_alloc(&arena, 256);
  if (!b || (size_t)((const char *)b - arena.base) != *offset)
    _exit(3);
  (void)b[100];
}

static void write_a_fresh_block(void *arg)
{
  const size_t *offset = arg;
  volatile char *b = untouchable_ops.mem_alloc(&arena, 256);
  if (!b || (size_t)((const char *)b - arena.base) != *offset)
    _exit(3);
  b[100] = 1;
}

/* The protection is real: a child that dereferences a block (reading, then writing) dies with the
 * handler's message naming the offset; through the table's entries the same kind of block takes
 * and gives back bytes. */
static void host_access_to_the_arena_faults_and_the_entries_do_not(void)
{
  arena_init();
  for (int write_it = 0; write_it < 2; write_it++) {
    size_t offset = arena.used; /* where the child's block will be */
    char out[8192], line[96];
    const int status =
      in_child(write_it ? write_a_fresh_block : read_a_fresh_block, &offset, out, sizeof out);
    CHECK_MSG(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 1,
              "a child %s the arena: status %#x (exit 0: no fault; 3: unexpected block)",
              write_it ? "writing" : "reading", (unsigned)status);
    snprintf(line, sizeof line, "host touched device memory at offset %zu of the arena",
             offset + 100);
    CHECK_STR_CONTAINS(out, line);
    CHECK_STR_CONTAINS(out, "outside every backend call");
  }

  /* The entries themselves: zeroed blocks, 64-byte aligned, unique even when empty; bytes in
   * through from_host, moved with copy and copy_rows, out through to_host. */
  const size_t live_before = arena.live_blocks;
  real *x = untouchable_ops.mem_alloc(&arena, 100 * sizeof(real));
  real *y = untouchable_ops.mem_alloc(&arena, 100 * sizeof(real));
  void *e0 = untouchable_ops.mem_alloc(&arena, 0), *e1 = untouchable_ops.mem_alloc(&arena, 0);
  CHECK(x && y && e0 && e1 && e0 != e1);
  CHECK(((uintptr_t)x | (uintptr_t)y | (uintptr_t)e0 | (uintptr_t)e1) % 64 == 0);
  CHECK(arena.live_blocks == live_before + 4);
  real host[100], back[100];
  untouchable_ops.to_host(&arena, back, x, sizeof back);
  int zero = 1;
  for (int i = 0; i < 100; i++) zero &= back[i] == 0;
  CHECK(zero);
  for (int i = 0; i < 100; i++) host[i] = (real)(i + 1);
  untouchable_ops.from_host(&arena, x, host, sizeof host);
  untouchable_ops.copy(&arena, y, x, sizeof host);
  untouchable_ops.zero(&arena, x, 50 * sizeof(real));
  untouchable_ops.copy_rows(&arena, x, 10 * sizeof(real), y + 5, 10 * sizeof(real),
                            2 * sizeof(real), 5); /* x[10r .. 10r+1] = y[10r+5 .. 10r+6] */
  untouchable_ops.to_host(&arena, back, x, sizeof back);
  int moved = 1;
  for (int i = 0; i < 100; i++) {
    const real want = i < 50 ? (i % 10 < 2 ? (real)(i + 6) : 0) : (real)(i + 1);
    moved &= back[i] == want;
  }
  CHECK(moved);
  CHECK(host_pointer_report() == 0);
  untouchable_ops.mem_free(&arena, x);
  untouchable_ops.mem_free(&arena, y);
  untouchable_ops.mem_free(&arena, e0);
  untouchable_ops.mem_free(&arena, e1);
  CHECK(arena.live_blocks == live_before && arena.bad_frees == 0);
  CHECK(arena.depth == 0);
}

static void compare_directly(void *arg)
{
  const struct model *const *pair = arg;
  volatile int equal = fixture_params_equal(pair[0], pair[1]); /* kept: memcmp is pure */
  (void)equal;
}

static void trains_to_the_cpu_bits_on_memory_the_host_cannot_touch(void)
{
  struct plan p;
  tiny_plan(&p);
  struct train_step_stats cpu[3], dev_stats[3];
  struct trainer a, b;

  CHECK(runtime_use_backend(NULL, NULL) == 0);
  CHECK_MSG(trainer_open(&a, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  for (int s = 0; s < 3; s++) CHECK_MSG(trainer_step(&a, &cpu[s], ebuf, sizeof ebuf) == 0, "%s", ebuf);

  const struct alloc_bill host0 = *alloc_device_bill(ALLOC_HOST);
  CHECK(use_untouchable() == 0);
  const int dev = alloc_current_device();
  CHECK(dev != ALLOC_HOST && dev >= 0);
  CHECK(alloc_device_name(dev) && strcmp(alloc_device_name(dev), "untouchable") == 0);
  CHECK(use_untouchable() == 0 && alloc_current_device() == dev); /* the same device again */
  const long allocs0 = arena.calls[E_mem_alloc];
  CHECK_MSG(trainer_open(&b, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  CHECK(b.model.k == &untouchable_ops && b.model.kctx == &arena && b.model.device == dev);
  for (int i = 0; i < b.model.n_params; i++) /* each tensor says where it lives and what it holds */
    CHECK(b.model.params[i].device == dev && b.model.params[i].dtype == REAL_TENSOR_DTYPE);
  /* Back to the CPU for what comes next: the open trainer keeps its backend. */
  CHECK(runtime_use_backend(NULL, NULL) == 0 && alloc_current_device() == ALLOC_HOST);
  CHECK(alloc_device_bill(dev)->n_live > 0);
  CHECK(arena.live_blocks == alloc_device_bill(dev)->n_live);
  CHECK(arena.calls[E_mem_alloc] > allocs0);
  int params_on_device = alloc_device_of(b.model.param_memory) == dev &&
                         alloc_device_of(b.model.grad_memory) == dev;
  for (int i = 0; i < b.model.n_params; i++)
    if (b.model.params[i].data)
      params_on_device &= on_device(&arena, b.model.params[i].data,
                                    b.model.params[i].n_elems * sizeof(real));
  CHECK(params_on_device);

  for (int s = 0; s < 3; s++)
    CHECK_MSG(trainer_step(&b, &dev_stats[s], ebuf, sizeof ebuf) == 0, "%s", ebuf);
  for (int s = 0; s < 3; s++) {
    CHECK(same_step(&cpu[s], &dev_stats[s], s));
    CHECK(cpu[s].grad_norm > p.optimizer.grad_clip); /* clipping had work to do */
  }
  CHECK(cpu[0].loss > 3.0 && cpu[0].loss < 5.0); /* near ln 64: a real forward ran */
  CHECK(params_equal_through_views(&a.model, &b.model));
  /* ... and host code that compared them directly, as test_kernel_backend can on the CPU, would
   * touch device memory: the trainer's memory really is out of the host's reach. */
  const struct model *pair[2] = { &a.model, &b.model };
  char out[8192];
  const int status = in_child(compare_directly, pair, out, sizeof out);
  CHECK_MSG(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 1,
            "comparing the device trainer's parameters directly: status %#x", (unsigned)status);
  CHECK_STR_CONTAINS(out, "host touched device memory at offset");

  for (int e = 0; e < N_ENTRIES; e++) printf("%-28s %ld\n", entry_names[e], arena.calls[e]);
  /* The host moved bytes in and out through the table, and the device computed. */
  CHECK(arena.calls[E_from_host] > 0 && arena.calls[E_to_host] > 0);
  CHECK(arena.calls[E_linear_forward] > 0 && arena.calls[E_adamw_update] > 0);
  CHECK_MSG(host_pointer_report() == 0, "an entry was handed host memory (listed above)");
  CHECK(arena.depth == 0);

  trainer_close(&b);
  CHECK_MSG(alloc_device_bill(dev)->n_live == 0, "%zu blocks left on the device",
            alloc_device_bill(dev)->n_live);
  CHECK(alloc_device_bill(dev)->total_bytes == 0);
  CHECK(arena.live_blocks == 0 && arena.live_bytes == 0 && arena.bad_frees == 0);
  CHECK_MSG(alloc_device_bill(ALLOC_HOST)->n_live == host0.n_live &&
              alloc_device_bill(ALLOC_HOST)->total_bytes == host0.total_bytes,
            "host bill: %zu blocks, %zu bytes before the device trainer; %zu, %zu after",
            host0.n_live, host0.total_bytes, alloc_device_bill(ALLOC_HOST)->n_live,
            alloc_device_bill(ALLOC_HOST)->total_bytes);
  trainer_close(&a);
  plan_free(&p);
}

/* bf16 compute on the untouchable device: its weight copies, bf16 activations and the products'
 * workspace live there too, the steps and the evaluation give the CPU's bits, and no entry is
 * handed host memory. */
static void bf16_trains_to_the_cpu_bits_on_the_device(void)
{
  if (REAL_IS_DOUBLE) { /* no bf16 compute in the float64 build: the table has no bf16 entries */
    CHECK(kernel_ops_cpu.linear_forward_bf16 == NULL);
    printf("no bf16 compute in this build\n");
    return;
  }
  struct plan p;
  tiny_plan(&p);
  p.precision.compute = PLAN_BF16;
  struct train_step_stats cpu[3], dev_stats[3];
  struct train_eval_stats cpu_eval, dev_eval;
  struct trainer a, b;
  CHECK(runtime_use_backend(NULL, NULL) == 0);
  CHECK_MSG(trainer_open(&a, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  for (int s = 0; s < 3; s++) CHECK_MSG(trainer_step(&a, &cpu[s], ebuf, sizeof ebuf) == 0, "%s", ebuf);
  trainer_eval(&a, &cpu_eval);
  const long calls0[3] = { arena.calls[E_linear_forward_bf16], arena.calls[E_adamw_update_bf16],
                           arena.calls[E_rmsnorm_forward_bf16] };
  CHECK(use_untouchable() == 0);
  const int dev = alloc_current_device();
  CHECK_MSG(trainer_open(&b, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  CHECK(runtime_use_backend(NULL, NULL) == 0);
  CHECK(b.model.bf16 && b.model.bf16_memory && alloc_device_of(b.model.bf16_memory) == dev);
  CHECK(on_device(&arena, b.model.bf16_memory, b.model.n_bf16 * sizeof(bf16)));
  for (int s = 0; s < 3; s++)
    CHECK_MSG(trainer_step(&b, &dev_stats[s], ebuf, sizeof ebuf) == 0, "%s", ebuf);
  trainer_eval(&b, &dev_eval);
  for (int s = 0; s < 3; s++) CHECK(same_step(&cpu[s], &dev_stats[s], s));
  CHECK(memcmp(&cpu_eval.val_loss, &dev_eval.val_loss, sizeof(double)) == 0);
  CHECK(params_equal_through_views(&a.model, &b.model));
  CHECK(arena.calls[E_linear_forward_bf16] > calls0[0] && arena.calls[E_adamw_update_bf16] > calls0[1] &&
        arena.calls[E_rmsnorm_forward_bf16] > calls0[2]);
  CHECK_MSG(host_pointer_report() == 0, "an entry was handed host memory (listed above)");
  trainer_close(&b);
  CHECK(alloc_device_bill(dev)->n_live == 0 && arena.live_blocks == 0);
  trainer_close(&a);
  plan_free(&p);
}

/* Evaluation, a checkpoint saved on the untouchable device and loaded into a fresh trainer there
 * that trains on, and the exported weights: the CPU's, byte for byte. */
static void evaluates_checkpoints_and_exports_as_the_cpu_does(void)
{
  struct plan p;
  tiny_plan(&p);
  p.train.eval_batches = 1; /* a validation loss too, not only the accuracy */
  char root[] = "/tmp/tycho-device-backend-XXXXXX";
  CHECK(mkdtemp(root) != NULL);
  char cpu_dir[600], dev_dir[600], path[1200], path2[1200];
  snprintf(cpu_dir, sizeof cpu_dir, "%s/cpu", root);
  snprintf(dev_dir, sizeof dev_dir, "%s/dev", root);

  /* The CPU: 4 steps uninterrupted; and 2 steps, saved, loaded into a fresh trainer, 2 more. */
  struct train_step_stats full[4], cpu_resumed[2], dev_first[2], dev_resumed[2], scratch;
  struct train_eval_stats cpu_eval, dev_eval;
  struct trainer a, a2, r, b, c;
  CHECK(runtime_use_backend(NULL, NULL) == 0);
  CHECK_MSG(trainer_open(&a, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  for (int s = 0; s < 4; s++) CHECK_MSG(trainer_step(&a, &full[s], ebuf, sizeof ebuf) == 0, "%s", ebuf);
  CHECK_MSG(trainer_open(&a2, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  for (int s = 0; s < 2; s++) CHECK_MSG(trainer_step(&a2, &scratch, ebuf, sizeof ebuf) == 0, "%s", ebuf);
  trainer_eval(&a2, &cpu_eval);
  CHECK_MSG(ckpt_save(&a2, cpu_dir, 2, 1, ebuf, sizeof ebuf) == 0, "%s", ebuf);
  snprintf(path, sizeof path, "%s/model.safetensors", cpu_dir);
  CHECK_MSG(weights_export(&a2.model, path, ebuf, sizeof ebuf) == 0, "%s", ebuf);
  trainer_close(&a2);
  long long step = -1;
  CHECK(ckpt_find_latest(cpu_dir, path, sizeof path, &step, ebuf, sizeof ebuf) == 0 && step == 2);
  CHECK_MSG(trainer_open(&r, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  CHECK_MSG(ckpt_load(&r, path, ebuf, sizeof ebuf) == 0, "%s", ebuf);
  CHECK(r.step == 2);
  for (int s = 0; s < 2; s++)
    CHECK_MSG(trainer_step(&r, &cpu_resumed[s], ebuf, sizeof ebuf) == 0, "%s", ebuf);

  /* The untouchable device: the same. */
  const int live0 = (int)arena.live_blocks;
  CHECK(use_untouchable() == 0);
  const int dev = alloc_current_device();
  CHECK_MSG(trainer_open(&b, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  CHECK(b.model.k == &untouchable_ops && b.model.device == dev);
  for (int s = 0; s < 2; s++)
    CHECK_MSG(trainer_step(&b, &dev_first[s], ebuf, sizeof ebuf) == 0, "%s", ebuf);
  trainer_eval(&b, &dev_eval);
  CHECK_MSG(ckpt_save(&b, dev_dir, 2, 1, ebuf, sizeof ebuf) == 0, "%s", ebuf);
  snprintf(path, sizeof path, "%s/model.safetensors", dev_dir);
  CHECK_MSG(weights_export(&b.model, path, ebuf, sizeof ebuf) == 0, "%s", ebuf);
  trainer_close(&b);
  step = -1;
  CHECK(ckpt_find_latest(dev_dir, path, sizeof path, &step, ebuf, sizeof ebuf) == 0 && step == 2);
  CHECK_MSG(trainer_open(&c, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  CHECK(c.model.k == &untouchable_ops && c.model.device == dev);
  CHECK_MSG(ckpt_load(&c, path, ebuf, sizeof ebuf) == 0, "%s", ebuf);
  CHECK(c.step == 2);
  for (int s = 0; s < 2; s++)
    CHECK_MSG(trainer_step(&c, &dev_resumed[s], ebuf, sizeof ebuf) == 0, "%s", ebuf);
  CHECK(runtime_use_backend(NULL, NULL) == 0);

  for (int s = 0; s < 2; s++) CHECK(same_step(&full[s], &dev_first[s], s));
  /* Evaluation: the same forwards on the same parameters. */
  CHECK(cpu_eval.has_val_loss && dev_eval.has_val_loss && cpu_eval.has_accuracy &&
        dev_eval.has_accuracy);
  CHECK_MSG(memcmp(&cpu_eval.val_loss, &dev_eval.val_loss, sizeof(double)) == 0 &&
              memcmp(&cpu_eval.accuracy, &dev_eval.accuracy, sizeof(double)) == 0 &&
              cpu_eval.n_problems == dev_eval.n_problems && cpu_eval.n_problems > 0,
            "eval: val loss %.17g / %.17g, accuracy %.17g / %.17g over %d / %d problems",
            cpu_eval.val_loss, dev_eval.val_loss, cpu_eval.accuracy, dev_eval.accuracy,
            cpu_eval.n_problems, dev_eval.n_problems);
  /* The checkpoint and the export: the same bytes. */
  snprintf(path, sizeof path, "%s/step_00000002/manifest.json", cpu_dir);
  snprintf(path2, sizeof path2, "%s/step_00000002/manifest.json", dev_dir);
  CHECK(same_file(path, path2));
  snprintf(path, sizeof path, "%s/step_00000002/rank_00000.bin", cpu_dir);
  snprintf(path2, sizeof path2, "%s/step_00000002/rank_00000.bin", dev_dir);
  CHECK(same_file(path, path2));
  snprintf(path, sizeof path, "%s/model.safetensors", cpu_dir);
  snprintf(path2, sizeof path2, "%s/model.safetensors", dev_dir);
  CHECK(same_file(path, path2));
  /* Resumed on the device as on the CPU. In the fp32 build a checkpoint holds the state exactly
   * (fp32 master weights and moments), so both are also the uninterrupted run's; the float64
   * build stores fp32 and resumes from the rounded state. */
  for (int s = 0; s < 2; s++) CHECK(same_step(&cpu_resumed[s], &dev_resumed[s], s + 2));
  CHECK(params_equal_through_views(&r.model, &c.model));
  if (!REAL_IS_DOUBLE) {
    for (int s = 0; s < 2; s++) CHECK(same_step(&full[s + 2], &dev_resumed[s], s + 2));
    CHECK(params_equal_through_views(&a.model, &c.model));
  }
  CHECK_MSG(host_pointer_report() == 0, "an entry was handed host memory (listed above)");

  trainer_close(&c);
  CHECK(alloc_device_bill(dev)->n_live == 0);
  CHECK((int)arena.live_blocks == live0 && arena.bad_frees == 0);
  trainer_close(&r);
  trainer_close(&a);
  remove_tree(root);
  plan_free(&p);
}

/* One whole `tycho run` (train_run: evaluation, metrics, checkpoints, export, the memory bill's
 * peaks) of 4 steps and its resumption to 6, once per backend in the same folder (the plan's
 * paths are part of its hash, which the manifest records), then set aside: the checkpoints and
 * exports of the two are the same bytes. */
static int run_in(const char *root, const char *as, int untouchable, char *msg, size_t msg_size)
{
  char run_dir[128], target[128];
  snprintf(run_dir, sizeof run_dir, "%s/run", root);
  snprintf(target, sizeof target, "%s/%s", root, as);
  struct plan p;
  tiny_plan(&p);
  p.train.eval_every = 2;
  p.train.eval_batches = 1;
  p.log.every = 1;
  snprintf(p.checkpoint.dir, sizeof p.checkpoint.dir, "%s/ckpt", run_dir);
  p.checkpoint.every = 2;
  p.checkpoint.keep = 1;
  snprintf(p.export_.path, sizeof p.export_.path, "%s/model.safetensors", run_dir);
  snprintf(p.log.metrics, sizeof p.log.metrics, "%s/metrics.jsonl", run_dir);
  FILE *out = tmpfile();
  int rc = out ? 0 : (snprintf(msg, msg_size, "tmpfile: %s", strerror(errno)), -1);
  for (int leg = 0; leg < 2 && rc == 0; leg++) {
    p.train.steps = leg == 0 ? 4 : 6; /* the second leg resumes from step 4 */
    if (untouchable ? use_untouchable() : runtime_use_backend(NULL, NULL))
      rc = -1;
    else
      rc = train_run(&p, NULL, out, msg, msg_size);
    runtime_use_backend(NULL, NULL);
  }
  /* The second leg went on from the first's last checkpoint. */
  if (rc == 0) {
    char text[65536];
    rewind(out);
    size_t n = fread(text, 1, sizeof text - 1, out);
    text[n] = '\0';
    if (!strstr(text, "resumed from ") || !strstr(text, "/ckpt/step_00000004: step 4\n"))
      rc = -1, snprintf(msg, msg_size, "the second leg did not resume from step 4");
  }
  if (out)
    fclose(out);
  plan_free(&p);
  if (rc == 0 && rename(run_dir, target) != 0)
    rc = -1, snprintf(msg, msg_size, "rename %s: %s", run_dir, strerror(errno));
  return rc;
}

static void a_whole_run_and_its_resumption_write_the_cpu_bytes(void)
{
  char root[] = "/tmp/tycho-device-run-XXXXXX";
  CHECK(mkdtemp(root) != NULL);
  const size_t live0 = arena.live_blocks;
  CHECK_MSG(run_in(root, "cpu", 0, ebuf, sizeof ebuf) == 0, "CPU run: %s", ebuf);
  const long calls0 = arena.calls[E_linear_forward];
  CHECK_MSG(run_in(root, "dev", 1, ebuf, sizeof ebuf) == 0, "untouchable run: %s", ebuf);
  CHECK(arena.calls[E_linear_forward] > calls0); /* the device computed it */
  CHECK(arena.live_blocks == live0 && arena.bad_frees == 0);
  static const char *const files[] = { "model.safetensors", "ckpt/step_00000006/manifest.json",
                                       "ckpt/step_00000006/rank_00000.bin" };
  for (int i = 0; i < 3; i++) {
    char x[700], y[700];
    snprintf(x, sizeof x, "%s/cpu/%s", root, files[i]);
    snprintf(y, sizeof y, "%s/dev/%s", root, files[i]);
    CHECK(same_file(x, y));
  }
  CHECK_MSG(host_pointer_report() == 0, "an entry was handed host memory (listed above)");
  remove_tree(root);
}

/* init.from: Hugging Face weights loaded into a trainer on the untouchable device are the CPU's
 * trainer's, and train on to the same bits. */
static void weights_load_onto_the_device_as_onto_the_cpu(void)
{
  char root[] = "/tmp/tycho-device-init-XXXXXX";
  CHECK(mkdtemp(root) != NULL);
  struct plan p;
  tiny_plan(&p);
  struct trainer a, c, d;
  struct train_step_stats sc, sd;
  CHECK(runtime_use_backend(NULL, NULL) == 0);
  CHECK_MSG(trainer_open(&a, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  CHECK_MSG(trainer_step(&a, &sc, ebuf, sizeof ebuf) == 0, "%s", ebuf);
  snprintf(p.init.from, sizeof p.init.from, "%s/model.safetensors", root);
  CHECK_MSG(weights_export(&a.model, p.init.from, ebuf, sizeof ebuf) == 0, "%s", ebuf);
  trainer_close(&a);

  CHECK_MSG(trainer_open(&c, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  CHECK(use_untouchable() == 0);
  CHECK_MSG(trainer_open(&d, &p, NULL, ebuf, sizeof ebuf) == TRAIN_OK, "%s", ebuf);
  CHECK(runtime_use_backend(NULL, NULL) == 0);
  CHECK(d.model.k == &untouchable_ops);
  CHECK(params_equal_through_views(&c.model, &d.model));
  CHECK_MSG(trainer_step(&c, &sc, ebuf, sizeof ebuf) == 0, "%s", ebuf);
  CHECK_MSG(trainer_step(&d, &sd, ebuf, sizeof ebuf) == 0, "%s", ebuf);
  CHECK(same_step(&sc, &sd, 0));
  CHECK(params_equal_through_views(&c.model, &d.model));
  CHECK_MSG(host_pointer_report() == 0, "an entry was handed host memory (listed above)");
  trainer_close(&d);
  trainer_close(&c);
  CHECK(arena.live_blocks == 0);
  remove_tree(root);
  plan_free(&p);
}

TEST_MAIN(TEST(host_access_to_the_arena_faults_and_the_entries_do_not),
          TEST(trains_to_the_cpu_bits_on_memory_the_host_cannot_touch),
          TEST(bf16_trains_to_the_cpu_bits_on_the_device),
          TEST(evaluates_checkpoints_and_exports_as_the_cpu_does),
          TEST(a_whole_run_and_its_resumption_write_the_cpu_bytes),
          TEST(weights_load_onto_the_device_as_onto_the_cpu))
