/* Inside the checkpoints: the piece records and the helpers shared by ckpt.c (the pieces a rank
 * holds, the synchronous save, the folder's upkeep), ckpt_async.c (checkpoint.async), ckpt_load.c
 * (reading a checkpoint into a trainer), ckpt_mem.c (the state a replan moves) and ckpt_inspect.c
 * (the ckpt command). Not for use outside these files. */
#ifndef TYCHO_RUNTIME_CKPT_INTERNAL_H
#define TYCHO_RUNTIME_CKPT_INTERNAL_H
#include <stddef.h>
#include <stdint.h>

#include "runtime/state/ckpt.h"
#include "runtime/state/manifest.h"
#include "runtime/train/train.h"

struct comm_group;
struct strbuf;

/* A piece: elements [lo, hi) (row-major) of the block (r0, c0, rows, cols) of one tensor. */
struct ckpt_piece {
  int64_t param, kind, r0, c0, rows, cols, lo, hi, offset, hash, rank;
};
#define PIECE_WORDS 11

/* Where the pieces go: the file fd, or (mem non-NULL) memory at mem + offset; count_only lists
 * nothing and copies nothing, it only counts the pieces (n) and their bytes (offset). */
struct writer {
  int fd;
  const char *path;
  int64_t offset, rank;
  struct ckpt_piece *pieces;
  int n, cap;
  char *mem;
  int count_only;
  char *err;
  size_t err_size;
};

/* Calls fn for every (parameter, kind, element range of its block) this rank holds, with the
 * memory of the range's first element: the backend's memory of model m (parameters, shards and
 * AdamW's moments all live there), which fn reads or writes only through a host view
 * (hostview.h) on m->k, m->kctx. owner_only: only the ranges this rank writes (each element of
 * the model once over the job, padding rows left out). */
typedef int (*ckpt_piece_fn)(void *ctx, const struct model *m, const struct model_param *p, int index,
                        int kind, size_t lo, size_t hi, real *mem);

/* ckpt.c: the pieces, writing them, the step folders and the synchronous save's steps. */
void ckpt_param_block(const struct model_param *p, int64_t *r0, int64_t *c0, int64_t *rows, int64_t *cols);
int ckpt_for_each_piece(struct trainer *t, int owner_only, ckpt_piece_fn fn, void *ctx);
int ckpt_write_piece(void *ctx, const struct model *m, const struct model_param *p, int index, int kind,
                     size_t lo, size_t hi, real *mem);
void ckpt_step_folder(char *out, size_t n, const char *dir, long long step, int tmp);
int ckpt_computes_value(const struct plan *p, int i, char *buf, size_t n);
void ckpt_manifest_text(struct strbuf *b, const struct trainer *t, long long steps_done,
                        const struct ckpt_piece *all, int n_all, int world);
int ckpt_gather_pieces(struct comm_group *g, const struct ckpt_piece *pieces, int n,
                       struct ckpt_piece **all_out, int *n_all_out, char *err, size_t err_size);
int ckpt_failed_write(int rank, const char *tmp, int rc);
int ckpt_commit(const char *dir, const char *tmp, const char *final, int keep, const struct strbuf *b,
                char *err, size_t err_size);
int ckpt_prepare_tmp(struct comm_group *g, const char *tmp, char *err, size_t err_size);

/* ckpt_load.c: opening a checkpoint's manifest, the model's sizes, loading a manifest's pieces. */
int ckpt_manifest_open(struct manifest *mf, const char *path, char *err, size_t err_size);
void ckpt_model_values(const struct plan_model *c, long long vals[CKPT_MODEL_KEYS]);
int ckpt_load_manifest(struct trainer *t, struct manifest *mf, char *err, size_t err_size);

#endif
