/* The plan compiler (see compile.h): runs the plan file in the sandbox, applies --set
 * overrides, reads every field of the plan table against the schema of docs/plans.md
 * (unknown fields, types, ranges), calls the fields given as functions once per layer or
 * (layer, module), and hands the data to plan_validate. Every message starts with the file
 * and line the offending field was written on. Here: the sections and the driver; reading one
 * field is compile_read.c's, the per-layer fields compile_layers.c's, --set compile_set.c's. */
#define _POSIX_C_SOURCE 200809L
#include "compile.h"

#include <lauxlib.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "compile_internal.h"
#include "fields.h"
#include "lua/sandbox.h"
#include "lua/tycho_module.h"
#include "util/json.h"

/* ---- sections ------------------------------------------------------------------------- */

/* model.moe.layers (docs/plans.md): "all", a list of 0-based layer indices, or a function(layer)
 * -> boolean called once per layer; the value at the stack's top. Sets p->layers[l].moe. */
static int moe_layers_value(struct reader *r, const char *path, const char *where)
{
  struct plan *p = r->p;
  lua_State *L = r->L;
  const int n_layers = p->model.n_layers;
  char v[96];
  int type = lua_type(L, -1);
  if (type == LUA_TNIL || (type == LUA_TSTRING && strcmp(lua_tostring(L, -1), "all") == 0)) {
    for (int l = 0; l < n_layers; l++)
      p->layers[l].moe = 1;
  } else if (type == LUA_TFUNCTION) {
    p->model.moe.layers_is_function = 1;
    int f = lua_gettop(L);
    for (int l = 0; l < n_layers; l++) {
      char what[192];
      snprintf(what, sizeof what, "the %s function, called for layer %d", path, l);
      lua_pushinteger(L, l);
      if (compile_call_plan_function(r, f, 1, what))
        return -1;
      if (!lua_isboolean(L, -1)) {
        compile_describe(L, -1, v, sizeof v);
        return compile_rfail(r, where, "%s: the function returned %s for layer %d; it must return true (the layer's "
                             "MLP is sparse) or false (dense)", path, v, l);
      }
      p->layers[l].moe = (uint8_t)lua_toboolean(L, -1);
      lua_pop(L, 1);
    }
  } else if (type == LUA_TTABLE) {
    int t = lua_gettop(L), n = (int)lua_rawlen(L, t);
    for (int i = 1; i <= n; i++) {
      char item_where[PLAN_PATH_MAX + 32];
      if (!sandbox_where(L, t, NULL, i, item_where, sizeof item_where))
        snprintf(item_where, sizeof item_where, "%s", where);
      lua_rawgeti(L, t, i);
      long long layer;
      if (!compile_is_integral(L, -1, &layer)) {
        compile_describe(L, -1, v, sizeof v);
        return compile_rfail(r, item_where, "%s[%d] = %s: must be a layer index (0-based)", path, i, v);
      }
      lua_pop(L, 1);
      if (layer < 0 || layer >= n_layers)
        return compile_rfail(r, item_where, "%s[%d] = %lld: layer %lld does not exist; layers are 0..%d", path, i, layer,
                             layer, n_layers - 1);
      if (p->layers[layer].moe)
        return compile_rfail(r, item_where, "%s[%d] = %lld: layer %lld appears twice; list each sparse layer once",
                             path, i, layer, layer);
      p->layers[layer].moe = 1;
    }
  } else {
    compile_describe(L, -1, v, sizeof v);
    return compile_rfail(r, where, "%s = %s: must be \"all\", a list of layer indices (0-based) or a "
                         "function(layer) -> boolean", path, v);
  }
  int sparse = 0;
  for (int l = 0; l < n_layers; l++)
    sparse += p->layers[l].moe;
  if (sparse == 0)
    return compile_rfail(r, where, "%s selects no layer; list at least one layer, or leave model.moe out for a dense "
                         "model", path);
  p->model.moe.n_layers = sparse;
  return 0;
}

