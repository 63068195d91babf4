/* The one allocator of the runtime, and the memory bill it keeps (docs/design.md, "The memory
 * bill"). Every buffer the trainer owns — parameters, gradients, optimizer state, activations, comm
 * buffers, workspace — comes from alloc_bytes with its category, so the bytes in use and the
 * high-water mark of each category are known exactly and can be held against the cost model's
 * prediction.
 *
 * Bills per device: host memory is device ALLOC_HOST, always there; a backend whose memory is
 * not the host's (a GPU) adds its device (alloc_device_add) and makes it current
 * (alloc_use_device), and from then on alloc_bytes hands out that device's memory and bills it
 * there. Each block's size, category and device are kept beside it (a table keyed by address),
 * never in it, so device memory is never touched by the allocator. alloc_host_bytes always
 * gives host memory (staging, the trainer's token ids). On the CPU backend the current device is
 * the host, so every block is billed to one bill, as before.
 *
 * The cache. A device with a zero hook (runtime_use_backend gives every backend whose memory is
 * not the host's one: its mem_alloc, mem_free and zero) keeps the blocks freed on it instead of
 * handing them back: a later request of the same size class takes one (zeroed through the zero
 * hook, ordered on the device like any entry, so without a synchronisation), so a training step,
 * which asks for the same sizes every step (ZeRO's gathered units, gradient buckets,
 * reduce-scatter outputs), calls the device's alloc and free hooks not at all once the first
 * steps have filled the cache (on CUDA cudaMalloc and cudaFree each synchronise the device). The
 * cache goes back to the device (its free hook, block by block) when the device's last live
 * block is freed (its trainers closed), when alloc_release_cache is called, when the device is
 * removed, and when the device's alloc hook fails: then the whole cache is given back and the
 * allocation tried once more. Size classes: whole ALLOC_CLASS_BYTES (512 B), an exact-size reuse
 * in effect, since the runtime's sizes come from its layout and repeat exactly from step to step;
 * classes in powers of two would waste up to a quarter of every block (of the parameters' and the
 * optimizer's too, allocated once) for reuse between sizes that a step does not need. The host
 * has no zero hook: host memory is not cached (malloc does not synchronise anything).
 *
 * What the bill counts: the bytes the runtime holds, block by block as asked for (not rounded to
 * the class), as before; the cache's idle blocks and the classes' rounding are not in it
 * (alloc_device_cache reports them), nor in the cap of alloc_set_limit. What the device holds is
 * the bill's bytes in use plus that slack.
 *
 * Not thread-safe: allocate from the thread that drives the run, never from inside a parallel
 * region. */
#ifndef TYCHO_RUNTIME_ALLOC_H
#define TYCHO_RUNTIME_ALLOC_H
#include <stddef.h>
#include <stdio.h>

#include "layout/categories.h" /* enum alloc_category, alloc_category_name */
#include "real.h"

struct alloc_bill {
  size_t n_bytes[ALLOC_N_CATEGORIES];    /* in use now */
  size_t peak_bytes[ALLOC_N_CATEGORIES]; /* high-water mark of each category */
  size_t total_bytes, total_peak_bytes;  /* all categories together (the total's own peak) */
  size_t n_live;                         /* blocks not yet freed */
};

/* Where memory comes from: a device's hooks. alloc returns n_bytes of zeroed memory, 64-byte
 * aligned, or NULL when out of memory (n_bytes 0 must give a valid, unique block); free takes it
 * back. The allocator calls nothing else: it never reads or writes a device's memory. */
struct alloc_device {
  const char *name; /* "host", "cuda:0", ... */
  void *(*alloc)(void *ctx, size_t n_bytes);
  void (*free)(void *ctx, void *block);
  void *ctx;
  /* NULL: blocks go back to free at once. Else the device is cached (above), and zero(ctx, block,
   * n_bytes) zeroes the first n_bytes of a block it reuses (the backend's zero entry). */
  void (*zero)(void *ctx, void *block, size_t n_bytes);
};
enum { ALLOC_CLASS_BYTES = 512 }; /* a cached device's blocks are whole multiples of this */
enum { ALLOC_HOST = 0, ALLOC_MAX_DEVICES = 8 };
/* Adds a device (the hooks are copied; name must outlive it). Its id, or −1 when there are
 * ALLOC_MAX_DEVICES already. */
