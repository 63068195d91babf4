/* The one checked reader of a checkpoint's manifest and of its pieces' bytes: see manifest.h. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/state/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/state/ckpt.h"
#include "util/err.h"
#include "util/file.h"
#include "util/hash.h"
#include "util/path.h"

const char *const ckpt_kind_names[CKPT_N_KINDS] = { "param", "exp_avg", "exp_avg_sq" };
const char *const ckpt_model_keys[CKPT_MODEL_KEYS] = { "n_layers", "dim", "n_heads", "n_kv_heads", "ffn_dim",
                                                       "vocab", "tie_embeddings", "moe_experts", "moe_ffn_dim" };

void manifest_free(struct manifest *mf)
{
  for (int f = 0; f < mf->n_files && mf->maps; f++)
    if (!mf->in_memory && mf->maps[f].opened == 1 && mf->maps[f].bytes)
      file_unmap(&(struct file_map){ mf->maps[f].map, mf->maps[f].bytes });
  for (int i = 0; i < mf->n_tensors && mf->tensors; i++)
    free(mf->tensors[i].pieces);
  free(mf->tensors);
  free(mf->maps);
  free(mf->files);
  if (mf->parsed)
    json_free(&mf->j);
  free(mf->text);
  memset(mf, 0, sizeof *mf);
}

static int get_int(const struct json_doc *j, int obj, const char *key, long long *out)
{
  int id = obj >= 0 ? json_member(j, obj, key) : -1;
  uint64_t v;
  if (id < 0 || !json_uint64(j, id, &v) || v > (uint64_t)INT64_MAX)
    return -1;
  *out = (long long)v;
  return 0;
}

static int get_ints(const struct json_doc *j, int arr, int64_t *out, int n)
{
  if (arr < 0 || j->nodes[arr].type != JSON_ARRAY || j->nodes[arr].n_children != n)
    return -1;
  int k = 0;
  for (int c = j->nodes[arr].first; c >= 0; c = j->nodes[c].next) {
    uint64_t v;
    if (!json_uint64(j, c, &v) || v > (uint64_t)INT64_MAX)
      return -1;
    out[k++] = (int64_t)v;
  }
  return 0;
}

/* a × b when both are counts and the product is at most MANIFEST_MAX_ELEMS; else -1. */
static int64_t elems(int64_t a, int64_t b)
{
  if (a < 0 || b < 0 || a > MANIFEST_MAX_ELEMS || b > MANIFEST_MAX_ELEMS)
    return -1;
  return a == 0 || b <= MANIFEST_MAX_ELEMS / a ? a * b : -1;
}

/* 1 to 16 hex digits (the writer's are 16). */
static int parse_hash(const char *s, uint64_t *out)
{
  size_t n = strlen(s);
  uint64_t v = 0;
  if (n < 1 || n > 16)
    return -1;
  for (size_t i = 0; i < n; i++) {
    const char c = s[i];
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0)
      return -1;
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return 0;
}

/* ---- coverage: every element of a tensor in exactly one piece of each kind ---------------- */

/* Rows [y0, y1) × columns [x0, x1) of the tensor. */
struct rect { int64_t y0, y1, x0, x1; };

static int by_y0(const void *a, const void *b)
{
  const struct rect *p = a, *q = b;
  return p->y0 < q->y0 ? -1 : p->y0 > q->y0;
}

static int by_x0(const void *a, const void *b)
{
  const struct rect *p = a, *q = b;
  return p->x0 < q->x0 ? -1 : p->x0 > q->x0;
}

static int by_value(const void *a, const void *b)
{
  const int64_t p = *(const int64_t *)a, q = *(const int64_t *)b;
  return p < q ? -1 : p > q;
}

static void add_rect(struct rect *r, int *n, int64_t y0, int64_t y1, int64_t x0, int64_t x1, int64_t rows)
{
  if (y1 > rows)
    y1 = rows; /* vocabulary padding is not part of the tensor */
  if (y0 < y1 && x0 < x1)
    r[(*n)++] = (struct rect){ y0, y1, x0, x1 };
}