/* model.moe (docs/plans.md, docs/moe.md): the sparse MLP. Absent: a dense model (experts 0). */
static int read_moe(struct reader *r, const struct tbl *model)
{
  static const char *const known[] = { "experts", "top_k", "ffn_dim", "layers", "aux_loss", "z_loss",
                                       "capacity_factor", NULL };
  struct plan_moe *e = &r->p->model.moe;
  struct tbl t;
  int present;
  memset(e, 0, sizeof *e);
  if (compile_open_section(r, model, "moe", &t, &present))
    return -1;
  if (!present)
    return 0;
  e->ffn_dim = r->p->model.ffn_dim;
  plan_fields_default(r->p, "model.moe"); /* aux_loss: Switch Transformer's coefficient */
  if (compile_check_fields(r, &t, known, "model.moe") || compile_read_field(r, &t, "experts", NULL) ||
      compile_read_field(r, &t, "top_k", NULL))
    return -1;
  if (e->top_k > e->experts)
    return compile_rfail(r, plan_where(r->p, "model.moe.top_k"), "model.moe.top_k = %d: more than model.moe.experts = %d; "
                         "each token goes to top_k of the experts, so 1 ≤ top_k ≤ %d", e->top_k, e->experts, e->experts);
  if (compile_read_field(r, &t, "ffn_dim", NULL) || compile_read_field(r, &t, "aux_loss", NULL) ||
      compile_read_field(r, &t, "z_loss", NULL) || compile_read_field(r, &t, "capacity_factor", NULL))
    return -1;
  char path[128], where[PLAN_PATH_MAX + 32];
  compile_get(r, &t, "layers", path, sizeof path, where, sizeof where);
  if (moe_layers_value(r, path, where))
    return -1;
  lua_pop(r->L, 2);
  return 0;
}

static int read_model(struct reader *r, const struct tbl *root)
{
  static const char *const known[] = { "family", "n_layers", "dim", "n_heads", "n_kv_heads", "ffn_dim",
                                       "vocab", "max_seq", "norm_eps", "rope_theta", "dropout",
                                       "tie_embeddings", "moe", NULL };
  struct plan_model *m = &r->p->model;
  struct tbl t;
  int present;
  if (compile_open_section(r, root, "model", &t, &present))
    return -1;
  if (!present)
    return compile_rfail(r, root->where, "model: missing; a plan needs a model (e.g. require(\"models.llama2\")[\"7b\"])");
  m->n_kv_heads = 0; /* not written: model.n_heads */
  int rc = compile_check_fields(r, &t, known, "model");
  for (int i = 0; i < 12 && !rc; i++) /* the scalar fields, in the order they are checked */
    rc = compile_read_field(r, &t, known[i], NULL);
  if (!rc && !(r->p->layers = calloc((size_t)m->n_layers, sizeof *r->p->layers)))
    return compile_rfail(r, root->where, "out of memory");
  if (!rc)
    rc = read_moe(r, &t);
  lua_pop(r->L, 1);
  if (!rc && m->n_kv_heads == 0)
    m->n_kv_heads = m->n_heads;
  return rc ? -1 : 0;
}

/* mesh.order: the four axes fastest-varying first, or the three of a plan written before context
 * parallelism, cp then placed right after tp (its default place); with cp = 1 its place changes
 * no rank. */
