/* libFuzzer target for the checkpoint manifest reader (host/runtime/state/manifest.c): any byte string
 * is read as a checkpoint's manifest.json, its files standing for shard files of FUZZ_SHARD_BYTES
 * bytes each, held in memory (heap blocks of exactly that size, so the sanitizers catch a read
 * past one). A manifest may be refused (with a message naming it) but must never crash, leak,
 * read outside the text or a shard, or be accepted when it breaks the reader's promises: every
 * number of an accepted piece within bounds, every piece's bytes within its shard or refused by
 * manifest_piece_data with a message, and — checked element by element against the reader's
 * band-by-band judgement, for tensors small enough to count — every element of every tensor and
 * kind in exactly one piece; a manifest refused for its coverage must indeed miss or repeat one.
 * With clang: clang -fsanitize=fuzzer,address,undefined -Ihost -Ikernels fuzz_manifest.c
 * host/runtime/state/manifest.c host/util/json.c host/util/err.c. With gcc, fuzz_manifest_driver.c
 * supplies main() and the inputs. */
#include "runtime/state/manifest.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

long fuzz_manifest_accepted;

static void broken(int line, const char *what)
{
  fprintf(stderr, "fuzz_manifest.c:%d: broken: %s\n", line, what);
  abort();
}
#define require(cond) ((cond) ? (void)0 : broken(__LINE__, #cond))

/* The shard bytes of file f: the same for the driver (to checksum its seeds) and the target. */
void fuzz_manifest_shard(int f, unsigned char *out)
{
  for (size_t k = 0; k < FUZZ_SHARD_BYTES; k++)
    out[k] = (unsigned char)(k * 37 + 11 + (size_t)f * 101);
}

/* Element-by-element coverage of one tensor and kind: 0 exact, 1 not, -1 too big to count. */
static int exact_by_counting(const struct manifest_tensor *tt, int kind)
{
  const int64_t rows = tt->shape[0], cols = tt->shape[1], n = rows * cols;
  int64_t work = 0;
  for (int k = 0; k < tt->n_pieces && work <= (1 << 20); k++)
    if (tt->pieces[k].kind == kind)
      work += tt->pieces[k].hi - tt->pieces[k].lo;
  if (n > (1 << 16) || work > (1 << 20))
    return -1;
  unsigned char *seen = calloc((size_t)n + 1, 1);
  require(seen != NULL);
  int bad = 0;
  for (int k = 0; k < tt->n_pieces && !bad; k++) {
    const struct manifest_piece *sp = &tt->pieces[k];
    if (sp->kind != kind)
      continue;
    for (int64_t e = sp->lo; e < sp->hi && !bad; e++) {
      const int64_t row = sp->r0 + e / sp->cols, col = sp->c0 + e % sp->cols;
      require(col >= 0 && col < cols && row >= 0);
      if (row < rows && seen[row * cols + col]++)
        bad = 1;
    }
  }
  for (int64_t e = 0; e < n && !bad; e++)
    bad = !seen[e];
  free(seen);
  return bad;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char err[512];
  struct manifest mf;
  char *text = malloc(size + 1);
  require(text != NULL);
  memcpy(text, data, size);
  text[size] = 0;
  err[0] = 0;
  const int rc = manifest_parse(&mf, text, size, "fuzz", "fuzz/manifest.json", err, sizeof err);
  if (rc) {
    require(err[0] != '\0' && (strstr(err, "fuzz/manifest.json") == err || strstr(err, "checkpoint fuzz:") == err));
    if (strstr(err, " is in no piece") || strstr(err, " is in two pieces")) {
      /* every piece was read and checked: some tensor and kind must really miss or repeat one */
      int found = 0, unknown = 0;
      for (int i = 0; i < mf.n_tensors; i++)
        for (int kind = 0; kind < CKPT_N_KINDS; kind++) {
          const int e = exact_by_counting(&mf.tensors[i], kind);
          found |= e == 1;
          unknown |= e < 0;
        }
      require(found || unknown);
    }
    manifest_free(&mf);
    return 0;
  }
  /* accepted: the promises of manifest.h */
  fuzz_manifest_accepted++;
  require(mf.n_files >= 0 && mf.n_tensors >= 0);
  for (int i = 0; i < mf.n_tensors; i++) {
    const struct manifest_tensor *tt = &mf.tensors[i];
    require(tt->n_dims == 1 || tt->n_dims == 2);
    require(tt->shape[0] >= 0 && tt->shape[1] >= 0 && (tt->n_dims == 2 || tt->shape[1] == 1));
    require(tt->shape[1] == 0 || tt->shape[0] <= MANIFEST_MAX_ELEMS / (tt->shape[1] ? tt->shape[1] : 1));
    for (int j = 0; j < i; j++)
      require(strcmp(mf.tensors[j].name, tt->name) != 0);
    for (int k = 0; k < tt->n_pieces; k++) {
      const struct manifest_piece *sp = &tt->pieces[k];
      require(sp->kind >= 0 && sp->kind < CKPT_N_KINDS && sp->file >= 0 && sp->file < mf.n_files);
      require(sp->rows >= 1 && sp->cols >= 1 && sp->rows <= MANIFEST_MAX_ELEMS / sp->cols);
      require(sp->r0 >= 0 && sp->r0 <= MANIFEST_MAX_ELEMS && sp->c0 >= 0 && sp->c0 + sp->cols <= tt->shape[1]);
      require(sp->lo >= 0 && sp->lo <= sp->hi && sp->hi <= sp->rows * sp->cols);
      require(sp->offset >= 0 && sp->offset % (int64_t)sizeof(real) == 0);
      require(sp->offset <= INT64_MAX - (sp->hi - sp->lo) * (int64_t)sizeof(real));
    }
    for (int kind = 0; kind < CKPT_N_KINDS; kind++)
      require(exact_by_counting(tt, kind) != 1);
  }
  /* every piece's bytes, from shards in memory */
  const int n_files = mf.n_files;
  unsigned char **shards = calloc((size_t)n_files + 1, sizeof *shards);
  require(shards != NULL);
  mf.in_memory = 1;
  for (int f = 0; f < mf.n_files; f++) {
    shards[f] = malloc(FUZZ_SHARD_BYTES);
    require(shards[f] != NULL);
    fuzz_manifest_shard(f, shards[f]);
    mf.maps[f] = (struct manifest_map){ shards[f], FUZZ_SHARD_BYTES, 1 };
  }
  for (int i = 0; i < mf.n_tensors; i++)
    for (int k = 0; k < mf.tensors[i].n_pieces; k++) {
      struct manifest_piece *sp = &mf.tensors[i].pieces[k];
      err[0] = 0;
      const real *p = manifest_piece_data(&mf, &mf.tensors[i], sp, err, sizeof err);
      if (!p) {
        require(strstr(err, "checkpoint fuzz: ") == err);
        continue;
      }
      const unsigned char *b = (const unsigned char *)p, *s = shards[sp->file];
      require(b >= s && b + (sp->hi - sp->lo) * (int64_t)sizeof(real) <= s + FUZZ_SHARD_BYTES && sp->checked);
    }
  manifest_free(&mf);
  for (int f = 0; f < n_files; f++)
    free(shards[f]);
  free(shards);
  return 0;
}
