/* Hugging Face safetensors: reader, writer and sharded index.
 *
 * The header is untrusted input (files come from the internet), so it goes through a small
 * strict JSON parser written for it (RFC 8259: UTF-8 checked, \uXXXX with surrogate pairs,
 * nesting depth capped, duplicate keys refused) and every tensor entry is checked before any
 * pointer into the data is formed: offsets ordered and inside the data area, size equal to
 * product(shape) * dtype size with overflow checks, no two tensors overlapping, no two with
 * one name. Gaps between tensors are accepted (the HF reader refuses them; nothing here
 * depends on contiguity). A violation is an error message naming the file and the place.
 *
 * Little-endian hosts only (x86-64, aarch64), as the format's data is little-endian. */
#define _POSIX_C_SOURCE 200809L
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"
#include "util/json.h"
#include "util/path.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* ---------------------------------------------------------------------------------------- */
/* Reading */

static const struct { const char *name; size_t n_bytes; } st_dtypes[ST_N_DTYPES] = {
  [ST_BOOL] = {"BOOL", 1}, [ST_U8] = {"U8", 1}, [ST_I8] = {"I8", 1},
  [ST_F8_E5M2] = {"F8_E5M2", 1}, [ST_F8_E4M3] = {"F8_E4M3", 1}, [ST_I16] = {"I16", 2},
  [ST_U16] = {"U16", 2}, [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2}, [ST_I32] = {"I32", 4},
  [ST_U32] = {"U32", 4}, [ST_F32] = {"F32", 4}, [ST_F64] = {"F64", 8}, [ST_I64] = {"I64", 8},
  [ST_U64] = {"U64", 8},
};

const char *st_dtype_name(enum st_dtype dtype)
{
  return (unsigned)dtype < ST_N_DTYPES ? st_dtypes[dtype].name : "?";
}

size_t st_dtype_bytes(enum st_dtype dtype)
{
  return (unsigned)dtype < ST_N_DTYPES ? st_dtypes[dtype].n_bytes : 0;
}

static void shape_string(char *buf, size_t size, const struct st_tensor *t)
{
  size_t n = (size_t)snprintf(buf, size, "[");
  for (int d = 0; d < t->n_dims && n < size; d++)
    n += (size_t)snprintf(buf + n, size - n, "%s%" PRId64, d ? ", " : "", t->shape[d]);
  if (n < size) snprintf(buf + n, size - n, "]");
}