static int read_order(struct reader *r, struct plan_mesh *me, const char *path, const char *where)
{
  static const char *const axes[] = { "tp", "dp", "pp", "cp", NULL };
  char v[96];
  const int n = lua_type(r->L, -1) == LUA_TTABLE ? (int)lua_rawlen(r->L, -1) : 0;
  if (n != PLAN_N_AXES && n != PLAN_N_AXES - 1) {
    compile_describe(r->L, -1, v, sizeof v);
    return compile_rfail(r, where, "%s = %s: must list the axes \"tp\", \"cp\", \"dp\", \"pp\" once each (\"cp\" "
                         "may be left out: it then follows tp), fastest-varying first (default { \"tp\", \"cp\", "
                         "\"dp\", \"pp\" })", path, v);
  }
  int seen[PLAN_N_AXES] = { 0 }, k = 0;
  for (int i = 0; i < n; i++) {
    lua_rawgeti(r->L, -1, i + 1);
    int a;
    char ipath[160];
    snprintf(ipath, sizeof ipath, "%s[%d]", path, i + 1);
    if (compile_match_enum(r, -1, axes, ipath, where, "", &a))
      return -1;
    lua_pop(r->L, 1);
    if (seen[a]++)
      return compile_rfail(r, where, "%s: axis \"%s\" appears twice; list \"tp\", \"cp\", \"dp\", \"pp\" once "
                           "each", path, axes[a]);
    me->order[k++] = (enum plan_axis)a;
    if (a == PLAN_AXIS_TP && n == PLAN_N_AXES - 1)
      me->order[k++] = PLAN_AXIS_CP;
  }
  if (k != PLAN_N_AXES) /* three names, cp among them: one of tp, dp, pp is missing */
    return compile_rfail(r, where, "%s: lists three axes without \"tp\"; list \"tp\", \"cp\", \"dp\", \"pp\" "
                         "once each", path);
  return 0;
}

static int read_mesh(struct reader *r, const struct tbl *root, int world)
{
  static const char *const known[] = { "tp", "cp", "pp", "dp", "ep", "order", NULL };
  struct plan_mesh *me = &r->p->mesh;
  me->tp = me->pp = me->ep = me->cp = 1;
  me->dp_auto = 1;
  me->world = world;
  me->order[0] = PLAN_AXIS_TP;
  me->order[1] = PLAN_AXIS_CP;
  me->order[2] = PLAN_AXIS_DP;
  me->order[3] = PLAN_AXIS_PP;
  struct tbl t;
  int present;
  if (compile_open_section(r, root, "mesh", &t, &present))
    return -1;
  if (!present)
    return 0;
  /* ep: expert parallelism inside dp (plan.h); whether it divides dp and the experts is plan_validate's */
  if (compile_check_fields(r, &t, known, "mesh") || compile_read_field(r, &t, "tp", NULL) ||
      compile_read_field(r, &t, "pp", NULL) || compile_read_field(r, &t, "ep", NULL) ||
      compile_read_field(r, &t, "cp", NULL))
    return -1;
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = compile_get(r, &t, "dp", path, sizeof path, where, sizeof where);
  long long dp;
  if (type == LUA_TSTRING && strcmp(lua_tostring(r->L, -1), "auto") == 0) {
    me->dp_auto = 1;
  } else if (type != LUA_TNIL) {
    if (!compile_is_integral(r->L, -1, &dp) || dp < 1 || dp > 1 << 20) {
      compile_describe(r->L, -1, v, sizeof v);
      return compile_rfail(r, where, "%s = %s: must be an integer ≥ 1 or \"auto\" (world / (tp × pp))", path, v);
    }
    me->dp_auto = 0;
    me->dp = (int)dp;
  }
  lua_pop(r->L, 1);
  type = compile_get(r, &t, "order", path, sizeof path, where, sizeof where);
  if (type != LUA_TNIL && read_order(r, me, path, where))
    return -1;
  lua_pop(r->L, 2);
  return 0;
}

/* Each item of the list at the stack's top through one(r, "path[i]", the item's place), the list
 * popped after. */
static int each_item(struct reader *r, const char *path, const char *where,
                     int (*one)(struct reader *, const char *, const char *))
{
  int n = (int)lua_rawlen(r->L, -1);
  for (int i = 1; i <= n; i++) {
    char item[160], item_where[PLAN_PATH_MAX + 32];
    snprintf(item, sizeof item, "%s[%d]", path, i);
    if (!sandbox_where(r->L, lua_gettop(r->L), NULL, i, item_where, sizeof item_where))
      snprintf(item_where, sizeof item_where, "%s", where);
    lua_rawgeti(r->L, -1, i);
    if (one(r, item, item_where))
      return -1;
  }
  lua_pop(r->L, 1);
  return 0;
}

