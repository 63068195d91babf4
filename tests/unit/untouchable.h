/* The untouchable backend, for the tests that need memory the host cannot touch (its contract is
 * in test_device_backend.c's opening comment): untouchable_ops, a wrapper of kernel_ops_cpu with
 * host_visible = 0 whose memory is one mmap'd arena, PROT_NONE while no entry of the table runs,
 * a SIGSEGV handler that names a stray host touch, and per-entry counts of pointer arguments that
 * were not device memory. Static definitions: include it in one file of a test binary, after
 * defining _GNU_SOURCE (MAP_NORESERVE). use_untouchable plugs it in (runtime_use_backend);
 * host_pointer_report names the entries handed host pointers so far. */
#ifndef TYCHO_TESTS_UNTOUCHABLE_H
#define TYCHO_TESTS_UNTOUCHABLE_H
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__has_include)
#if __has_include(<execinfo.h>)
#include <execinfo.h>
#define HAVE_BACKTRACE 1
#endif
#endif

#include "bf16.h"
#include "ops.h"
#include "runtime/model/backend.h"

/* One counter per entry of the table, made from its list (ops_list.h). */
enum entry {
#define KERNEL_OP(ret, op, params, args) E_##op,
#include "ops_list.h"
  N_ENTRIES
};

static const char *const entry_names[N_ENTRIES] = {
#define KERNEL_OP(ret, op, params, args) #op,
#include "ops_list.h"
};

/* ---- the arena ---- */

#define ARENA_BYTES ((size_t)1 << 30) /* virtual; MAP_NORESERVE, only what is used is backed */

struct block {
  size_t offset, n_bytes;
  int live;
};

struct arena {
  char *base;
  size_t size, used; /* bump pointer: [0, used) has been handed out */
  size_t open_bytes; /* [0, open_bytes) is PROT_READ|PROT_WRITE during a call, else 0 */
  int depth;         /* entries running (no entry calls another; 1 at most) */
  long calls[N_ENTRIES];
  long host_pointers[N_ENTRIES]; /* pointer arguments that were not device memory */
  size_t live_blocks, live_bytes, bad_frees;
  struct block *blocks; /* by offset, as handed out (host memory) */
  size_t n_blocks, cap_blocks;
  const struct kernel_ops *inner;
};

static struct arena arena; /* the table's context is &arena; the handler reads it */
static size_t page_bytes;

static void put(const char *s)
{
  size_t n = strlen(s);
  while (n > 0) {
    ssize_t w = write(2, s, n);
    if (w <= 0)
      return;
    s += w;
    n -= (size_t)w;
  }
}

static void put_u64(uint64_t v)
{
  char buf[24];
  int i = (int)sizeof buf - 1;
  buf[i] = '\0';
  do {
    buf[--i] = (char)('0' + v % 10);
    v /= 10;
  } while (v && i > 0);
  put(buf + i);
}

/* The block an arena offset lies in, or NULL (binary search: blocks are in offset order). */
static const struct block *block_at(size_t offset)
{
  size_t lo = 0, hi = arena.n_blocks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const struct block *b = &arena.blocks[mid];
    if (offset < b->offset)
      hi = mid;
    else if (offset >= b->offset + (b->n_bytes ? (b->n_bytes + 63) / 64 * 64 : 64))
      lo = mid + 1;
    else
      return b;
  }
  return NULL;
}

static struct sigaction previous_segv;

/* A fault inside the arena is host code touching device memory: say where, show who, exit 1.
 * Anything else is not ours: the previous disposition takes it (the fault recurs on return). */