/* Pieces of `kind` of tt tile its rows × columns exactly, judged band by band: between two
 * consecutive row boundaries of the pieces, the pieces spanning the band, sorted by first
 * column, must follow one another from column 0 to the last without a gap or an overlap. So an
 * overlap and a gap never cancel out, and the work is in the number of pieces, not elements. */
static int check_coverage(const struct manifest *mf, const struct manifest_tensor *tt, int kind, char *err,
                          size_t err_size)
{
  const int64_t rows = tt->shape[0], cols = tt->shape[1];
  if (rows == 0 || cols == 0)
    return 0;
  int n_pieces = 0;
  for (int k = 0; k < tt->n_pieces; k++)
    n_pieces += tt->pieces[k].kind == kind;
  /* a piece's range is at most three rectangles: a partial first row, whole rows, a partial last */
  struct rect *r = malloc(((size_t)n_pieces * 3 + 1) * sizeof *r), *band = malloc(((size_t)n_pieces * 3 + 1) * sizeof *band);
  int64_t *ys = malloc(((size_t)n_pieces * 6 + 2) * sizeof *ys);
  int n = 0, rc = 0;
  if (!r || !band || !ys) {
    free(r), free(band), free(ys);
    return errf(err, err_size, "checkpoint %s: out of memory checking the pieces of %s", mf->path, tt->name);
  }
  for (int k = 0; k < tt->n_pieces; k++) {
    const struct manifest_piece *sp = &tt->pieces[k];
    if (sp->kind != kind || sp->lo == sp->hi)
      continue;
    const int64_t a0 = sp->lo / sp->cols, b0 = sp->lo % sp->cols;
    const int64_t a1 = (sp->hi - 1) / sp->cols, b1 = (sp->hi - 1) % sp->cols + 1;
    const int64_t y = sp->r0, x = sp->c0;
    if (a0 == a1) {
      add_rect(r, &n, y + a0, y + a0 + 1, x + b0, x + b1, rows);
      continue;
    }
    add_rect(r, &n, y + a0, y + a0 + 1, x + b0, x + sp->cols, rows);
    add_rect(r, &n, y + a0 + 1, y + a1, x, x + sp->cols, rows);
    add_rect(r, &n, y + a1, y + a1 + 1, x, x + b1, rows);
  }
  int n_ys = 0;
  ys[n_ys++] = 0;
  ys[n_ys++] = rows;
  for (int k = 0; k < n; k++)
    ys[n_ys++] = r[k].y0, ys[n_ys++] = r[k].y1;
  qsort(ys, (size_t)n_ys, sizeof *ys, by_value);
  qsort(r, (size_t)n, sizeof *r, by_y0);
  /* active: the rectangles spanning the band, r[next..] those starting later */
  int next = 0, n_active = 0;
  struct rect *active = r; /* compacted in place: r[0, n_active) active, r[next, n) to come */
  for (int i = 0; !rc && i + 1 < n_ys; i++) {
    const int64_t y = ys[i];
    if (y == ys[i + 1] || y >= rows)
      continue;
    int kept = 0;
    for (int k = 0; k < n_active; k++)
      if (active[k].y1 > y)
        active[kept++] = active[k];
    n_active = kept;
    while (next < n && r[next].y0 <= y)
      active[n_active++] = r[next++]; /* n_active <= next: never overwrites one still to come */
    memcpy(band, active, (size_t)n_active * sizeof *band);
    qsort(band, (size_t)n_active, sizeof *band, by_x0);
    int64_t end = 0;
    for (int k = 0; !rc && k <= n_active; k++) {
      const int64_t x0 = k < n_active ? band[k].x0 : cols;
      if (x0 > end)
        rc = errf_input(err, err_size, "checkpoint %s: element [%lld, %lld] of %s (%s) is in no piece", mf->path,
                  (long long)y, (long long)end, tt->name, ckpt_kind_names[kind]);
      else if (x0 < end)
        rc = errf_input(err, err_size, "checkpoint %s: element [%lld, %lld] of %s (%s) is in two pieces", mf->path,
                  (long long)y, (long long)x0, tt->name, ckpt_kind_names[kind]);
      else if (k < n_active)
        end = band[k].x1;
    }
  }
  free(r), free(band), free(ys);
  return rc;
}