/* The field name at the stack's top, one of the compared fields' (plan.h), into the plan's
 * checkpoint.allow_changes bits. */
static int allow_one(struct reader *r, const char *path, const char *where)
{
  const char *names[PLAN_N_RESUME_NAMES + 1];
  for (int i = 0; i <= PLAN_N_RESUME_NAMES; i++)
    names[i] = plan_resume_field_name(i);
  int k;
  if (compile_match_enum(r, -1, names, path, where, " (the fields a resume compares)", &k))
    return -1;
  r->p->checkpoint.allow_changes |= (uint32_t)1 << k;
  lua_pop(r->L, 1);
  return 0;
}

/* checkpoint.allow_changes: a list of the fields a resume may find changed, or one name
 * (--set checkpoint.allow_changes=NAME). */
static int read_allow_changes(struct reader *r, const struct tbl *t)
{
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = compile_get(r, t, "allow_changes", path, sizeof path, where, sizeof where);
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    return 0;
  }
  if (type == LUA_TSTRING)
    return allow_one(r, path, where);
  if (type != LUA_TTABLE) {
    compile_describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    return compile_rfail(r, where, "%s = %s: must be a list of field names, e.g. { \"train.steps\", "
                         "\"optimizer.lr\" }", path, v);
  }
  return each_item(r, path, where, allow_one);
}

/* One data.text entry at the stack's top (popped): a non-empty path. */
static int text_one(struct reader *r, const char *path, const char *where)
{
  struct plan *p = r->p;
  char v[96];
  if (lua_type(r->L, -1) != LUA_TSTRING || !lua_rawlen(r->L, -1)) {
    compile_describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    return compile_rfail(r, where, "%s = %s: must be the path of a text file", path, v);
  }
  size_t len;
  const char *s = lua_tolstring(r->L, -1, &len);
  if (p->data.n_text == PLAN_TEXT_FILES_MAX || len >= PLAN_PATH_MAX) {
    lua_pop(r->L, 1);
    return compile_rfail(r, where, "%s: %s (at most %d files of %d bytes)", path, len >= PLAN_PATH_MAX ?
                         "the path is too long" : "too many files; join them into fewer", PLAN_TEXT_FILES_MAX,
                         PLAN_PATH_MAX - 1);
  }
  if (len >= 6 && !strcmp(s + len - 6, ".jsonl")) { /* one document a file here, not one a line */
    char shown[PLAN_PATH_MAX];
    snprintf(shown, sizeof shown, "%s", s);
    lua_pop(r->L, 1);
    return compile_rfail(r, where, "%s = \"%s\": data.text reads each file as one document of plain text; "
                         "make a token file of a .jsonl with tycho tokenize and give it as data.train", path, shown);
  }
  memcpy(p->data.text[p->data.n_text++], s, len + 1);
  lua_pop(r->L, 1);
  return 0;
}

/* data.text: a list of text files (each one document), or one path (--set data.text=PATH). */
static int read_text_files(struct reader *r, const struct tbl *t)
{
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  r->p->data.n_text = 0;
  int type = compile_get(r, t, "text", path, sizeof path, where, sizeof where);
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    return 0;
  }
  if (type == LUA_TSTRING)
    return text_one(r, path, where);
  if (type != LUA_TTABLE || !lua_rawlen(r->L, -1)) {
    compile_describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    return compile_rfail(r, where, "%s = %s: must be a list of text files, e.g. { \"a.txt\", \"b.txt\" }", path, v);
  }
  return each_item(r, path, where, text_one);
}

/* train.sample = { prompt = ..., max_tokens, temperature, top_k, seed }: the table's fields. */
static int read_sample(struct reader *r, const struct tbl *train)
{
  static const char *const known[] = { "prompt", "max_tokens", "temperature", "top_k", "seed", NULL };
  struct tbl t;
  int present;
  r->p->train.sample.given = 0;
  if (compile_open_section(r, train, "sample", &t, &present))
    return -1;
  if (!present)
    return 0;
  if (compile_check_fields(r, &t, known, "train.sample"))
    return -1;
  for (int i = 0; known[i]; i++)
    if (compile_read_field(r, &t, known[i], NULL))
      return -1;
  r->p->train.sample.given = 1;
  lua_pop(r->L, 1);
  return 0;
}