static void on_segv(int sig, siginfo_t *si, void *uc)
{
  (void)uc;
  const char *addr = si->si_addr;
  if (arena.base && addr >= arena.base && addr < arena.base + arena.size) {
    const size_t offset = (size_t)(addr - arena.base);
    put("\nhost touched device memory at offset ");
    put_u64(offset);
    put(" of the arena");
    const struct block *b = block_at(offset);
    if (b) {
      put(" (block ");
      put_u64((uint64_t)(b - arena.blocks));
      put(" at offset ");
      put_u64(b->offset);
      put(", ");
      put_u64(b->n_bytes);
      put(b->live ? " bytes, live)" : " bytes, freed)");
    } else {
      put(" (in no block: past the bump pointer)");
    }
    put(arena.depth ? ", inside a backend call (the test's bug)\n"
                    : ", outside every backend call\n");
#ifdef HAVE_BACKTRACE
    void *frames[64];
    int n = backtrace(frames, 64);
    put("backtrace (resolve ./test_device_backend(+0x...) with addr2line -f -e):\n");
    backtrace_symbols_fd(frames, n, 2);
#endif
    _exit(1);
  }
  sigaction(sig, &previous_segv, NULL);
}

static void arena_init(void)
{
  if (arena.base)
    return;
  page_bytes = (size_t)sysconf(_SC_PAGESIZE);
  void *p = mmap(NULL, ARENA_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap of the arena");
    exit(2);
  }
  arena.base = p;
  arena.size = ARENA_BYTES;
  arena.inner = &kernel_ops_cpu;
#ifdef HAVE_BACKTRACE
  void *warm[4];
  backtrace(warm, 4); /* loads libgcc now, not first inside the handler */
#endif
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGSEGV, &sa, &previous_segv) != 0) {
    perror("sigaction");
    exit(2);
  }
}

static void protect(size_t n_bytes, int prot)
{
  if (n_bytes && mprotect(arena.base, n_bytes, prot) != 0) {
    perror("mprotect of the arena");
    abort();
  }
}

static size_t used_pages(void)
{
  return (arena.used + page_bytes - 1) / page_bytes * page_bytes;
}

/* Opens the used arena for the call of entry e. */
static struct arena *enter(void *ctx, enum entry e)
{
  struct arena *a = ctx;
  if (a != &arena) {
    put("untouchable table called with a context that is not its arena\n");
    abort();
  }
  a->calls[e]++;
  if (a->depth++ == 0) {
    a->open_bytes = used_pages();
    protect(a->open_bytes, PROT_READ | PROT_WRITE);
  }
  return a;
}

static void leave(struct arena *a)
{
  if (--a->depth == 0) {
    protect(a->open_bytes, PROT_NONE);
    a->open_bytes = 0;
  }
}

/* p .. p + n_bytes inside what the arena handed out. */
static int on_device(const struct arena *a, const void *p, size_t n_bytes)
{
  const char *c = p;
  return c >= a->base && c <= a->base + a->used && n_bytes <= (size_t)(a->base + a->used - c);
}

/* A kernel's pointer argument: NULL where the kernel allows it, else device memory (its first
 * element: the kernels' extents are theirs to know). */
static void dev(struct arena *a, enum entry e, const void *p)
{
  if (p && !on_device(a, p, 1))
    a->host_pointers[e]++;
}

static void *untouchable_mem_alloc(void *ctx, size_t n_bytes)
{
  struct arena *a = ctx;
  a->calls[E_mem_alloc]++;
  const size_t rounded = n_bytes ? (n_bytes + 63) / 64 * 64 : 64;
  if (n_bytes > a->size || rounded > a->size - a->used)
    return NULL;
  if (a->n_blocks == a->cap_blocks) {
    size_t cap = a->cap_blocks ? 2 * a->cap_blocks : 256;
    struct block *b = realloc(a->blocks, cap * sizeof *b);
    if (!b)
      return NULL;
    a->blocks = b;
    a->cap_blocks = cap;
  }
  void *p = a->base + a->used;
  a->blocks[a->n_blocks++] = (struct block){ a->used, n_bytes, 1 };
  a->used += rounded;
  a->live_blocks++;
  a->live_bytes += n_bytes;
  if (a->depth > 0 && used_pages() > a->open_bytes) { /* not expected: no entry allocates */
    a->open_bytes = used_pages();
    protect(a->open_bytes, PROT_READ | PROT_WRITE);
  }
  return p; /* fresh pages, never handed out before: zero */
}