static int by_name(const void *a, const void *b)
{
  const struct manifest_tensor *p = *(const struct manifest_tensor *const *)a, *q = *(const struct manifest_tensor *const *)b;
  return strcmp(p->name, q->name);
}

/* ---- the manifest ------------------------------------------------------------------------ */

static int parse_piece(struct manifest *mf, const struct manifest_tensor *tt, int q, int e, struct manifest_piece *sp,
                       const char *file, char *err, size_t err_size)
{
  const struct json_doc *j = &mf->j;
  int kind = json_member(j, e, "kind"), hash = json_member(j, e, "fnv1a64");
  long long fileno, offset;
  int64_t block[4], range[2];
  sp->kind = -1;
  for (int kk = 0; kind >= 0 && j->nodes[kind].type == JSON_STRING && kk < CKPT_N_KINDS; kk++)
    if (!strcmp(j->nodes[kind].str, ckpt_kind_names[kk]))
      sp->kind = kk;
  if (j->nodes[e].type != JSON_OBJECT || sp->kind < 0 || hash < 0 || j->nodes[hash].type != JSON_STRING ||
      parse_hash(j->nodes[hash].str, &sp->hash) || get_int(j, e, "file", &fileno) || get_int(j, e, "offset", &offset) ||
      get_ints(j, json_member(j, e, "block"), block, 4) || get_ints(j, json_member(j, e, "range"), range, 2))
    return errf_input(err, err_size, "%s: tensor %s, piece %d: needs \"kind\" (param, exp_avg or exp_avg_sq), "
                "\"file\", \"offset\", \"block\" [4 counts], \"range\" [2 counts] and \"fnv1a64\" (hex)", file,
                tt->name, q);
  sp->offset = offset;
  sp->r0 = block[0], sp->c0 = block[1], sp->rows = block[2], sp->cols = block[3];
  sp->lo = range[0], sp->hi = range[1];
  if (fileno >= mf->n_files)
    return errf_input(err, err_size, "%s: tensor %s, piece %d: file %lld, and \"files\" lists %d", file, tt->name, q,
                fileno, mf->n_files);
  sp->file = (int)fileno;
  const int64_t size = elems(sp->rows, sp->cols);
  if (sp->rows < 1 || sp->cols < 1 || size < 0 || sp->r0 > MANIFEST_MAX_ELEMS || sp->c0 > tt->shape[1] - sp->cols)
    return errf_input(err, err_size, "%s: tensor %s, piece %d: block [%lld, %lld, %lld, %lld] is outside the "
                "tensor's %lld columns or over 2^60 rows or elements", file, tt->name, q, (long long)sp->r0,
                (long long)sp->c0, (long long)sp->rows, (long long)sp->cols, (long long)tt->shape[1]);
  if (sp->lo > sp->hi || sp->hi > size)
    return errf_input(err, err_size, "%s: tensor %s, piece %d: range [%lld, %lld] is not within its block's %lld "
                "elements", file, tt->name, q, (long long)sp->lo, (long long)sp->hi, (long long)size);
  const int64_t bytes = (sp->hi - sp->lo) * (int64_t)sizeof(real);
  if (sp->offset % (int64_t)sizeof(real) || sp->offset > INT64_MAX - bytes)
    return errf_input(err, err_size, "%s: tensor %s, piece %d: offset %lld is not a multiple of %zu, or its %lld "
                "bytes would end past 2^63", file, tt->name, q, (long long)sp->offset, sizeof(real),
                (long long)bytes);
  return 0;
}