static int read_simple_sections(struct reader *r, const struct tbl *root)
{
  struct plan *p = r->p;
  struct tbl t;
  int present;

  static const char *const sched_known[] = { "kind", NULL };
  if (compile_open_section(r, root, "schedule", &t, &present))
    return -1;
  if (present) {
    if (compile_check_fields(r, &t, sched_known, "schedule") || compile_read_field(r, &t, "kind", NULL))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const batch_known[] = { "global", "micro", "seq", NULL };
  if (compile_open_section(r, root, "batch", &t, &present))
    return -1;
  if (!present)
    return compile_rfail(r, root->where, "batch: missing; a plan needs batch = { global = ..., micro = ..., seq = ... }");
  if (compile_check_fields(r, &t, batch_known, "batch") || compile_read_field(r, &t, "global", NULL) ||
      compile_read_field(r, &t, "micro", NULL) || compile_read_field(r, &t, "seq", NULL))
    return -1;
  lua_pop(r->L, 1);

  static const char *const prec_known[] = { "compute", "grads", "master", NULL };
  if (compile_open_section(r, root, "precision", &t, &present))
    return -1;
  if (present) {
    if (compile_check_fields(r, &t, prec_known, "precision") || compile_read_field(r, &t, "compute", NULL) ||
        compile_read_field(r, &t, "grads", NULL) || compile_read_field(r, &t, "master", NULL))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const opt_known[] = { "kind", "lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip", NULL };
  if (compile_open_section(r, root, "optimizer", &t, &present))
    return -1;
  if (present) {
    int rc = compile_check_fields(r, &t, opt_known, "optimizer");
    for (int i = 0; opt_known[i] && !rc; i++)
      rc = compile_read_field(r, &t, opt_known[i], NULL);
    if (rc)
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const lrs_known[] = { "warmup", "decay", "decay_steps", "min_lr", NULL };
  if (compile_open_section(r, root, "lr_schedule", &t, &present))
    return -1;
  if (present) {
    int rc = compile_check_fields(r, &t, lrs_known, "lr_schedule");
    for (int i = 0; lrs_known[i] && !rc; i++)
      rc = compile_read_field(r, &t, lrs_known[i], NULL);
    if (rc)
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const seeds_known[] = { "global", "model", "data", "dropout", NULL };
  for (int s = 0; s < PLAN_N_SEEDS; s++)
    p->seeds.derived[s] = 1;
  if (compile_open_section(r, root, "seeds", &t, &present))
    return -1;
  if (present) {
    if (compile_check_fields(r, &t, seeds_known, "seeds") || compile_read_field(r, &t, "global", NULL))
      return -1;
    for (int s = 0; s < PLAN_N_SEEDS; s++) {
      int given;
      if (compile_read_field(r, &t, plan_seed_name(s), &given))
        return -1;
      p->seeds.derived[s] = !given;
    }
    lua_pop(r->L, 1);
  }

  static const char *const data_known[] = { "train", "val", "shuffle", "synthetic", "text", "tokenizer",
                                             "val_fraction", "fetch", NULL };
  if (compile_open_section(r, root, "data", &t, &present))
    return -1;
  if (present) {
    int given;
    if (compile_check_fields(r, &t, data_known, "data") || compile_read_field(r, &t, "train", NULL) ||
        compile_read_field(r, &t, "val", NULL) || compile_read_field(r, &t, "shuffle", NULL) ||
        compile_read_field(r, &t, "synthetic", &given) || compile_read_field(r, &t, "tokenizer", NULL) ||
        compile_read_field(r, &t, "val_fraction", NULL) || compile_read_field(r, &t, "fetch", NULL) ||
        read_text_files(r, &t))
      return -1;
    if (given && (p->data.train[0] || p->data.val[0]))
      return compile_rfail(r, plan_where(p, "data.synthetic"), "data.synthetic = \"%s\": a synthetic corpus replaces "
                           "data.train and data.val; give one or the other", p->data.synthetic);
    if (p->data.n_text && (given || p->data.train[0] || p->data.val[0]))
      return compile_rfail(r, plan_where(p, "data.text"), "data.text: text to tokenize replaces %s; give one or the other",
                           given ? "data.synthetic" : "data.train and data.val");
    if (p->data.n_text && !p->data.tokenizer[0])
      return compile_rfail(r, plan_where(p, "data.text"), "data.text: no data.tokenizer; give the tokenizer.json "
                           "(or its folder) to tokenize the text with");
    if (!p->data.n_text && p->data.tokenizer[0])
      return compile_rfail(r, plan_where(p, "data.tokenizer"), "data.tokenizer: given without data.text (the text "
                           "files it tokenizes)");
    lua_pop(r->L, 1);
  }

  static const char *const init_known[] = { "from", NULL };
  if (compile_open_section(r, root, "init", &t, &present))
    return -1;
  if (present) {
    if (compile_check_fields(r, &t, init_known, "init") || compile_read_field(r, &t, "from", NULL))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const export_known[] = { "path", "every", "format", "shard_mb", NULL };
  if (compile_open_section(r, root, "export", &t, &present))
    return -1;
  if (present) {
    int shard_given = 0;
    if (compile_check_fields(r, &t, export_known, "export") || compile_read_field(r, &t, "path", NULL) ||
        compile_read_field(r, &t, "every", NULL) || compile_read_field(r, &t, "format", NULL) ||
        compile_read_field(r, &t, "shard_mb", &shard_given))
      return -1;
    /* a single file has no shards: the size would be accepted and do nothing */
    if (shard_given && strcmp(r->p->export_.format, "hf") != 0)
      return compile_rfail(r, plan_where(r->p, "export.shard_mb"), "export.shard_mb is the shard size of a "
                           "Hugging Face folder; set export.format = \"hf\", or leave shard_mb out (a %s export "
                           "is one file)", r->p->export_.format);
    lua_pop(r->L, 1);
  }

  static const char *const train_known[] = { "steps", "eval_every", "eval_batches", "max_loss_jump", "sample", NULL };
  if (compile_open_section(r, root, "train", &t, &present))
    return -1;
  if (present) {
    int rc = compile_check_fields(r, &t, train_known, "train");
    for (int i = 0; train_known[i] && strcmp(train_known[i], "sample") && !rc; i++)
      rc = compile_read_field(r, &t, train_known[i], NULL);
    if (rc || read_sample(r, &t))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const ckpt_known[] = { "dir", "every", "keep", "async", "allow_changes", NULL };
  if (compile_open_section(r, root, "checkpoint", &t, &present))
    return -1;
  if (present) {
    if (compile_check_fields(r, &t, ckpt_known, "checkpoint") || compile_read_field(r, &t, "dir", NULL) ||
        compile_read_field(r, &t, "every", NULL) || compile_read_field(r, &t, "keep", NULL) ||
        compile_read_field(r, &t, "async", NULL) || read_allow_changes(r, &t))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const log_known[] = { "every", "metrics", "trace", "trace_steps", "tensorboard",
                                           "tensorboard_ranks", NULL };
  if (compile_open_section(r, root, "log", &t, &present))
    return -1;
  if (present) {
    int rc = compile_check_fields(r, &t, log_known, "log");
    for (int i = 0; log_known[i] && !rc; i++)
      rc = compile_read_field(r, &t, log_known[i], NULL);
    if (rc)
      return -1;
    lua_pop(r->L, 1);
  }
  return 0;
}

/* device: "auto", "cpu" or "cuda" (plan.h). "gpu" is refused like any other word, but the hint
 * names "cuda" (the closest word by spelling, "cpu", is the other device). */
static int read_device(struct reader *r, const struct tbl *root)
{
  char path[128], where[PLAN_PATH_MAX + 32];
  int type = compile_get(r, root, "device", path, sizeof path, where, sizeof where);
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    return 0;
  }
  if (type == LUA_TSTRING && strcasecmp(lua_tostring(r->L, -1), "gpu") == 0) {
    char v[96];
    compile_describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    return compile_rfail(r, where, "%s = %s: must be one of \"auto\", \"cpu\", \"cuda\" (did you mean \"cuda\"? "
                         "the GPU runtime is named by its backend)", path, v);
  }
  char msg[1536];
  int rc = plan_field_from_lua(r->L, -1, plan_field_find("device"), r->p, 0, msg, sizeof msg);
  lua_pop(r->L, 1);
  return rc ? compile_rfail(r, where, "%s", msg) : 0;
}

/* zero_every = { grads = "micro_batch" | "step", params = ... } (plan.h). Which stages and meshes
 * each choice is for, and the defaults, are plan_validate's. */
static int read_zero_every(struct reader *r, const struct tbl *root)
{
  static const char *const known[] = { "grads", "params", NULL };
  static const char *const names[] = { "micro_batch", "step", NULL };
  struct plan *p = r->p;
  struct tbl t;
  int present;
  if (compile_open_section(r, root, "zero_every", &t, &present))
    return -1;
  if (!present)
    return 0;
  int g = -1, q = -1;
  if (compile_check_fields(r, &t, known, "zero_every") || compile_read_enum(r, &t, "grads", names, &g) ||
      compile_read_enum(r, &t, "params", names, &q))
    return -1;
  lua_pop(r->L, 1);
  p->zero_every.grads_set = g >= 0;
  p->zero_every.params_set = q >= 0;
  p->zero_every.grads = g >= 0 ? (enum plan_zero_every)g : PLAN_ZERO_EVERY_MICRO_BATCH;
  p->zero_every.params = q >= 0 ? (enum plan_zero_every)q : PLAN_ZERO_EVERY_MICRO_BATCH;
  return 0;
}

/* ---- the compiler ---------------------------------------------------------------------- */

static int read_plan(struct reader *r, struct tbl *root, int world)
{
  static const char *const known[] = { "name", "model", "mesh", "stages", "virtual_stages", "tp_split",
                                       "sequence_parallel", "recompute", "zero", "zero_every", "bucket_mb", "schedule", "batch",
                                       "precision", "optimizer", "lr_schedule", "seeds", "data", "init",
                                       "export", "train", "checkpoint", "log", "device", "comm", NULL };
  if (compile_check_fields(r, root, known, "plan") || compile_read_field(r, root, "name", NULL) || read_model(r, root) ||
      read_mesh(r, root, world) || compile_read_field(r, root, "virtual_stages", NULL) ||
      compile_read_field(r, root, "sequence_parallel", NULL) || compile_read_field(r, root, "zero", NULL) ||
      read_zero_every(r, root) || compile_read_field(r, root, "bucket_mb", NULL) || read_device(r, root) ||
      compile_read_field(r, root, "comm", NULL) ||
      read_simple_sections(r, root))
    return -1;
  if (compile_read_stages(r, root) || compile_read_tp_split(r, root) || compile_read_recompute(r, root))
    return -1;
  return 0;
}

/* A plan without a name is named after its file. The name is UTF-8 like one a plan writes (it
 * goes into manifests and `check --json`): a byte of the file name that is not UTF-8 becomes
 * U+FFFD, and a long name is cut between characters. */
static void default_name(struct plan *p, const char *path)
{
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t len = strlen(base), used = 0;
  if (len > 4 && strcmp(base + len - 4, ".lua") == 0)
    len -= 4;
  for (size_t at = 0, step; at < len; at += step) {
    step = json_utf8_length((const unsigned char *)base + at, len - at);
    const char *piece = step ? base + at : "\xef\xbf\xbd";
    const size_t piece_len = step ? step : 3;
    if (used + piece_len >= sizeof p->name)
      break;
    memcpy(p->name + used, piece, piece_len);
    used += piece_len;
    step = step ? step : 1;
  }
  p->name[used] = 0;
}

/* Everything from the plan file's result to the filled struct plan, run under lua_pcall (see
 * read_protected): the plan's tables can have metatables whose __index raises, loops into the
 * instruction limit or runs out of memory, and a Lua error outside a protected call is a panic. */
struct compile_job {
  struct reader *r;
  const struct plan_compile_options *opt;
  const char *path;
  int rc;
};

static int read_protected(lua_State *L)
{
  struct compile_job *job = lua_touserdata(L, 1);
  struct reader *r = job->r;
  struct sandbox *sb = r->sb;
  const char *path = job->path;
  char *err = r->err;
  size_t n = r->n;
  struct plan *out = r->p;
  luaL_checkstack(L, 64, "reading the plan");
  job->rc = -1;
  if (!lua_istable(L, 2) || !tycho_is_plan(L, 2)) {
    char v[96];
    compile_describe(L, 2, v, sizeof v);
    snprintf(err, n, "%s: the plan file returned %s; it must end with return tycho.plan { ... }", path,
             lua_istable(L, 2) ? "a table not made by tycho.plan" : v);
    return 0;
  }
  struct tbl root = { 2, "", "" };
  if (!sandbox_where(L, root.idx, NULL, 0, root.where, sizeof root.where))
    snprintf(root.where, sizeof root.where, "%s", path);
  else { /* the constructor's own line, not a field's */
    const struct srcmap_record *rec = srcmap_get(&sb->map, sandbox_record_of(L, root.idx));
    if (rec && rec->line > 0)
      snprintf(root.where, sizeof root.where, "%s:%d", rec->where, rec->line);
  }
  plan_set_loc(out, "", root.where);
  snprintf(r->field_where, sizeof r->field_where, "%s", root.where);
  for (int i = 0; i < job->opt->n_sets; i++)
    if (compile_apply_set(r, root.idx, job->opt->sets[i]))
      return 0;
  default_name(out, path);
  plan_fields_default(out, NULL);
  if (read_plan(r, &root, job->opt->world))
    return 0;
  job->rc = 0;
  return 0;
}

/* "file:line: ..." already */
static int has_position(const char *msg)
{
  const char *c = strchr(msg, ':');
  if (!c || c == msg || c[1] < '0' || c[1] > '9')
    return 0;
  for (c++; *c >= '0' && *c <= '9'; c++)
    ;
  return *c == ':';
}

int plan_compile(const char *path, const struct plan_compile_options *opt, struct plan *out, char *err, size_t n)
{
  plan_init(out);
  snprintf(out->file, sizeof out->file, "%s", path);
  char dir[PLAN_PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash)
    *slash = 0;
  else
    snprintf(dir, sizeof dir, ".");
  static const struct sandbox_module modules[] = { { "tycho", luaopen_tycho } };
  struct sandbox_options so = { opt->unsafe, opt->memory_limit, opt->instruction_limit, dir, modules, 1 };
  struct sandbox sb;
  if (sandbox_open(&sb, &so, err, n))
    return -1;
  struct reader r = { sb.L, &sb, out, err, n, "", "" };
  int rc = -1;
  if (sandbox_dofile(&sb, path, 0, err, n))
    goto done;
  snprintf(r.field_where, sizeof r.field_where, "%s", path);
  struct compile_job job = { &r, opt, path, -1 };
  lua_pushcfunction(sb.L, read_protected);
  lua_pushlightuserdata(sb.L, &job);
  lua_pushvalue(sb.L, -3);
  char msg[1024];
  if (sandbox_pcall(&sb, 2, 0, msg, sizeof msg)) {
    if (has_position(msg))
      snprintf(err, n, "%s%s%s%s", msg, r.field[0] ? " (while reading plan field " : "", r.field, r.field[0] ? ")" : "");
    else
      snprintf(err, n, "%s: %s%s%s", r.field_where, r.field, r.field[0] ? ": " : "", msg);
    goto done;
  }
  if (job.rc)
    goto done;
  rc = plan_validate(out, err, n);
done:
  sandbox_close(&sb);
  if (rc)
    plan_free(out);
  return rc;
}
