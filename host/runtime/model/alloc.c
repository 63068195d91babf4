/* The runtime allocator: blocks come from their device's hooks, and a table keyed by address
 * (open addressing, linear probing, deletion by shifting back) records each block's size,
 * category and device, so alloc_free can take it off the right bill without the caller
 * repeating any of them and without writing into device memory. A device with a zero hook keeps
 * the blocks freed on it in a cache of idle blocks (alloc.h, "The cache"), one array per device,
 * searched from its end for a block of the class asked for (LIFO: the block freed last is the
 * likeliest to be asked for again); a step frees and asks for tens to hundreds of blocks, so a
 * scan costs nothing beside a kernel launch. */
#include "runtime/model/alloc.h"

#include "ops.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { ALLOC_ALIGN = 64 };

/* A cached block: its address and its class size (what the device's alloc hook was asked for). */
struct idle_block {
  void *at;
  size_t n_bytes;
};

struct device_state {
  int used;
  struct alloc_device hooks;
  struct alloc_bill bill;
  size_t limit_bytes;                  /* 0: none */
  size_t reserved[ALLOC_N_CATEGORIES]; /* Σ of the reservations held */
  struct idle_block *idle;             /* the cache: blocks freed, kept for reuse */
  size_t n_idle, cap_idle, idle_bytes; /* idle_bytes: Σ of their class sizes */
};

/* Host memory is the CPU backend's (zeroed, 64-byte aligned). */
static void *host_alloc(void *ctx, size_t n_bytes)
{
  return kernel_ops_cpu.mem_alloc(ctx, n_bytes);
}

static void host_free(void *ctx, void *block)
{
  kernel_ops_cpu.mem_free(ctx, block);
}

static struct device_state devices[ALLOC_MAX_DEVICES] = {
  [ALLOC_HOST] = { .used = 1, .hooks = { "host", host_alloc, host_free, NULL } },
};
static int current = ALLOC_HOST;
static long fail_after = -1; /* alloc_fail_after's count; −1: off */

/* ---- the block table ---- */

struct block_entry {
  const void *at; /* NULL: empty slot */
  size_t n_bytes;
  int category, device;
};
static struct block_entry *table;
static size_t table_cap, table_n; /* table_cap a power of two, or 0 */

static size_t slot_of(const void *at, size_t cap)
{
  uint64_t h = (uint64_t)(uintptr_t)at;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return (size_t)h & (cap - 1);
}

static int table_grow(void)
{
  size_t cap = table_cap ? 2 * table_cap : 256;
  struct block_entry *t = calloc(cap, sizeof *t);
  if (!t)
    return -1;
  for (size_t i = 0; i < table_cap; i++)
    if (table[i].at) {
      size_t j = slot_of(table[i].at, cap);
      while (t[j].at)
        j = (j + 1) & (cap - 1);
      t[j] = table[i];
    }
  free(table);
  table = t;
  table_cap = cap;
  return 0;
}

static struct block_entry *table_find(const void *at)
{
  if (!table_cap || !at)
    return NULL;
  for (size_t j = slot_of(at, table_cap);; j = (j + 1) & (table_cap - 1)) {
    if (!table[j].at)
      return NULL;
    if (table[j].at == at)
      return &table[j];
  }
}

static void table_remove(struct block_entry *e)
{
  size_t i = (size_t)(e - table);
  table[i].at = NULL;
  table_n--;
  /* shift back the entries after i whose home slot does not lie in (i, j] */
  for (size_t j = (i + 1) & (table_cap - 1); table[j].at; j = (j + 1) & (table_cap - 1)) {
    size_t home = slot_of(table[j].at, table_cap);
    int between = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (!between) {
      table[i] = table[j];
      table[j].at = NULL;
      i = j;
    }
  }
  if (!table_n) { /* nothing live: give the table back (a closed trainer leaves no memory) */
    free(table);
    table = NULL;
    table_cap = 0;
  }
}

/* ---- the cache ---- */

/* The size a cached device allocates a request of n_bytes at: whole ALLOC_CLASS_BYTES. */
static size_t class_bytes(size_t n_bytes)
{
  const size_t n = n_bytes ? n_bytes : 1;
  return (n + ALLOC_CLASS_BYTES - 1) / ALLOC_CLASS_BYTES * ALLOC_CLASS_BYTES;
}

static int cached(const struct device_state *d)
{
  return d->hooks.zero != NULL;
}

/* An idle block of class size n_bytes, taken out of the cache; NULL when there is none. */
static void *cache_take(struct device_state *d, size_t n_bytes)
{
  for (size_t i = d->n_idle; i-- > 0;)
    if (d->idle[i].n_bytes == n_bytes) {
      void *at = d->idle[i].at;
      d->idle[i] = d->idle[--d->n_idle];
      d->idle_bytes -= n_bytes;
      return at;
    }
  return NULL;
}