/* Check one tensor entry {"dtype", "shape", "data_offsets"} and fill t. */
static int st_tensor_entry(struct st_file *f, struct json_doc *j, int id, struct st_tensor *t,
                           char *err, size_t err_size)
{
  const struct json_node *nd = &j->nodes[id];
  int dtype = -1, shape = -1, offsets = -1;
  uint64_t range[2];
  t->name = nd->key;
  if (!t->name[0]) return errf_input(err, err_size, "%s: a tensor has an empty name", f->path);
  if (nd->type != JSON_OBJECT)
    return errf_input(err, err_size, "%s: tensor '%s': expected an object with dtype, shape and "
                "data_offsets", f->path, t->name);
  for (int c = nd->first; c >= 0; c = j->nodes[c].next) {
    const char *key = j->nodes[c].key;
    if (strcmp(key, "dtype") == 0) dtype = c;
    else if (strcmp(key, "shape") == 0) shape = c;
    else if (strcmp(key, "data_offsets") == 0) offsets = c;
    else return errf_input(err, err_size, "%s: tensor '%s': unknown field '%.100s'", f->path, t->name, key);
  }
  if (dtype < 0 || shape < 0 || offsets < 0)
    return errf_input(err, err_size, "%s: tensor '%s': missing '%s'", f->path, t->name,
                dtype < 0 ? "dtype" : shape < 0 ? "shape" : "data_offsets");
  if (j->nodes[dtype].type != JSON_STRING)
    return errf_input(err, err_size, "%s: tensor '%s': dtype is not a string", f->path, t->name);
  t->dtype = ST_N_DTYPES;
  for (int k = 0; k < ST_N_DTYPES; k++)
    if (strcmp(j->nodes[dtype].str, st_dtypes[k].name) == 0) t->dtype = (enum st_dtype)k;
  if (t->dtype == ST_N_DTYPES)
    return errf_input(err, err_size, "%s: tensor '%s': unknown dtype '%.40s'", f->path, t->name,
                j->nodes[dtype].str);
  if (j->nodes[shape].type != JSON_ARRAY || j->nodes[shape].n_children > ST_MAX_DIMS)
    return errf_input(err, err_size, "%s: tensor '%s': shape must be an array of at most %d integers",
                f->path, t->name, ST_MAX_DIMS);
  bool has_zero = false, overflow = false;
  t->n_elems = 1;
  for (int c = j->nodes[shape].first; c >= 0; c = j->nodes[c].next) {
    uint64_t d;
    if (!json_uint64(j, c, &d) || d > INT64_MAX)
      return errf_input(err, err_size, "%s: tensor '%s': shape must hold non-negative integers",
                  f->path, t->name);
    t->shape[t->n_dims++] = (int64_t)d;
    if (d == 0) has_zero = true;
    else if (d > SIZE_MAX / t->n_elems) overflow = true;
    else t->n_elems *= (size_t)d;
  }
  if (has_zero) t->n_elems = 0;
  size_t unit = st_dtypes[t->dtype].n_bytes;
  if (overflow || t->n_elems > SIZE_MAX / unit)
    return errf_input(err, err_size, "%s: tensor '%s': shape overflows the address space", f->path,
                t->name);
  t->n_bytes = t->n_elems * unit;
  if (j->nodes[offsets].type != JSON_ARRAY || j->nodes[offsets].n_children != 2 ||
      !json_uint64(j, j->nodes[offsets].first, &range[0]) ||
      !json_uint64(j, j->nodes[j->nodes[offsets].first].next, &range[1]))
    return errf_input(err, err_size, "%s: tensor '%s': data_offsets must be two non-negative integers",
                f->path, t->name);
  if (range[0] > range[1])
    return errf_input(err, err_size, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] are "
                "out of order", f->path, t->name, range[0], range[1]);
  if (range[1] > f->data_bytes)
    return errf_input(err, err_size, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] run "
                "past the end of the %zu-byte data area", f->path, t->name, range[0], range[1],
                f->data_bytes);
  if (range[1] - range[0] != t->n_bytes) {
    char s[160];
    shape_string(s, sizeof s, t);
    return errf_input(err, err_size, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold "
                "%" PRIu64 " bytes but shape %s of %s needs %zu", f->path, t->name, range[0],
                range[1], range[1] - range[0], s, st_dtypes[t->dtype].name, t->n_bytes);
  }
  t->offset = (size_t)range[0];
  t->data = f->data + t->offset;
  return 0;
}

static int st_metadata(struct st_file *f, struct json_doc *j, int id, char *err, size_t err_size)
{
  const struct json_node *nd = &j->nodes[id];
  if (nd->type != JSON_OBJECT)
    return errf_input(err, err_size, "%s: __metadata__ is not an object", f->path);
  f->metadata_keys = calloc((size_t)nd->n_children + 1, sizeof *f->metadata_keys);
  f->metadata_values = calloc((size_t)nd->n_children + 1, sizeof *f->metadata_values);
  if (!f->metadata_keys || !f->metadata_values)
    return errf(err, err_size, "%s: out of memory", f->path);
  for (int c = nd->first; c >= 0; c = j->nodes[c].next) {
    if (j->nodes[c].type != JSON_STRING)
      return errf_input(err, err_size, "%s: __metadata__ value of '%.100s' is not a string", f->path,
                  j->nodes[c].key);
    f->metadata_keys[f->n_metadata] = j->nodes[c].key;
    f->metadata_values[f->n_metadata++] = j->nodes[c].str;
  }
  return 0;
}

struct span { size_t begin, end; int index; };

