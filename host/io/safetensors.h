/* Hugging Face safetensors: read (memory-mapped, header validated as untrusted input), write
 * (F32, crash-safe), and the sharded form (model.safetensors.index.json).
 *
 * File layout: u64 little-endian N, then N bytes of JSON mapping each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the first byte after
 * the header), plus an optional "__metadata__" object of string -> string; then the data.
 * Every function returns 0 on success, nonzero on error with a one-line message in err. */
#ifndef TYCHO_IO_SAFETENSORS_H
#define TYCHO_IO_SAFETENSORS_H
#include <stddef.h>
#include <stdint.h>

#include "real.h"

#define ST_MAX_DIMS 8
#define ST_MAX_HEADER_BYTES ((uint64_t)100 << 20) /* the cap the HF reader uses too */

enum st_dtype {
  ST_BOOL, ST_U8, ST_I8, ST_F8_E5M2, ST_F8_E4M3, ST_I16, ST_U16, ST_F16, ST_BF16,
  ST_I32, ST_U32, ST_F32, ST_F64, ST_I64, ST_U64, ST_N_DTYPES
};

struct st_tensor {
  const char *name;             /* NUL-terminated, owned by the st_file */
  enum st_dtype dtype;
  int n_dims;                   /* 0 for a scalar */
  int64_t shape[ST_MAX_DIMS];
  size_t n_elems;               /* product of shape (1 for a scalar) */
  size_t n_bytes;               /* n_elems * st_dtype_bytes(dtype) */
  size_t offset;                /* from the start of the data area */
  const uint8_t *data;          /* into the mapping or the caller's buffer; may be unaligned */
};

struct st_file {
  char *path;                   /* the name used in error messages */
  void *map;                    /* the mmap, or NULL when parsed from a caller's buffer */
  size_t map_bytes;
  const uint8_t *data;          /* start of the data area */
  size_t data_bytes;
  int n_tensors;
  struct st_tensor *tensors;    /* (n_tensors) in header order */
  int *by_name;                 /* (n_tensors) indices into tensors, sorted by name */
  int n_metadata;
  const char **metadata_keys;   /* (n_metadata) in header order */
  const char **metadata_values; /* (n_metadata) */
  char *strings;                /* storage for every name, key and value above */
};

/* A tensor to write: the runtime's `real` data (kernels/real.h), row-major, n_elems =
 * product(shape); written as F32 (rounded from double in the float64 build). */
struct st_write_tensor {
  const char *name;
  int n_dims;
  int64_t shape[ST_MAX_DIMS];
  const real *data;
};

/* The sharded form: an index file naming, for each tensor, the shard file that holds it. */
struct st_index {
  char *path;
  int n_shards;
  const char **shard_files;     /* (n_shards) file names as the index gives them, sorted */
  struct st_file *shards;       /* (n_shards) opened by st_index_open */
  int n_entries;
  struct st_index_entry { const char *name; int shard; } *entries; /* sorted by name */
  char *strings;
};

const char *st_dtype_name(enum st_dtype dtype);
size_t st_dtype_bytes(enum st_dtype dtype);

/* Parse a whole safetensors image held in memory (the 8-byte length, the header, the data).
 * The buffer must outlive f; tensor data points into it. `name` is used in messages. */
int st_parse(struct st_file *f, const void *buf, size_t n_bytes, const char *name,
             char *err, size_t err_size);
/* Memory-map `path` read-only and parse it with st_parse. A path that is not a regular file (a
 * FIFO, a device, a folder) is refused at once, unread (util/path.h: status 2). */
int st_open(struct st_file *f, const char *path, char *err, size_t err_size);
/* Release everything; safe on a zeroed or already-closed st_file. */
void st_close(struct st_file *f);
/* The tensor called `name`, or NULL (binary search). */
const struct st_tensor *st_find(const struct st_file *f, const char *name);
/* Convert tensor t (F32, F16, BF16 or F64) to `real` (float, or double in the float64 build:
 * every F32, F16 and BF16 value exactly; F64 rounded to float in the fp32 build); out holds
 * n_elems elements and n_elems must equal t->n_elems. */
int st_read_real(const struct st_file *f, const struct st_tensor *t, real *out, size_t n_elems,
                 char *err, size_t err_size);

/* Write an F32 safetensors file (whatever `real` is): header keys in the order given, `{"__metadata__":{"format":
 * "pt"}}` first, header padded with spaces to a multiple of 8, data contiguous in the order
 * given. Written to `path.tmp`, fsynced, then renamed over `path` (util/file.h); a `path` or
 * `path.tmp` that exists as anything but a regular file (a device, a FIFO, a folder) is refused,
 * at the start (`path` again before the rename), never written into nor replaced; `path.tmp` is
 * made afresh, and a link at either is replaced, never written through. */
int st_write_f32(const char *path, const struct st_write_tensor *tensors, int n_tensors,
                 char *err, size_t err_size);

/* Parse index JSON held in memory: fills entries and shard_files and opens nothing (shards
 * stay zeroed). Shard names must be relative and free of "..". */
int st_index_parse(struct st_index *ix, const char *json, size_t n_bytes, const char *name,
                   char *err, size_t err_size);
/* Read `path` (a model.safetensors.index.json), open each shard relative to the index's folder,
 * and check that every tensor the index names is in its shard. */
int st_index_open(struct st_index *ix, const char *path, char *err, size_t err_size);
void st_index_close(struct st_index *ix);
/* Find `name` across shards: returns the tensor and (if file is not NULL) its shard, or NULL. */
const struct st_tensor *st_index_find(const struct st_index *ix, const char *name,
                                      const struct st_file **file);
/* Write an index: tensor names[i] lives in shard file shard_files[i] (a name relative to the
 * index's folder). metadata.total_size is total_bytes. Written as st_write_f32 writes a file. */
int st_index_write(const char *path, const char *const *names, const char *const *shard_files,
                   int n_entries, uint64_t total_bytes, char *err, size_t err_size);

#endif