/* Keeps a block for reuse; gives it back to the device when the cache cannot grow. */
static void cache_put(struct device_state *d, void *at, size_t n_bytes)
{
  if (d->n_idle == d->cap_idle) {
    const size_t cap = d->cap_idle ? 2 * d->cap_idle : 64;
    struct idle_block *t = realloc(d->idle, cap * sizeof *t);
    if (!t) {
      d->hooks.free(d->hooks.ctx, at);
      return;
    }
    d->idle = t;
    d->cap_idle = cap;
  }
  d->idle[d->n_idle++] = (struct idle_block){ at, n_bytes };
  d->idle_bytes += n_bytes;
}

static void cache_release(struct device_state *d)
{
  for (size_t i = 0; i < d->n_idle; i++) d->hooks.free(d->hooks.ctx, d->idle[i].at);
  free(d->idle);
  d->idle = NULL;
  d->n_idle = d->cap_idle = d->idle_bytes = 0;
}

void alloc_release_cache(int id)
{
  if (id >= 0 && id < ALLOC_MAX_DEVICES && devices[id].used)
    cache_release(&devices[id]);
}

int alloc_device_cache(int id, size_t *n_blocks, size_t *n_bytes)
{
  if (id < 0 || id >= ALLOC_MAX_DEVICES || !devices[id].used)
    return -1;
  *n_blocks = devices[id].n_idle;
  *n_bytes = devices[id].idle_bytes;
  return 0;
}

/* ---- devices ---- */

int alloc_device_add(const struct alloc_device *device)
{
  if (!device || !device->alloc || !device->free)
    return -1;
  for (int i = 1; i < ALLOC_MAX_DEVICES; i++)
    if (!devices[i].used) {
      memset(&devices[i], 0, sizeof devices[i]);
      devices[i].used = 1;
      devices[i].hooks = *device;
      return i;
    }
  return -1;
}

int alloc_device_remove(int id)
{
  if (id <= ALLOC_HOST || id >= ALLOC_MAX_DEVICES || !devices[id].used || id == current ||
      devices[id].bill.n_live)
    return -1;
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++)
    if (devices[id].reserved[k])
      return -1;
  cache_release(&devices[id]);
  devices[id].used = 0;
  return 0;
}

int alloc_use_device(int id)
{
  if (id < 0 || id >= ALLOC_MAX_DEVICES || !devices[id].used)
    return -1;
  current = id;
  return 0;
}

int alloc_current_device(void)
{
  return current;
}

const char *alloc_device_name(int id)
{
  return id >= 0 && id < ALLOC_MAX_DEVICES && devices[id].used ? devices[id].hooks.name : NULL;
}

int alloc_device_of(const void *block)
{
  const struct block_entry *e = table_find(block);
  return e ? e->device : -1;
}

/* ---- the cap and reservations ---- */

static size_t max_size(size_t a, size_t b)
{
  return a > b ? a : b;
}

/* What the cap counts: each category's bytes in use or reserved, whichever is more; with
 * category c holding `extra` more bytes. */
static size_t charged(const struct device_state *d, int c, size_t extra)
{
  size_t sum = 0;
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++)
    sum += max_size(d->bill.n_bytes[k] + (k == c ? extra : 0), d->reserved[k]);
  return sum;
}

int alloc_reserve(const size_t bytes[ALLOC_N_CATEGORIES], int *over)
{
  struct device_state *d = &devices[current];
  size_t sum = 0;
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++) {
    if (bytes[k] > SIZE_MAX - d->reserved[k])
      return -1;
    sum += max_size(d->bill.n_bytes[k], d->reserved[k] + bytes[k]);
  }
  if (d->limit_bytes && sum > d->limit_bytes) {
    if (over) { /* the category whose reservation goes furthest past what is in use */
      size_t worst = 0;
      *over = 0;
      for (int k = 0; k < ALLOC_N_CATEGORIES; k++) {
        size_t want = d->reserved[k] + bytes[k];
        size_t past = want > d->bill.n_bytes[k] ? want - d->bill.n_bytes[k] : 0;
        if (past > worst)
          worst = past, *over = k;
      }
    }
    return -1;
  }
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++) d->reserved[k] += bytes[k];
  return 0;
}

void alloc_unreserve(const size_t bytes[ALLOC_N_CATEGORIES])
{
  struct device_state *d = &devices[current];
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++)
    d->reserved[k] -= bytes[k] < d->reserved[k] ? bytes[k] : d->reserved[k];
}

void alloc_fail_after(long n)
{
  fail_after = n < 0 ? -1 : n;
}

void alloc_set_limit(size_t n_bytes)
{
  devices[current].limit_bytes = n_bytes;
}

/* ---- blocks ---- */