int alloc_device_add(const struct alloc_device *device);
/* Removes a device: −1 (nothing done) for the host, the current device, or one that still holds
 * blocks or a reservation. */
int alloc_device_remove(int id);
/* Makes device id the one alloc_bytes, alloc_set_limit, alloc_reserve and alloc_bill use; −1
 * when there is no such device. */
int alloc_use_device(int id);
int alloc_current_device(void);
const char *alloc_device_name(int id);
/* The device a block of this allocator lives on; −1 when it is not one of its blocks. */
int alloc_device_of(const void *block);

/* n_bytes of zeroed memory, 64-byte aligned, on the current device, billed to `category` there;
 * NULL when out of memory or over the device's cap (alloc_set_limit); n_bytes 0 gives a valid,
 * unique block. */
void *alloc_bytes(enum alloc_category category, size_t n_bytes);
/* The same on device `device` (a trainer's blocks made after open go to its model's device,
 * whichever is current then); NULL too when there is no such device. */
void *alloc_bytes_on(int device, enum alloc_category category, size_t n_bytes);
real *alloc_reals_on(int device, enum alloc_category category, size_t n_elems);
/* The same on the host, whichever device is current (host staging, ids the host reads). */
void *alloc_host_bytes(enum alloc_category category, size_t n_bytes);
/* n_elems reals: alloc_bytes(category, n_elems · sizeof(real)), with the product checked. */
real *alloc_reals(enum alloc_category category, size_t n_elems);
/* Caps the bytes in use on the current device over every category (0: no cap): a block that would go over it is
 * refused as if memory had run out. For the tests of what runs out of memory, and for callers
 * that want a budget. */
void alloc_set_limit(size_t n_bytes);
/* A test hook: the next n blocks (on any device) are given, every later one refused as if memory
 * had run out, until alloc_fail_after(−1) turns it off (the default). For the tests that inject
 * a failure at each allocation of a step in turn. */
void alloc_fail_after(long n);
/* Reserves bytes[c] more in each category c of the current device for blocks to come (a trainer reserves its memory
 * bill at open, so a step's buffers cannot run into the cap half-way through): from then on the
 * cap counts, per category, the bytes in use or the bytes reserved, whichever is more. -1 when
 * that would exceed the cap now (*over, when given: the category reserved furthest past what it
 * holds); nothing is reserved then. Allocation itself never draws on a reservation: the bill's
 * peaks stay the blocks' own. */
int alloc_reserve(const size_t bytes[ALLOC_N_CATEGORIES], int *over);
/* Gives back what alloc_reserve(bytes) reserved on the current device. */
void alloc_unreserve(const size_t bytes[ALLOC_N_CATEGORIES]);
/* Frees a block from alloc_bytes or alloc_host_bytes (on whichever device) and takes it off
 * that device's bill; NULL is ignored. */
void alloc_free(void *block);

/* Gives device id's cache back to it (the free hook for each idle block); nothing for an uncached
 * device or one without idle blocks. */
void alloc_release_cache(int id);
/* The idle blocks device id's cache holds and their bytes (class sizes); −1 when there is no such
 * device. */
int alloc_device_cache(int id, size_t *n_blocks, size_t *n_bytes);

/* The current device's bill; alloc_device_bill(id) any device's (NULL when there is none). */
const struct alloc_bill *alloc_bill(void);
const struct alloc_bill *alloc_device_bill(int id);
/* Sets every peak of the current device to the bytes in use now (to measure one phase). */
void alloc_reset_peaks(void);
/* One line: "memory peak: params 3.1 MiB, grads ..., total ... MiB". */
void alloc_print_peaks(FILE *out);
/* The same line for any bill (another rank's), after `label` instead of "memory peak". */
void alloc_print_bill_peaks(FILE *out, const char *label, const struct alloc_bill *b);

#endif