static int compare_spans(const void *a, const void *b)
{
  const struct span *x = a, *y = b;
  return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

struct named { const char *name; int index; };

static int compare_named(const void *a, const void *b)
{
  return strcmp(((const struct named *)a)->name, ((const struct named *)b)->name);
}

/* Fill by_name and refuse overlapping tensors; names are already unique (JSON keys). */
static int st_index_tensors(struct st_file *f, char *err, size_t err_size)
{
  size_t n = (size_t)f->n_tensors;
  struct named *names = malloc((n + 1) * sizeof *names);
  struct span *spans = malloc((n + 1) * sizeof *spans);
  f->by_name = malloc((n + 1) * sizeof *f->by_name);
  int rc = 0, m = 0;
  if (!names || !spans || !f->by_name) {
    rc = errf(err, err_size, "%s: out of memory", f->path);
    goto done;
  }
  for (int k = 0; k < f->n_tensors; k++) {
    const struct st_tensor *t = &f->tensors[k];
    names[k] = (struct named){ t->name, k };
    if (t->n_bytes) spans[m++] = (struct span){ t->offset, t->offset + t->n_bytes, k };
  }
  qsort(names, n, sizeof *names, compare_named);
  for (size_t k = 0; k < n; k++) f->by_name[k] = names[k].index;
  qsort(spans, (size_t)m, sizeof *spans, compare_spans);
  for (int k = 1; k < m; k++) {
    if (spans[k].begin < spans[k - 1].end) {
      const struct span *a = &spans[k - 1], *b = &spans[k];
      rc = errf_input(err, err_size, "%s: tensors '%s' [%zu, %zu] and '%s' [%zu, %zu] overlap", f->path,
                f->tensors[a->index].name, a->begin, a->end, f->tensors[b->index].name,
                b->begin, b->end);
      break;
    }
  }
done:
  free(names);
  free(spans);
  return rc;
}

/* Parse the image buf[0, n) into f, whose path is set; on error the caller closes f. */
static int st_parse_image(struct st_file *f, const uint8_t *buf, size_t n, char *err,
                          size_t err_size)
{
  uint64_t header_bytes;
  struct json_doc j;
  int rc;
  if (n < 8)
    return errf_input(err, err_size, "%s: file is %zu bytes, shorter than the 8-byte header length: "
                "not a safetensors file", f->path, n);
  memcpy(&header_bytes, buf, 8);
  if (header_bytes > ST_MAX_HEADER_BYTES)
    return errf_input(err, err_size, "%s: header length %" PRIu64 " is over the %" PRIu64 "-byte cap: "
                "not a safetensors file", f->path, header_bytes, ST_MAX_HEADER_BYTES);
  if (header_bytes > n - 8)
    return errf_input(err, err_size, "%s: header length %" PRIu64 " is larger than the %zu bytes after "
                "the length prefix (file is %zu bytes)", f->path, header_bytes, n - 8, n);
  f->data = buf + 8 + header_bytes;
  f->data_bytes = n - 8 - (size_t)header_bytes;
  rc = json_parse(&j, (const char *)buf + 8, (size_t)header_bytes, f->path, 8, err, err_size);
  if (rc) {
    err_mark_input(); /* a header that is not JSON: the file's content */
    goto done;
  }
  if (j.nodes[0].type != JSON_OBJECT) {
    rc = errf_input(err, err_size, "%s: header is not a JSON object", f->path);
    goto done;
  }
  f->tensors = calloc((size_t)j.nodes[0].n_children + 1, sizeof *f->tensors);
  if (!f->tensors) {
    rc = errf(err, err_size, "%s: out of memory", f->path);
    goto done;
  }
  for (int c = j.nodes[0].first; c >= 0 && !rc; c = j.nodes[c].next) {
    if (strcmp(j.nodes[c].key, "__metadata__") == 0)
      rc = st_metadata(f, &j, c, err, err_size);
    else
      rc = st_tensor_entry(f, &j, c, &f->tensors[f->n_tensors++], err, err_size);
  }
  if (!rc) rc = st_index_tensors(f, err, err_size);
done:
  f->strings = j.strings; /* names point into it */
  j.strings = NULL;
  json_free(&j);
  return rc;
}

int st_parse(struct st_file *f, const void *buf, size_t n_bytes, const char *name, char *err,
             size_t err_size)
{
  memset(f, 0, sizeof *f);
  f->path = strdup(name ? name : "<memory>");
  if (!f->path) return errf(err, err_size, "out of memory");
  int rc = st_parse_image(f, buf, n_bytes, err, err_size);
  if (rc) st_close(f);
  return rc;
}

int st_open(struct st_file *f, const char *path, char *err, size_t err_size)
{
  int rc;
  memset(f, 0, sizeof *f);
  struct file_map map;
  if ((rc = file_map(NULL, path, 0, &map, err, err_size)) != 0) return rc;
  f->map = map.data;
  f->map_bytes = map.bytes;
  f->path = strdup(path);
  if (!f->path) {
    st_close(f);
    return errf(err, err_size, "%s: out of memory", path);
  }
  rc = st_parse_image(f, f->map, f->map_bytes, err, err_size);
  if (rc) st_close(f);
  return rc;
}

void st_close(struct st_file *f)
{
  file_unmap(&(struct file_map){ f->map, f->map_bytes });
  free(f->path);
  free(f->tensors);
  free(f->by_name);
  free(f->metadata_keys);
  free(f->metadata_values);
  free(f->strings);
  memset(f, 0, sizeof *f);
}

const struct st_tensor *st_find(const struct st_file *f, const char *name)
{
  int lo = 0, hi = f->n_tensors;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    const struct st_tensor *t = &f->tensors[f->by_name[mid]];
    int c = strcmp(name, t->name);
    if (c == 0) return t;
    if (c < 0) hi = mid;
    else lo = mid + 1;
  }
  return NULL;
}

