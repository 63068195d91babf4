/* The one reader of a checkpoint's manifest.json (ckpt.h has the format): resuming, `tycho ckpt
 * verify` and `inspect` all read a checkpoint through it, so what one accepts the others accept.
 * It refuses, with a one-line message naming the file and the tensor, every manifest whose
 * numbers do not describe a checkpoint: counts that are not non-negative integers, shapes,
 * blocks, ranges and byte offsets whose arithmetic would overflow (a tensor or piece is at most
 * MANIFEST_MAX_ELEMS elements, so its bytes fit in int64), a piece outside its tensor's columns,
 * a tensor listed twice, a dtype not the build's, and — for every tensor and each of the three
 * kinds — pieces that do not cover every element exactly once (rows past the tensor's last,
 * vocabulary padding, are not part of it). What it accepts is then safe to index with: a piece's
 * bytes are [offset, offset + (hi - lo) × sizeof(real)), checked against its shard file's size
 * when first read (manifest_piece_data). */
#ifndef TYCHO_RUNTIME_MANIFEST_H
#define TYCHO_RUNTIME_MANIFEST_H
#include <stddef.h>
#include <stdint.h>

#include "real.h"
#include "util/json.h"

enum ckpt_kind { CKPT_PARAM, CKPT_EXP_AVG, CKPT_EXP_AVG_SQ, CKPT_N_KINDS };
extern const char *const ckpt_kind_names[CKPT_N_KINDS]; /* "param", "exp_avg", "exp_avg_sq" */

/* The model's shape a checkpoint must match; the moe_* keys are 0 for a dense model, and a
 * manifest written before them (without them) is a dense model's. */
enum { CKPT_MODEL_KEYS_DENSE = 7, CKPT_MODEL_KEYS = 9 };
extern const char *const ckpt_model_keys[CKPT_MODEL_KEYS];

/* The most elements of one tensor, block or piece: 2^60, so 8 bytes each still fit in int64. */
#define MANIFEST_MAX_ELEMS ((int64_t)1 << 60)

/* Elements [lo, hi) (row-major) of the block (r0, c0, rows, cols) of a tensor, at byte `offset`
 * of files[file]. */
struct manifest_piece {
  int kind, file;
  int64_t offset, r0, c0, rows, cols, lo, hi;
  uint64_t hash;
  int checked; /* its checksum matched */
};

struct manifest_tensor {
  const char *name;
  int n_dims;
  int64_t shape[2]; /* shape[1] is 1 for a vector */
  int n_pieces;
  struct manifest_piece *pieces;
};

struct manifest_map {
  void *map;
  size_t bytes;
  int opened; /* 1 mapped, -1 failed */
};

struct manifest {
  char path[4096];     /* the checkpoint folder */
  char *text;
  struct json_doc j;
  int parsed;
  long long step, world, mesh[4]; /* tp, pp, dp, zero */
  long long model[CKPT_MODEL_KEYS];
  char plan_hash[32], plan[256];
  int n_files;
  const char **files;
  struct manifest_map *maps;
  int n_tensors;
  struct manifest_tensor *tensors;
  int in_memory;       /* maps[] are set by the caller (a replan's, a fuzzer's): never mapped nor unmapped */
  int computes;        /* the "computes" object's node, or -1 (a manifest from before it) */
  int state;           /* the "state" object's node, or -1 */
};

/* Reads and checks folder/manifest.json. 0 ok; −1 with a message. mf is to be freed either way. */
int manifest_read(struct manifest *mf, const char *folder, char *err, size_t err_size);
/* Checks the manifest text[0, n) (malloc'ed, n + 1 bytes, text[n] == 0; mf owns it from here)
 * of the checkpoint folder `folder`; `file` names it in messages. 0 ok; −1 with a message. */
int manifest_parse(struct manifest *mf, char *text, size_t n, const char *folder, const char *file,
                   char *err, size_t err_size);
/* The bytes of piece sp of tt, its shard file mapped on first use (unless in_memory), checked to
 * lie within the file and, once, against its checksum. NULL with a message. */
const real *manifest_piece_data(struct manifest *mf, const struct manifest_tensor *tt,
                                struct manifest_piece *sp, char *err, size_t err_size);
void manifest_free(struct manifest *mf);
/* Looks at the files of the checkpoint in `folder` before anything reads them: −1 with "... is a
 * FIFO, not a regular file" when folder/manifest.json, or a shard file the manifest names, is
 * not a regular file (a FIFO, a device, a folder), so a caller can refuse it as bad input (exit
 * 2); 0 otherwise, any other fault (a missing or malformed manifest) being left to the reader. */
int manifest_special_file(const char *folder, char *err, size_t err_size);

#endif