static void untouchable_mem_free(void *ctx, void *block)
{
  struct arena *a = ctx;
  a->calls[E_mem_free]++;
  if (!block)
    return;
  const char *c = block;
  struct block *b = c >= a->base && c < a->base + a->used
                      ? (struct block *)block_at((size_t)(c - a->base)) : NULL;
  if (!b || b->offset != (size_t)(c - a->base) || !b->live) {
    a->bad_frees++;
    return;
  }
  b->live = 0;
  a->live_blocks--;
  a->live_bytes -= b->n_bytes;
}

static void untouchable_copy(void *ctx, void *dst, const void *src, size_t n_bytes)
{
  struct arena *a = enter(ctx, E_copy);
  if (!on_device(a, dst, n_bytes) || !on_device(a, src, n_bytes))
    a->host_pointers[E_copy]++;
  else
    a->inner->copy(NULL, dst, src, n_bytes);
  leave(a);
}

static void untouchable_copy_rows(void *ctx, void *dst, size_t dst_pitch, const void *src,
                                  size_t src_pitch, size_t row_bytes, size_t n_rows)
{
  struct arena *a = enter(ctx, E_copy_rows);
  const size_t dst_span = n_rows ? (n_rows - 1) * dst_pitch + row_bytes : 0;
  const size_t src_span = n_rows ? (n_rows - 1) * src_pitch + row_bytes : 0;
  if (!on_device(a, dst, dst_span) || !on_device(a, src, src_span))
    a->host_pointers[E_copy_rows]++;
  else
    a->inner->copy_rows(NULL, dst, dst_pitch, src, src_pitch, row_bytes, n_rows);
  leave(a);
}

static void untouchable_zero(void *ctx, void *dst, size_t n_bytes)
{
  struct arena *a = enter(ctx, E_zero);
  if (!on_device(a, dst, n_bytes))
    a->host_pointers[E_zero]++;
  else
    a->inner->zero(NULL, dst, n_bytes);
  leave(a);
}

/* The host side of to_host and from_host must be host memory (n_bytes 0 excepted). */
static int on_host(const struct arena *a, const void *p, size_t n_bytes)
{
  const char *c = p;
  return n_bytes == 0 || (p && (c + n_bytes <= a->base || c >= a->base + a->size));
}

static void untouchable_to_host(void *ctx, void *host, const void *src, size_t n_bytes)
{
  struct arena *a = enter(ctx, E_to_host);
  if (!on_device(a, src, n_bytes) || !on_host(a, host, n_bytes))
    a->host_pointers[E_to_host]++;
  else
    a->inner->to_host(NULL, host, src, n_bytes);
  leave(a);
}

static void untouchable_from_host(void *ctx, void *dst, const void *host, size_t n_bytes)
{
  struct arena *a = enter(ctx, E_from_host);
  if (!on_device(a, dst, n_bytes) || !on_host(a, host, n_bytes))
    a->host_pointers[E_from_host]++;
  else
    a->inner->from_host(NULL, dst, host, n_bytes);
  leave(a);
}

static int untouchable_status(void *ctx, char *emsg, size_t emsg_size)
{
  struct arena *a = ctx;
  a->calls[E_status]++;
  return a->inner->status(NULL, emsg, emsg_size);
}

/* ---- the kernels, made from the list: each opens the arena, records a pointer argument that
 * is not device memory (err, the host's message buffer, excepted), calls the CPU's entry and
 * shuts the arena ---- */

static void dev_arg(struct arena *a, enum entry e, const void *p) { dev(a, e, p); }
static void host_arg(struct arena *a, enum entry e, const void *p) { (void)a, (void)e, (void)p; }
static void value_arg(struct arena *a, enum entry e, double v) { (void)a, (void)e, (void)v; }
/* A pointer type not named here fails to compile (value_arg takes no pointer). The attention's
 * dropout settings and a cp block's positions are host memory by the contract (ops.h). */