/* IEEE half to single, exactly: subnormals normalised, inf and nan (payload kept) carried. */
static float f16_to_f32(uint16_t h)
{
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (!mantissa) {
    bits = sign;
  } else {
    uint32_t shift = 0;
    while (!(mantissa & 0x400)) { mantissa <<= 1; shift++; }
    bits = sign | ((113 - shift) << 23) | ((mantissa & 0x3ff) << 13);
  }
  float x;
  memcpy(&x, &bits, 4);
  return x;
}

int st_read_real(const struct st_file *f, const struct st_tensor *t, real *out, size_t n_elems,
                 char *err, size_t err_size)
{
  if (n_elems != t->n_elems)
    return errf_input(err, err_size, "%s: tensor '%s' has %zu elements but the buffer holds %zu",
                f->path, t->name, t->n_elems, n_elems);
  const uint8_t *p = t->data;
  switch (t->dtype) {
  case ST_F32:
#if REAL_IS_DOUBLE
    for (size_t k = 0; k < n_elems; k++) {
      float x;
      memcpy(&x, p + 4 * k, 4);
      out[k] = x;
    }
#else
    if (n_elems) memcpy(out, p, t->n_bytes); /* already the runtime's type */
#endif
    return 0;
  case ST_F16:
  case ST_BF16:
    for (size_t k = 0; k < n_elems; k++) {
      uint16_t h;
      memcpy(&h, p + 2 * k, 2);
      if (t->dtype == ST_F16) {
        out[k] = f16_to_f32(h);
      } else {
        uint32_t bits = (uint32_t)h << 16;
        float x;
        memcpy(&x, &bits, 4);
        out[k] = x;
      }
    }
    return 0;
  case ST_F64:
    for (size_t k = 0; k < n_elems; k++) {
      double d;
      memcpy(&d, p + 8 * k, 8);
      out[k] = (real)d;
    }
    return 0;
  default:
    return errf_input(err, err_size, "%s: tensor '%s' is %s; only F32, F16, BF16 and F64 convert to "
                "%s", f->path, t->name, st_dtype_name(t->dtype), REAL_NAME);
  }
}

/* ---------------------------------------------------------------------------------------- */
/* Writing: build the header in memory, then stream it and the data to path.tmp (file.h's atomic
 * replacement). */

struct text { char *p; size_t n, cap; bool oom; };

static void text_add(struct text *s, const char *src, size_t n)
{
  if (s->oom) return;
  if (s->n + n + 1 > s->cap) {
    size_t cap = s->cap ? s->cap : 256;
    while (cap < s->n + n + 1) cap *= 2;
    char *p = realloc(s->p, cap);
    if (!p) { s->oom = true; return; }
    s->p = p;
    s->cap = cap;
  }
  memcpy(s->p + s->n, src, n);
  s->n += n;
  s->p[s->n] = '\0';
}

static void text_puts(struct text *s, const char *str) { text_add(s, str, strlen(str)); }