int manifest_parse(struct manifest *mf, char *text, size_t n, const char *folder, const char *file,
                   char *err, size_t err_size)
{
  memset(mf, 0, sizeof *mf);
  mf->computes = -1;
  mf->state = -1;
  mf->text = text;
  snprintf(mf->path, sizeof mf->path, "%s", folder);
  const int bad = json_parse(&mf->j, mf->text, n, file, 0, err, err_size);
  mf->parsed = 1; /* a failed parse holds memory too */
  if (bad)
    return err_mark_input(); /* not JSON: the file's content */
  const struct json_doc *j = &mf->j;
  if (j->nodes[0].type != JSON_OBJECT)
    return errf_input(err, err_size, "%s: not a tycho checkpoint manifest (not a JSON object)", file);
  int fmt = json_member(j, 0, "format"), ver = json_member(j, 0, "version");
  uint64_t version;
  if (fmt < 0 || j->nodes[fmt].type != JSON_STRING || strcmp(j->nodes[fmt].str, "tycho-checkpoint"))
    return errf_input(err, err_size, "%s: not a tycho checkpoint manifest (\"format\" is not \"tycho-checkpoint\")", file);
  if (ver < 0 || !json_uint64(j, ver, &version) || version != CKPT_FORMAT_VERSION)
    return errf_input(err, err_size, "%s: format version is not %d", file, CKPT_FORMAT_VERSION);
  int model = json_member(j, 0, "model"), mesh = json_member(j, 0, "mesh");
  if (model >= 0 && j->nodes[model].type != JSON_OBJECT)
    model = -1;
  if (mesh >= 0 && j->nodes[mesh].type != JSON_OBJECT)
    mesh = -1;
  const char *mesh_keys[4] = { "tp", "pp", "dp", "zero" };
  if (get_int(j, 0, "step", &mf->step) || get_int(j, mesh, "world", &mf->world))
    return errf_input(err, err_size, "%s: \"step\" or \"mesh.world\" missing or not a count", file);
  for (int i = 0; i < 4; i++)
    if (get_int(j, mesh, mesh_keys[i], &mf->mesh[i]))
      return errf_input(err, err_size, "%s: \"mesh.%s\" missing or not a count", file, mesh_keys[i]);
  for (int i = 0; i < CKPT_MODEL_KEYS; i++)
    if (get_int(j, model, ckpt_model_keys[i], &mf->model[i])) {
      if (i >= CKPT_MODEL_KEYS_DENSE && model >= 0 && json_member(j, model, ckpt_model_keys[i]) < 0)
        mf->model[i] = 0; /* a dense model's manifest from before the moe keys */
      else
        return errf_input(err, err_size, "%s: \"model.%s\" missing or not a count", file, ckpt_model_keys[i]);
    }
  int h = json_member(j, 0, "plan_hash"), pl = json_member(j, 0, "plan");
  snprintf(mf->plan_hash, sizeof mf->plan_hash, "%s", h >= 0 && j->nodes[h].type == JSON_STRING ? j->nodes[h].str : "?");
  snprintf(mf->plan, sizeof mf->plan, "%s", pl >= 0 && j->nodes[pl].type == JSON_STRING ? j->nodes[pl].str : "?");
  mf->state = json_member(j, 0, "state");
  if (mf->state >= 0 && j->nodes[mf->state].type != JSON_OBJECT)
    return errf_input(err, err_size, "%s: \"state\" must be an object", file);
  mf->computes = json_member(j, 0, "computes");
  if (mf->computes >= 0 && j->nodes[mf->computes].type != JSON_OBJECT)
    return errf_input(err, err_size, "%s: \"computes\" must be an object", file);
  int files = json_member(j, 0, "files"), tensors = json_member(j, 0, "tensors");
  if (files < 0 || j->nodes[files].type != JSON_ARRAY || tensors < 0 || j->nodes[tensors].type != JSON_ARRAY)
    return errf_input(err, err_size, "%s: \"files\" and \"tensors\" must be arrays", file);
  const int n_files = j->nodes[files].n_children, n_tensors = j->nodes[tensors].n_children;
  mf->files = calloc((size_t)n_files + 1, sizeof *mf->files);
  mf->maps = calloc((size_t)n_files + 1, sizeof *mf->maps);
  mf->tensors = calloc((size_t)n_tensors + 1, sizeof *mf->tensors);
  if (!mf->files || !mf->maps || !mf->tensors)
    return errf(err, err_size, "%s: out of memory", file);
  mf->n_files = n_files;
  mf->n_tensors = n_tensors;
  int k = 0;
  for (int c = j->nodes[files].first; c >= 0; c = j->nodes[c].next, k++) {
    const char *s = j->nodes[c].type == JSON_STRING ? j->nodes[c].str : NULL;
    if (!s || !s[0] || strchr(s, '/') || !strcmp(s, "..") || !strcmp(s, "."))
      return errf_input(err, err_size, "%s: files[%d] is not a plain file name", file, k);
    mf->files[k] = s;
  }
  k = 0;
  for (int c = j->nodes[tensors].first; c >= 0; c = j->nodes[c].next, k++) {
    struct manifest_tensor *tt = &mf->tensors[k];
    int name = json_member(j, c, "name"), shape = json_member(j, c, "shape"), pieces = json_member(j, c, "pieces");
    int dtype = json_member(j, c, "dtype");
    if (name < 0 || j->nodes[name].type != JSON_STRING || shape < 0 || j->nodes[shape].type != JSON_ARRAY ||
        pieces < 0 || j->nodes[pieces].type != JSON_ARRAY)
      return errf_input(err, err_size, "%s: tensors[%d] needs \"name\", \"shape\" and \"pieces\"", file, k);
    tt->name = j->nodes[name].str;
    if (dtype < 0 || j->nodes[dtype].type != JSON_STRING)
      return errf_input(err, err_size, "%s: tensor %s: dtype must be \"%s\"", file, tt->name, REAL_DTYPE);
    if (strcmp(j->nodes[dtype].str, REAL_DTYPE))
      return errf_input(err, err_size, "%s: tensor %s is %s, and this build of tycho computes in %s (%s): a "
                  "checkpoint resumes in a build of its own element type (F64: -DTYCHO_FLOAT64=ON)", file,
                  tt->name, j->nodes[dtype].str, REAL_NAME, REAL_DTYPE);
    tt->n_dims = j->nodes[shape].n_children;
    if (tt->n_dims < 1 || tt->n_dims > 2 || get_ints(j, shape, tt->shape, tt->n_dims))
      return errf_input(err, err_size, "%s: tensor %s: shape must be 1 or 2 counts", file, tt->name);
    if (tt->n_dims == 1)
      tt->shape[1] = 1;
    if (elems(tt->shape[0], tt->shape[1]) < 0)
      return errf_input(err, err_size, "%s: tensor %s: shape [%lld, %lld] has more than 2^60 elements", file, tt->name,
                  (long long)tt->shape[0], (long long)tt->shape[1]);
    tt->pieces = calloc((size_t)j->nodes[pieces].n_children + 1, sizeof *tt->pieces);
    if (!tt->pieces)
      return errf(err, err_size, "%s: out of memory", file);
    tt->n_pieces = j->nodes[pieces].n_children;
    int q = 0;
    for (int e = j->nodes[pieces].first; e >= 0; e = j->nodes[e].next, q++)
      if (parse_piece(mf, tt, q, e, &tt->pieces[q], file, err, err_size))
        return -1;
  }
  /* a tensor listed twice: a resume would read one of them and verify pass both */
  const struct manifest_tensor **order = malloc(((size_t)n_tensors + 1) * sizeof *order);
  if (!order)
    return errf(err, err_size, "%s: out of memory", file);
  for (int i = 0; i < n_tensors; i++)
    order[i] = &mf->tensors[i];
  qsort(order, (size_t)n_tensors, sizeof *order, by_name);
  for (int i = 1; i < n_tensors; i++)
    if (!strcmp(order[i - 1]->name, order[i]->name)) {
      errf_input(err, err_size, "%s: tensor %s is listed twice (tensors[%d] and [%d])", file, order[i]->name,
           (int)(order[i - 1] < order[i] ? order[i - 1] - mf->tensors : order[i] - mf->tensors),
           (int)(order[i - 1] < order[i] ? order[i] - mf->tensors : order[i - 1] - mf->tensors));
      free(order);
      return -1;
    }
  free(order);
  for (int i = 0; i < n_tensors; i++)
    for (int kind = 0; kind < CKPT_N_KINDS; kind++)
      if (check_coverage(mf, &mf->tensors[i], kind, err, err_size))
        return -1;
  return 0;
}