#define CHECK_ARG(x)                                                                              \
  _Generic((x), real *: dev_arg, const real *: dev_arg, int *: dev_arg, const int *: dev_arg,     \
           bf16 *: dev_arg, const bf16 *: dev_arg, char *: host_arg,                               \
           const struct attention_dropout *: host_arg, const struct attention_block *: host_arg,   \
           default: value_arg)(ar_, e_, (x));
#define EACH_CAT_(x, y) x##y
#define EACH_CAT(x, y) EACH_CAT_(x, y)
#define EACH_N(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, n, ...) n
#define EACH(f, ...)                                                                              \
  EACH_CAT(EACH_, EACH_N(__VA_ARGS__, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1))      \
  (f, __VA_ARGS__)
#define EACH_1(f, x) f(x)
#define EACH_2(f, x, ...) f(x) EACH_1(f, __VA_ARGS__)
#define EACH_3(f, x, ...) f(x) EACH_2(f, __VA_ARGS__)
#define EACH_4(f, x, ...) f(x) EACH_3(f, __VA_ARGS__)
#define EACH_5(f, x, ...) f(x) EACH_4(f, __VA_ARGS__)
#define EACH_6(f, x, ...) f(x) EACH_5(f, __VA_ARGS__)
#define EACH_7(f, x, ...) f(x) EACH_6(f, __VA_ARGS__)
#define EACH_8(f, x, ...) f(x) EACH_7(f, __VA_ARGS__)
#define EACH_9(f, x, ...) f(x) EACH_8(f, __VA_ARGS__)
#define EACH_10(f, x, ...) f(x) EACH_9(f, __VA_ARGS__)
#define EACH_11(f, x, ...) f(x) EACH_10(f, __VA_ARGS__)
#define EACH_12(f, x, ...) f(x) EACH_11(f, __VA_ARGS__)
#define EACH_13(f, x, ...) f(x) EACH_12(f, __VA_ARGS__)
#define EACH_14(f, x, ...) f(x) EACH_13(f, __VA_ARGS__)
#define EACH_15(f, x, ...) f(x) EACH_14(f, __VA_ARGS__)
#define EACH_16(f, x, ...) f(x) EACH_15(f, __VA_ARGS__)
/* The result of a value-returning entry, held across leave(). */
#define HOLD(ret) HOLD_##ret
#define HOLD_void
#define HOLD_int int r_ =
#define HOLD_size_t size_t r_ =
#define HOLD_double double r_ =
#define GIVE(ret) GIVE_##ret
#define GIVE_void
#define GIVE_int return r_;
#define GIVE_size_t return r_;
#define GIVE_double return r_;

#define KERNEL_BACKEND(ret, op, params, args)
#define KERNEL_OP(ret, op, params, args)                                                          \
  static ret untouchable_##op(void *ctx, KERNEL_UNPACK params)                                  \
  {                                                                                               \
    const enum entry e_ = E_##op;                                                                 \
    struct arena *ar_ = enter(ctx, e_); /* not `a`: an entry may have an argument of that name */ \
    EACH(CHECK_ARG, KERNEL_UNPACK args)                                                           \
    HOLD(ret) ar_->inner->op(NULL, KERNEL_UNPACK args);                                           \
    leave(ar_);                                                                                   \
    GIVE(ret)                                                                                     \
  }
#include "ops_list.h"

static const struct kernel_ops untouchable_ops = {
  .name = "untouchable",
  .compute_dtype = REAL_TENSOR_DTYPE,
  .host_visible = 0,
#define KERNEL_OP(ret, op, params, args) .op = untouchable_##op,
#include "ops_list.h"
};


static int use_untouchable(void)
{
  arena_init();
  return runtime_use_backend(&untouchable_ops, &arena);
}

/* Every host pointer an entry was handed so far, named; 0 when there was none. */
static long host_pointer_report(void)
{
  long total = 0;
  for (int e = 0; e < N_ENTRIES; e++)
    if (arena.host_pointers[e]) {
      fprintf(stderr, "  %s: %ld call(s) with a pointer argument that is not device memory\n",
              entry_names[e], arena.host_pointers[e]);
      total += arena.host_pointers[e];
    }
  return total;
}

#endif