__attribute__((format(printf, 2, 3)))
static void text_printf(struct text *s, const char *fmt, ...)
{
  char buf[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  text_add(s, buf, n < 0 ? 0 : (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1);
}

static void text_json_string(struct text *s, const char *str)
{
  text_add(s, "\"", 1);
  for (const unsigned char *c = (const unsigned char *)str; *c; c++) {
    if (*c == '"' || *c == '\\') { text_add(s, "\\", 1); text_add(s, (const char *)c, 1); }
    else if (*c < 0x20) text_printf(s, "\\u%04x", *c);
    else text_add(s, (const char *)c, 1);
  }
  text_add(s, "\"", 1);
}

static bool valid_utf8(const char *s)
{
  size_t n = strlen(s);
  for (size_t k = 0; k < n;) {
    size_t len = json_utf8_length((const unsigned char *)s + k, n - k);
    if (!len) return false;
    k += len;
  }
  return true;
}

/* n_elems reals as F32: as they are in the fp32 build, rounded from double through a small
 * buffer in the float64 build. */
static int write_f32(struct file_atomic *a, const real *data, size_t n_elems, char *err, size_t err_size)
{
#if REAL_IS_DOUBLE
  enum { CHUNK = 4096 };
  float buf[CHUNK];
  for (size_t at = 0; at < n_elems; at += CHUNK) {
    size_t n = n_elems - at < CHUNK ? n_elems - at : CHUNK;
    for (size_t i = 0; i < n; i++) buf[i] = (float)data[at + i];
    if (file_atomic_write(a, buf, 4 * n, err, err_size)) return 1;
  }
  return 0;
#else
  return n_elems ? file_atomic_write(a, data, 4 * n_elems, err, err_size) : 0;
#endif
}

int st_write_f32(const char *path, const struct st_write_tensor *tensors, int n_tensors,
                 char *err, size_t err_size)
{
  struct text h = {0};
  struct named *names = NULL;
  size_t offset = 0;
  int rc = 0;
  if (n_tensors < 0) return errf(err, err_size, "%s: negative tensor count", path);
  text_puts(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
  for (int k = 0; k < n_tensors && !rc; k++) {
    const struct st_write_tensor *t = &tensors[k];
    size_t n_elems = 1;
    bool has_zero = false, overflow = false;
    if (!t->name || !t->name[0] || strcmp(t->name, "__metadata__") == 0 || !valid_utf8(t->name)) {
      rc = errf(err, err_size, "%s: tensor %d: name must be non-empty UTF-8 and not "
                "__metadata__", path, k);
      break;
    }
    if (t->n_dims < 0 || t->n_dims > ST_MAX_DIMS) {
      rc = errf(err, err_size, "%s: tensor '%s': %d dims (0 to %d allowed)", path, t->name,
                t->n_dims, ST_MAX_DIMS);
      break;
    }
    for (int d = 0; d < t->n_dims; d++) {
      if (t->shape[d] < 0) overflow = true;
      else if (t->shape[d] == 0) has_zero = true;
      else if ((uint64_t)t->shape[d] > SIZE_MAX / n_elems) overflow = true;
      else n_elems *= (size_t)t->shape[d];
    }
    if (has_zero) n_elems = 0;
    if (overflow || n_elems > (SIZE_MAX - offset) / 4 || (n_elems && !t->data)) {
      rc = errf(err, err_size, "%s: tensor '%s': bad shape or no data", path, t->name);
      break;
    }
    text_puts(&h, ",");
    text_json_string(&h, t->name);
    text_puts(&h, ":{\"dtype\":\"F32\",\"shape\":[");
    for (int d = 0; d < t->n_dims; d++) text_printf(&h, "%s%" PRId64, d ? "," : "", t->shape[d]);
    text_printf(&h, "],\"data_offsets\":[%zu,", offset);
    offset += 4 * n_elems;
    text_printf(&h, "%zu]}", offset);
  }
  text_puts(&h, "}");
  while (h.n % 8) text_puts(&h, " ");
  if (!rc && h.oom) rc = errf(err, err_size, "%s: out of memory", path);
  if (!rc && h.n > ST_MAX_HEADER_BYTES)
    rc = errf(err, err_size, "%s: header of %zu bytes is over the %" PRIu64 "-byte cap", path,
              h.n, ST_MAX_HEADER_BYTES);
  if (!rc && n_tensors > 1) { /* duplicate names would make an unreadable file */
    names = malloc((size_t)n_tensors * sizeof *names);
    if (!names) rc = errf(err, err_size, "%s: out of memory", path);
    for (int k = 0; k < n_tensors && names; k++) names[k] = (struct named){ tensors[k].name, k };
    if (names) qsort(names, (size_t)n_tensors, sizeof *names, compare_named);
    for (int k = 1; k < n_tensors && !rc; k++)
      if (strcmp(names[k - 1].name, names[k].name) == 0)
        rc = errf(err, err_size, "%s: duplicate tensor name '%s'", path, names[k].name);
  }
  free(names);
  if (rc) { free(h.p); return rc; }

  struct file_atomic a;
  uint64_t header_bytes = h.n;
  if ((rc = file_atomic_begin(&a, NULL, path, err, err_size)) != 0) { free(h.p); return rc; }
  rc = file_atomic_write(&a, &header_bytes, 8, err, err_size) ||
       file_atomic_write(&a, h.p, h.n, err, err_size);
  for (int k = 0; k < n_tensors && !rc; k++) {
    size_t n_elems = 1;
    for (int d = 0; d < tensors[k].n_dims; d++) n_elems *= (size_t)tensors[k].shape[d];
    rc = write_f32(&a, tensors[k].data, n_elems, err, err_size);
  }
  free(h.p);
  const int end = file_atomic_end(&a, !rc, err, err_size);
  return rc ? rc : end;
}

/* ---------------------------------------------------------------------------------------- */
/* Sharded form */

static int compare_entries(const void *a, const void *b)
{
  return strcmp(((const struct st_index_entry *)a)->name, ((const struct st_index_entry *)b)->name);
}

/* A shard name must stay inside the index's folder. */
static bool shard_name_ok(const char *s)
{
  if (!s[0] || s[0] == '/') return false;
  for (const char *p = s; *p;) {
    size_t len = strcspn(p, "/");
    if (len == 2 && p[0] == '.' && p[1] == '.') return false;
    p += len;
    if (*p) p++;
  }
  return true;
}

int st_index_parse(struct st_index *ix, const char *json, size_t n_bytes, const char *name,
                   char *err, size_t err_size)
{
  struct json_doc j;
  struct named *by_shard = NULL;
  int map = -1, rc;
  memset(ix, 0, sizeof *ix);
  ix->path = strdup(name ? name : "<memory>");
  if (!ix->path) return errf(err, err_size, "out of memory");
  rc = json_parse(&j, json, n_bytes, ix->path, 0, err, err_size);
  if (rc) {
    err_mark_input(); /* an index that is not JSON: the file's content */
    goto done;
  }
  if (j.nodes[0].type != JSON_OBJECT) {
    rc = errf_input(err, err_size, "%s: not a JSON object", ix->path);
    goto done;
  }
  for (int c = j.nodes[0].first; c >= 0 && !rc; c = j.nodes[c].next) {
    if (strcmp(j.nodes[c].key, "weight_map") == 0) map = c;
    else if (strcmp(j.nodes[c].key, "metadata") == 0 && j.nodes[c].type != JSON_OBJECT)
      rc = errf_input(err, err_size, "%s: \"metadata\" is not an object", ix->path);
  }
  if (rc) goto done;
  if (map < 0 || j.nodes[map].type != JSON_OBJECT) {
    rc = errf_input(err, err_size, "%s: no \"weight_map\" object: not a safetensors index", ix->path);
    goto done;
  }
  size_t n = (size_t)j.nodes[map].n_children;
  ix->entries = calloc(n + 1, sizeof *ix->entries);
  by_shard = malloc((n + 1) * sizeof *by_shard);
  ix->shard_files = calloc(n + 1, sizeof *ix->shard_files);
  if (!ix->entries || !by_shard || !ix->shard_files) {
    rc = errf(err, err_size, "%s: out of memory", ix->path);
    goto done;
  }
  for (int c = j.nodes[map].first; c >= 0; c = j.nodes[c].next) {
    if (j.nodes[c].type != JSON_STRING || !shard_name_ok(j.nodes[c].str)) {
      rc = errf_input(err, err_size, "%s: weight_map entry '%.100s' must be a file name inside the "
                "index's folder", ix->path, j.nodes[c].key);
      goto done;
    }
    by_shard[ix->n_entries] = (struct named){ j.nodes[c].str, ix->n_entries };
    ix->entries[ix->n_entries++] = (struct st_index_entry){ j.nodes[c].key, -1 };
  }
  /* Shards are numbered in name order (HF names them model-0000k-of-0000n). */
  qsort(by_shard, n, sizeof *by_shard, compare_named);
  for (size_t k = 0; k < n; k++) {
    if (k == 0 || strcmp(by_shard[k].name, by_shard[k - 1].name) != 0)
      ix->shard_files[ix->n_shards++] = by_shard[k].name;
    ix->entries[by_shard[k].index].shard = ix->n_shards - 1;
  }
  qsort(ix->entries, n, sizeof *ix->entries, compare_entries);
  ix->shards = calloc((size_t)ix->n_shards + 1, sizeof *ix->shards);
  if (!ix->shards) rc = errf(err, err_size, "%s: out of memory", ix->path);
done:
  free(by_shard);
  ix->strings = j.strings;
  j.strings = NULL;
  json_free(&j);
  if (rc) st_index_close(ix);
  return rc;
}

int st_index_open(struct st_index *ix, const char *path, char *err, size_t err_size)
{
  int rc = 0;
  memset(ix, 0, sizeof *ix);
  int fd;
  long long size;
  if ((rc = path_open_input(NULL, path, (long long)ST_MAX_HEADER_BYTES, &fd, &size, err, err_size)) != 0)
    return rc;
  size_t n = (size_t)size, got = 0;
  char *text = malloc(n + 1);
  if (!text) { close(fd); return errf(err, err_size, "%s: out of memory", path); }
  while (got < n) {
    ssize_t r = read(fd, text + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  if (got != n) rc = errf(err, err_size, "%s: short read", path);
  if (!rc) rc = st_index_parse(ix, text, n, path, err, err_size);
  free(text);
  if (rc) return rc;

  const char *slash = strrchr(path, '/');
  size_t dir_len = slash ? (size_t)(slash - path) + 1 : 0;
  for (int s = 0; s < ix->n_shards && !rc; s++) {
    char *shard_path = malloc(dir_len + strlen(ix->shard_files[s]) + 1);
    if (!shard_path) { rc = errf(err, err_size, "%s: out of memory", path); break; }
    memcpy(shard_path, path, dir_len);
    strcpy(shard_path + dir_len, ix->shard_files[s]);
    rc = st_open(&ix->shards[s], shard_path, err, err_size);
    free(shard_path);
  }
  for (int k = 0; k < ix->n_entries && !rc; k++) {
    const struct st_file *f = &ix->shards[ix->entries[k].shard];
    if (!st_find(f, ix->entries[k].name))
      rc = errf_input(err, err_size, "%s: tensor '%s' is listed in the index but missing from shard %s",
                path, ix->entries[k].name, f->path);
  }
  if (rc) st_index_close(ix);
  return rc;
}

void st_index_close(struct st_index *ix)
{
  for (int s = 0; ix->shards && s < ix->n_shards; s++) st_close(&ix->shards[s]);
  free(ix->shards);
  free(ix->shard_files);
  free(ix->entries);
  free(ix->strings);
  free(ix->path);
  memset(ix, 0, sizeof *ix);
}

const struct st_tensor *st_index_find(const struct st_index *ix, const char *name,
                                      const struct st_file **file)
{
  const struct st_index_entry key = { name, 0 };
  const struct st_index_entry *e =
      bsearch(&key, ix->entries, (size_t)ix->n_entries, sizeof key, compare_entries);
  if (!e || !ix->shards[e->shard].tensors) return NULL;
  if (file) *file = &ix->shards[e->shard];
  return st_find(&ix->shards[e->shard], name);
}

int st_index_write(const char *path, const char *const *names, const char *const *shard_files,
                   int n_entries, uint64_t total_bytes, char *err, size_t err_size)
{
  struct text s = {0};
  text_printf(&s, "{\n  \"metadata\": {\"total_size\": %" PRIu64 "},\n  \"weight_map\": {",
              total_bytes);
  for (int k = 0; k < n_entries; k++) {
    if (!valid_utf8(names[k]) || !shard_name_ok(shard_files[k]) || !valid_utf8(shard_files[k])) {
      free(s.p);
      return errf(err, err_size, "%s: entry %d: bad tensor or shard name", path, k);
    }
    text_puts(&s, k ? ",\n    " : "\n    ");
    text_json_string(&s, names[k]);
    text_puts(&s, ": ");
    text_json_string(&s, shard_files[k]);
  }
  text_puts(&s, "\n  }\n}\n");
  if (s.oom) {
    free(s.p);
    return errf(err, err_size, "%s: out of memory", path);
  }
  int rc = file_write_atomic(NULL, path, s.p, s.n, err, err_size);
  free(s.p);
  return rc;
}