/* The manifest and the shard files are opened through util/path.h (the shards mapped by
 * util/file.h): without waiting, and refused unless regular files (a FIFO or a device is neither
 * waited on nor read). */
int manifest_read(struct manifest *mf, const char *folder, char *err, size_t err_size)
{
  char file[4200], *text;
  size_t n;
  memset(mf, 0, sizeof *mf);
  snprintf(file, sizeof file, "%s/manifest.json", folder);
  if (path_read_input(NULL, file, 0, &text, &n, err, err_size))
    return -1;
  return manifest_parse(mf, text, n, folder, file, err, err_size);
}

const real *manifest_piece_data(struct manifest *mf, const struct manifest_tensor *tt, struct manifest_piece *sp,
                                char *err, size_t err_size)
{
  struct manifest_map *mp = &mf->maps[sp->file];
  char file[4400];
  snprintf(file, sizeof file, "%s/%s", mf->path, mf->files[sp->file]);
  if (mp->opened == 0 && !mf->in_memory) {
    mp->opened = -1;
    char why[4600];
    struct file_map map;
    if (file_map(NULL, file, 0, &map, why, sizeof why)) {
      errf(err, err_size, "checkpoint %s: %s", mf->path, why);
      return NULL;
    }
    mp->map = map.data;
    mp->bytes = map.bytes;
    mp->opened = 1;
  }
  if (mp->opened != 1) {
    errf(err, err_size, "checkpoint %s: cannot read %s", mf->path, file);
    return NULL;
  }
  /* the reader bounds offset + bytes within int64 */
  const int64_t bytes = (sp->hi - sp->lo) * (int64_t)sizeof(real);
  if ((uint64_t)sp->offset > mp->bytes || (uint64_t)bytes > mp->bytes - (uint64_t)sp->offset) {
    errf_input(err, err_size, "checkpoint %s: %s is truncated: %s's %s piece needs bytes [%lld, %lld) of %zu",
         mf->path, file, tt->name, ckpt_kind_names[sp->kind], (long long)sp->offset,
         (long long)(sp->offset + bytes), mp->bytes);
    return NULL;
  }
  const real *data = (const real *)((const char *)mp->map + sp->offset);
  if (!sp->checked) {
    if (hash_fnv1a64_bytes(data, (size_t)bytes) != sp->hash) {
      errf_input(err, err_size, "checkpoint %s: %s is corrupt: %s's %s piece at byte %lld fails its checksum",
           mf->path, file, tt->name, ckpt_kind_names[sp->kind], (long long)sp->offset);
      return NULL;
    }
    sp->checked = 1;
  }
  return data;
}

int manifest_special_file(const char *folder, char *err, size_t err_size)
{
  char file[4400];
  int fd;
  snprintf(file, sizeof file, "%s/manifest.json", folder);
  const int rc = path_open_input(NULL, file, 0, &fd, NULL, err, err_size);
  if (rc)
    return rc == 2 ? -1 : 0;
  close(fd);
  struct manifest mf;
  char why[256];
  int special = 0;
  const int was_input = err_class_is_input(); /* a bad manifest here is its reader's to report */
  if (manifest_read(&mf, folder, why, sizeof why) == 0) {
    for (int f = 0; f < mf.n_files && !special; f++) {
      struct stat st;
      snprintf(file, sizeof file, "%s/%s", folder, mf.files[f]);
      if (stat(file, &st) == 0 && !S_ISREG(st.st_mode))
        special = errf(err, err_size, "%s: is %s, not a regular file", file, path_kind(st.st_mode));
    }
  } else if (!was_input) {
    err_class_reset();
  }
  manifest_free(&mf);
  return special;
}
