/* The ckpt command (ckpt.h): `tycho ckpt inspect` prints what a checkpoint holds, `tycho ckpt
 * verify` reads every piece of it. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "runtime/state/ckpt_internal.h"
#include "runtime/state/manifest.h"
#include "util/err.h"
#include "util/json.h"

/* ---- the ckpt command ------------------------------------------------------------------- */

int ckpt_inspect(const char *path, FILE *out, char *err, size_t err_size)
{
  struct manifest mf;
  if (ckpt_manifest_open(&mf, path, err, err_size))
    return manifest_free(&mf), 1;
  fprintf(out, "checkpoint %s: step %lld of plan %s (hash %s)\n", mf.path, mf.step, mf.plan, mf.plan_hash);
  fprintf(out, "model:");
  for (int i = 0; i < (mf.model[CKPT_MODEL_KEYS_DENSE] > 0 ? CKPT_MODEL_KEYS : CKPT_MODEL_KEYS_DENSE); i++)
    fprintf(out, " %s %lld", ckpt_model_keys[i], mf.model[i]);
  fprintf(out, "\nsaved on %lld ranks: tp %lld, pp %lld, dp %lld, zero %lld\n", mf.world, mf.mesh[0],
          mf.mesh[1], mf.mesh[2], mf.mesh[3]);
  if (mf.computes >= 0) { /* what a resume compares */
    fprintf(out, "computes:");
    for (int c = mf.j.nodes[mf.computes].first; c >= 0; c = mf.j.nodes[c].next)
      if (mf.j.nodes[c].type == JSON_STRING && mf.j.nodes[c].key)
        fprintf(out, " %s=%s", mf.j.nodes[c].key, mf.j.nodes[c].str);
    fprintf(out, "\n");
  }
  /* sums of bytes the shards are not read to confirm: doubles, which cannot overflow */
  double *bytes = calloc((size_t)mf.n_files + 1, sizeof *bytes), total = 0;
  long long pieces = 0;
  for (int i = 0; bytes && i < mf.n_tensors; i++)
    for (int k = 0; k < mf.tensors[i].n_pieces; k++) {
      const struct manifest_piece *sp = &mf.tensors[i].pieces[k];
      bytes[sp->file] += (double)(sp->hi - sp->lo) * (double)sizeof(real);
      total += (double)(sp->hi - sp->lo) * (double)sizeof(real);
      pieces++;
    }
  fprintf(out, "%d tensors, %lld pieces, %.2f MiB in %d files:\n", mf.n_tensors, pieces, total / 1048576.0, mf.n_files);
  for (int f = 0; bytes && f < mf.n_files; f++)
    fprintf(out, "  %s  %.0f bytes\n", mf.files[f], bytes[f]);
  free(bytes);
  manifest_free(&mf);
  return 0;
}

/* The reader has judged the coverage (every element of every tensor and kind in exactly one
 * piece) as it does for a resume; this reads every piece: its bytes within its file, its
 * checksum, every element finite. */
int ckpt_verify(const char *path, FILE *out, char *err, size_t err_size)
{
  struct manifest mf;
  if (ckpt_manifest_open(&mf, path, err, err_size))
    return manifest_free(&mf), 1;
  long long pieces = 0;
  double total = 0.0, largest = 0.0;
  const char *largest_name = "";
  for (int i = 0; i < mf.n_tensors; i++) {
    struct manifest_tensor *tt = &mf.tensors[i];
    for (int k = 0; k < tt->n_pieces; k++) {
      struct manifest_piece *sp = &tt->pieces[k];
      const real *data = manifest_piece_data(&mf, tt, sp, err, err_size);
      if (!data)
        return manifest_free(&mf), 1;
      /* a diverged run's weights: a non-finite element is an error, the largest magnitude shown */
      for (int64_t e = 0; e < sp->hi - sp->lo; e++) {
        const double v = (double)data[e];
        if (!isfinite(v)) {
          const int64_t at = sp->lo + e, row = sp->r0 + at / sp->cols, col = sp->c0 + at % sp->cols;
          errf(err, err_size, "checkpoint %s: element [%lld, %lld] of %s (%s) is %s", mf.path, (long long)row,
               (long long)col, tt->name, ckpt_kind_names[sp->kind], isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
          return manifest_free(&mf), 1;
        }
        if (sp->kind == CKPT_PARAM && fabs(v) > largest) {
          largest = fabs(v);
          largest_name = tt->name;
        }
      }
      pieces++;
      total += (double)(sp->hi - sp->lo) * (double)sizeof(real);
    }
  }
  fprintf(out, "ok: checkpoint %s, step %lld: %d tensors × %d kinds covered exactly once, %lld pieces "
          "(%.2f MiB in %d files) match their checksums; every element finite, the largest weight "
          "|%.4g| in %s\n", mf.path, mf.step, mf.n_tensors, CKPT_N_KINDS, pieces, total / 1048576.0,
          mf.n_files, largest, largest_name);
  manifest_free(&mf);
  return 0;
}
