/* The runtime allocator: a 64-byte header in front of each block records its size and category,
 * so alloc_free can take it off the bill without the caller repeating either. */
#include "alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { ALLOC_ALIGN = 64 };

struct block_header {
  size_t n_bytes;
  int category;
  uint32_t magic;
};
#define BLOCK_MAGIC 0x7479636fu /* "tyco" */

static struct alloc_bill bill;
static size_t limit_bytes; /* 0: none */
static size_t reserved[ALLOC_N_CATEGORIES]; /* Σ of the reservations held */

static size_t max_size(size_t a, size_t b)
{
  return a > b ? a : b;
}

/* What the cap counts: each category's bytes in use or reserved, whichever is more; with
 * category c holding `extra` more bytes. */
static size_t charged(int c, size_t extra)
{
  size_t sum = 0;
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++)
    sum += max_size(bill.n_bytes[k] + (k == c ? extra : 0), reserved[k]);
  return sum;
}

int alloc_reserve(const size_t bytes[ALLOC_N_CATEGORIES], int *over)
{
  size_t sum = 0;
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++) {
    if (bytes[k] > SIZE_MAX - reserved[k])
      return -1;
    sum += max_size(bill.n_bytes[k], reserved[k] + bytes[k]);
  }
  if (limit_bytes && sum > limit_bytes) {
    if (over) { /* the category whose reservation goes furthest past what is in use */
      size_t worst = 0;
      *over = 0;
      for (int k = 0; k < ALLOC_N_CATEGORIES; k++) {
        size_t past = reserved[k] + bytes[k] > bill.n_bytes[k] ? reserved[k] + bytes[k] - bill.n_bytes[k] : 0;
        if (past > worst)
          worst = past, *over = k;
      }
    }
    return -1;
  }
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++) reserved[k] += bytes[k];
  return 0;
}

void alloc_unreserve(const size_t bytes[ALLOC_N_CATEGORIES])
{
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++) reserved[k] -= bytes[k] < reserved[k] ? bytes[k] : reserved[k];
}

void alloc_set_limit(size_t n_bytes)
{
  limit_bytes = n_bytes;
}

const char *alloc_category_name(enum alloc_category category)
{
  static const char *const names[] = { "params", "grads", "optimizer", "activations", "comm",
                                       "workspace" };
  return (unsigned)category < ALLOC_N_CATEGORIES ? names[category] : "?";
}

void *alloc_bytes(enum alloc_category category, size_t n_bytes)
{
  if ((unsigned)category >= ALLOC_N_CATEGORIES || n_bytes > SIZE_MAX - 2 * ALLOC_ALIGN)
    return NULL;
  if (limit_bytes && (n_bytes > limit_bytes || charged((int)category, n_bytes) > limit_bytes))
    return NULL; /* over the cap: as the system's allocator would fail */
  size_t rounded = (n_bytes + ALLOC_ALIGN - 1) / ALLOC_ALIGN * ALLOC_ALIGN;
  unsigned char *base = aligned_alloc(ALLOC_ALIGN, ALLOC_ALIGN + rounded);
  if (!base)
    return NULL;
  memset(base + ALLOC_ALIGN, 0, rounded);
  struct block_header *h = (struct block_header *)base;
  h->n_bytes = n_bytes;
  h->category = (int)category;
  h->magic = BLOCK_MAGIC;
  bill.n_bytes[category] += n_bytes;
  if (bill.n_bytes[category] > bill.peak_bytes[category])
    bill.peak_bytes[category] = bill.n_bytes[category];
  bill.total_bytes += n_bytes;
  if (bill.total_bytes > bill.total_peak_bytes)
    bill.total_peak_bytes = bill.total_bytes;
  bill.n_live++;
  return base + ALLOC_ALIGN;
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
  unsigned char *base = (unsigned char *)block - ALLOC_ALIGN;
  struct block_header *h = (struct block_header *)base;
  if (h->magic != BLOCK_MAGIC)
    abort(); /* not ours, or freed twice: a bug that must not pass silently */
  h->magic = 0;
  bill.n_bytes[h->category] -= h->n_bytes;
  bill.total_bytes -= h->n_bytes;
  bill.n_live--;
  free(base);
}

const struct alloc_bill *alloc_bill(void)
{
  return &bill;
}

void alloc_reset_peaks(void)
{
  for (int c = 0; c < ALLOC_N_CATEGORIES; c++)
    bill.peak_bytes[c] = bill.n_bytes[c];
  bill.total_peak_bytes = bill.total_bytes;
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
    fprintf(out, "%s %s ", c ? "," : "", alloc_category_name(c));
    print_bytes(out, b->peak_bytes[c]);
  }
  fputs("; total ", out);
  print_bytes(out, b->total_peak_bytes);
  fputc('\n', out);
}

void alloc_print_peaks(FILE *out)
{
  alloc_print_bill_peaks(out, "memory peak", &bill);
}