static void *alloc_on(int device, enum alloc_category category, size_t n_bytes)
{
  struct device_state *d = &devices[device];
  if ((unsigned)category >= ALLOC_N_CATEGORIES || n_bytes > SIZE_MAX - 2 * ALLOC_ALIGN)
    return NULL;
  if (d->limit_bytes && (n_bytes > d->limit_bytes || charged(d, (int)category, n_bytes) > d->limit_bytes))
    return NULL; /* over the cap: as the system's allocator would fail */
  if (fail_after == 0)
    return NULL; /* the test hook: as the system's allocator failing below the cap */
  if (fail_after > 0)
    fail_after--;
  if (2 * (table_n + 1) > table_cap && table_grow())
    return NULL;
  void *block = NULL;
  if (cached(d)) { /* a block of its class from the cache, zeroed on the device as alloc's would be */
    const size_t cls = class_bytes(n_bytes);
    if ((block = cache_take(d, cls))) {
      if (n_bytes)
        d->hooks.zero(d->hooks.ctx, block, n_bytes);
    } else if (!(block = d->hooks.alloc(d->hooks.ctx, cls)) && d->n_idle) {
      cache_release(d); /* the device is full, perhaps of idle blocks: give them back, try once more */
      block = d->hooks.alloc(d->hooks.ctx, cls);
    }
  } else {
    block = d->hooks.alloc(d->hooks.ctx, n_bytes);
  }
  if (!block)
    return NULL;
  size_t j = slot_of(block, table_cap);
  while (table[j].at)
    j = (j + 1) & (table_cap - 1);
  table[j] = (struct block_entry){ block, n_bytes, (int)category, device };
  table_n++;
  struct alloc_bill *b = &d->bill;
  b->n_bytes[category] += n_bytes;
  if (b->n_bytes[category] > b->peak_bytes[category])
    b->peak_bytes[category] = b->n_bytes[category];
  b->total_bytes += n_bytes;
  if (b->total_bytes > b->total_peak_bytes)
    b->total_peak_bytes = b->total_bytes;
  b->n_live++;
  return block;
}

void *alloc_bytes(enum alloc_category category, size_t n_bytes)
{
  return alloc_on(current, category, n_bytes);
}

void *alloc_bytes_on(int device, enum alloc_category category, size_t n_bytes)
{
  if (device < 0 || device >= ALLOC_MAX_DEVICES || !devices[device].used)
    return NULL;
  return alloc_on(device, category, n_bytes);
}

real *alloc_reals_on(int device, enum alloc_category category, size_t n_elems)
{
  if (n_elems > SIZE_MAX / sizeof(real))
    return NULL;
  return alloc_bytes_on(device, category, n_elems * sizeof(real));
}

void *alloc_host_bytes(enum alloc_category category, size_t n_bytes)
{
  return alloc_on(ALLOC_HOST, category, n_bytes);
}

real *alloc_reals(enum alloc_category category, size_t n_elems)
{
  if (n_elems > SIZE_MAX / sizeof(real))
    return NULL;
  return alloc_bytes(category, n_elems * sizeof(real));
}

void alloc_free(void *block)
{
  if (!block)
    return;
  struct block_entry *e = table_find(block);
  if (!e)
    abort(); /* not ours, or freed twice: a bug that must not pass silently */
  struct device_state *d = &devices[e->device];
  struct alloc_bill *b = &d->bill;
  b->n_bytes[e->category] -= e->n_bytes;
  b->total_bytes -= e->n_bytes;
  b->n_live--;
  const size_t n_bytes = e->n_bytes;
  table_remove(e);
  if (!cached(d)) {
    d->hooks.free(d->hooks.ctx, block);
    return;
  }
  cache_put(d, block, class_bytes(n_bytes));
  if (!b->n_live) /* nothing of the runtime's left there (its trainers closed): the device gets it all back */
    cache_release(d);
}

const struct alloc_bill *alloc_bill(void)
{
  return &devices[current].bill;
}

const struct alloc_bill *alloc_device_bill(int id)
{
  return id >= 0 && id < ALLOC_MAX_DEVICES && devices[id].used ? &devices[id].bill : NULL;
}

void alloc_reset_peaks(void)
{
  struct alloc_bill *b = &devices[current].bill;
  for (int c = 0; c < ALLOC_N_CATEGORIES; c++)
    b->peak_bytes[c] = b->n_bytes[c];
  b->total_peak_bytes = b->total_bytes;
}

static void print_bytes(FILE *out, size_t n_bytes)
{
  if (n_bytes < 1024)
    fprintf(out, "%zu B", n_bytes);
  else if (n_bytes < (size_t)1 << 20)
    fprintf(out, "%.1f KiB", (double)n_bytes / 1024.0);
  else if (n_bytes < (size_t)1 << 30)
    fprintf(out, "%.1f MiB", (double)n_bytes / (1024.0 * 1024.0));
  else
    fprintf(out, "%.2f GiB", (double)n_bytes / (1024.0 * 1024.0 * 1024.0));
}

void alloc_print_bill_peaks(FILE *out, const char *label, const struct alloc_bill *b)
{
  fprintf(out, "%s:", label);
  for (int c = 0; c < ALLOC_N_CATEGORIES; c++) {
    if (c == ALLOC_CHECKPOINT && !b->peak_bytes[c])
      continue; /* only runs with checkpoint.async have one */
    fprintf(out, "%s %s ", c ? "," : "", alloc_category_name(c));
    print_bytes(out, b->peak_bytes[c]);
  }
  fputs("; total ", out);
  print_bytes(out, b->total_peak_bytes);
  fputc('\n', out);
}

void alloc_print_peaks(FILE *out)
{
  alloc_print_bill_peaks(out, "memory peak", alloc_bill());
}
