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
#include "lua/sandbox.h"
#include "tycho_module.h"
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
  e->aux_loss = 0.01; /* Switch Transformer's coefficient */
  if (compile_check_fields(r, &t, known, "model.moe") || compile_read_int(r, &t, "experts", 1, 1 << 16, 1, &e->experts) ||
      compile_read_int(r, &t, "top_k", 1, 1 << 16, 1, &e->top_k))
    return -1;
  if (e->top_k > e->experts)
    return compile_rfail(r, plan_where(r->p, "model.moe.top_k"), "model.moe.top_k = %d: more than model.moe.experts = %d; "
                         "each token goes to top_k of the experts, so 1 ≤ top_k ≤ %d", e->top_k, e->experts, e->experts);
  if (compile_read_int(r, &t, "ffn_dim", 1, 1 << 22, 0, &e->ffn_dim) ||
      compile_read_num(r, &t, "aux_loss", 0, INFINITY, 0, 0, 0, &e->aux_loss) ||
      compile_read_num(r, &t, "z_loss", 0, INFINITY, 0, 0, 0, &e->z_loss) ||
      compile_read_num(r, &t, "capacity_factor", 0, INFINITY, 0, 0, 0, &e->capacity_factor))
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
  static const char *const families[] = { "llama", NULL };
  struct plan_model *m = &r->p->model;
  struct tbl t;
  int present, family = 0;
  if (compile_open_section(r, root, "model", &t, &present))
    return -1;
  if (!present)
    return compile_rfail(r, root->where, "model: missing; a plan needs a model (e.g. require(\"models.llama2\")[\"7b\"])");
  m->norm_eps = 1e-5;
  m->rope_theta = 10000;
  m->n_kv_heads = 0;
  int rc = compile_check_fields(r, &t, known, "model") || compile_read_enum(r, &t, "family", families, &family) ||
           compile_read_int(r, &t, "n_layers", 1, 100000, 1, &m->n_layers) ||
           compile_read_int(r, &t, "dim", 1, 1 << 20, 1, &m->dim) ||
           compile_read_int(r, &t, "n_heads", 1, 1 << 16, 1, &m->n_heads) ||
           compile_read_int(r, &t, "n_kv_heads", 1, 1 << 16, 0, &m->n_kv_heads) ||
           compile_read_int(r, &t, "ffn_dim", 1, 1 << 22, 1, &m->ffn_dim) ||
           compile_read_int(r, &t, "vocab", 2, 1 << 24, 1, &m->vocab) ||
           compile_read_int(r, &t, "max_seq", 1, 1 << 24, 1, &m->max_seq) ||
           compile_read_num(r, &t, "norm_eps", 0, INFINITY, 1, 0, 0, &m->norm_eps) ||
           compile_read_num(r, &t, "rope_theta", 0, INFINITY, 1, 0, 0, &m->rope_theta) ||
           compile_read_num(r, &t, "dropout", 0, 1, 0, 1, 0, &m->dropout) ||
           compile_read_bool(r, &t, "tie_embeddings", &m->tie_embeddings);
  if (!rc && !(r->p->layers = calloc((size_t)m->n_layers, sizeof *r->p->layers)))
    return compile_rfail(r, root->where, "out of memory");
  if (!rc)
    rc = read_moe(r, &t);
  lua_pop(r->L, 1);
  snprintf(m->family, sizeof m->family, "%s", families[family]);
  if (!rc && m->n_kv_heads == 0)
    m->n_kv_heads = m->n_heads;
  return rc ? -1 : 0;
}

static int read_mesh(struct reader *r, const struct tbl *root, int world)
{
  static const char *const known[] = { "tp", "pp", "dp", "ep", "order", NULL };
  static const char *const axes[] = { "tp", "dp", "pp", NULL };
  struct plan_mesh *me = &r->p->mesh;
  me->tp = me->pp = me->ep = 1;
  me->dp_auto = 1;
  me->world = world;
  me->order[0] = PLAN_AXIS_TP;
  me->order[1] = PLAN_AXIS_DP;
  me->order[2] = PLAN_AXIS_PP;
  struct tbl t;
  int present;
  if (compile_open_section(r, root, "mesh", &t, &present))
    return -1;
  if (!present)
    return 0;
  /* ep: expert parallelism inside dp (plan.h); whether it divides dp and the experts is plan_validate's */
  if (compile_check_fields(r, &t, known, "mesh") || compile_read_int(r, &t, "tp", 1, 1 << 20, 0, &me->tp) ||
      compile_read_int(r, &t, "pp", 1, 1 << 20, 0, &me->pp) || compile_read_int(r, &t, "ep", 1, 1 << 20, 0, &me->ep))
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
  if (type != LUA_TNIL) {
    int seen[PLAN_N_AXES] = { 0 };
    if (type != LUA_TTABLE || lua_rawlen(r->L, -1) != PLAN_N_AXES) {
      compile_describe(r->L, -1, v, sizeof v);
      return compile_rfail(r, where, "%s = %s: must list the three axes \"tp\", \"dp\", \"pp\" once each, "
                           "fastest-varying first (default { \"tp\", \"dp\", \"pp\" })", path, v);
    }
    for (int i = 0; i < PLAN_N_AXES; i++) {
      lua_rawgeti(r->L, -1, i + 1);
      int a;
      char ipath[160];
      snprintf(ipath, sizeof ipath, "%s[%d]", path, i + 1);
      if (compile_match_enum(r, -1, axes, ipath, where, "", &a))
        return -1;
      lua_pop(r->L, 1);
      if (seen[a]++)
        return compile_rfail(r, where, "%s: axis \"%s\" appears twice; list \"tp\", \"dp\", \"pp\" once each",
                             path, axes[a]);
      me->order[i] = (enum plan_axis)a;
    }
  }
  lua_pop(r->L, 2);
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
  int n = (int)lua_rawlen(r->L, -1);
  for (int i = 1; i <= n; i++) {
    char item[160], item_where[PLAN_PATH_MAX + 32];
    snprintf(item, sizeof item, "%s[%d]", path, i);
    if (!sandbox_where(r->L, lua_gettop(r->L), NULL, i, item_where, sizeof item_where))
      snprintf(item_where, sizeof item_where, "%s", where);
    lua_rawgeti(r->L, -1, i);
    if (allow_one(r, item, item_where))
      return -1;
  }
  lua_pop(r->L, 1);
  return 0;
}

static int read_simple_sections(struct reader *r, const struct tbl *root)
{
  struct plan *p = r->p;
  struct tbl t;
  int present, k;

  static const char *const sched_known[] = { "kind", NULL };
  static const char *const sched_kinds[] = { "gpipe", "1f1b", "interleaved", NULL };
  p->schedule = PLAN_SCHED_1F1B;
  if (compile_open_section(r, root, "schedule", &t, &present))
    return -1;
  if (present) {
    k = p->schedule;
    if (compile_check_fields(r, &t, sched_known, "schedule") || compile_read_enum(r, &t, "kind", sched_kinds, &k))
      return -1;
    p->schedule = (enum plan_schedule)k;
    lua_pop(r->L, 1);
  }

  static const char *const batch_known[] = { "global", "micro", "seq", NULL };
  p->batch.micro = 1;
  if (compile_open_section(r, root, "batch", &t, &present))
    return -1;
  if (!present)
    return compile_rfail(r, root->where, "batch: missing; a plan needs batch = { global = ..., micro = ..., seq = ... }");
  if (compile_check_fields(r, &t, batch_known, "batch") || compile_read_int(r, &t, "global", 1, 1 << 30, 1, &p->batch.global) ||
      compile_read_int(r, &t, "micro", 1, 1 << 30, 0, &p->batch.micro) ||
      compile_read_int(r, &t, "seq", 1, 1 << 24, 1, &p->batch.seq))
    return -1;
  lua_pop(r->L, 1);

  static const char *const prec_known[] = { "compute", "grads", "master", NULL };
  static const char *const dtypes[] = { "fp32", "bf16", "fp16", NULL };
  if (compile_open_section(r, root, "precision", &t, &present))
    return -1;
  if (present) {
    int c = 0, g = 0, m = 0;
    if (compile_check_fields(r, &t, prec_known, "precision") || compile_read_enum(r, &t, "compute", dtypes, &c) ||
        compile_read_enum(r, &t, "grads", dtypes, &g) || compile_read_enum(r, &t, "master", dtypes, &m))
      return -1;
    p->precision.compute = (enum plan_dtype)c;
    p->precision.grads = (enum plan_dtype)g;
    p->precision.master = (enum plan_dtype)m;
    lua_pop(r->L, 1);
  }

  /* torch.optim.AdamW's defaults, and Megatron's default clipping at 1.0 */
  static const char *const opt_known[] = { "kind", "lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip", NULL };
  static const char *const opt_kinds[] = { "adamw", NULL };
  snprintf(p->optimizer.kind, sizeof p->optimizer.kind, "adamw");
  p->optimizer.lr = 1e-3;
  p->optimizer.beta1 = 0.9;
  p->optimizer.beta2 = 0.999;
  p->optimizer.eps = 1e-8;
  p->optimizer.weight_decay = 0.01;
  p->optimizer.grad_clip = 1.0;
  if (compile_open_section(r, root, "optimizer", &t, &present))
    return -1;
  if (present) {
    k = 0;
    if (compile_check_fields(r, &t, opt_known, "optimizer") || compile_read_enum(r, &t, "kind", opt_kinds, &k) ||
        compile_read_num(r, &t, "lr", 0, INFINITY, 1, 0, 0, &p->optimizer.lr) ||
        compile_read_num(r, &t, "beta1", 0, 1, 0, 1, 0, &p->optimizer.beta1) ||
        compile_read_num(r, &t, "beta2", 0, 1, 0, 1, 0, &p->optimizer.beta2) ||
        compile_read_num(r, &t, "eps", 0, INFINITY, 1, 0, 0, &p->optimizer.eps) ||
        compile_read_num(r, &t, "weight_decay", 0, INFINITY, 0, 0, 0, &p->optimizer.weight_decay) ||
        compile_read_num(r, &t, "grad_clip", 0, INFINITY, 0, 0, 0, &p->optimizer.grad_clip))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const lrs_known[] = { "warmup", "decay", "decay_steps", "min_lr", NULL };
  static const char *const decays[] = { "constant", "cosine", "linear", NULL };
  if (compile_open_section(r, root, "lr_schedule", &t, &present))
    return -1;
  if (present) {
    k = 0;
    if (compile_check_fields(r, &t, lrs_known, "lr_schedule") ||
        compile_read_int(r, &t, "warmup", 0, 1 << 30, 0, &p->lr_schedule.warmup) ||
        compile_read_enum(r, &t, "decay", decays, &k) ||
        compile_read_ll(r, &t, "decay_steps", 1, (long long)1 << 53, 0, &p->lr_schedule.decay_steps) ||
        compile_read_num(r, &t, "min_lr", 0, INFINITY, 0, 0, 0, &p->lr_schedule.min_lr))
      return -1;
    p->lr_schedule.decay = (enum plan_decay)k;
    lua_pop(r->L, 1);
  }

  static const char *const seeds_known[] = { "global", "model", "data", "dropout", NULL };
  p->seeds.global = 1234;
  for (int s = 0; s < PLAN_N_SEEDS; s++)
    p->seeds.derived[s] = 1;
  if (compile_open_section(r, root, "seeds", &t, &present))
    return -1;
  if (present) {
    const long long max = ((long long)1 << 53) - 1;
    if (compile_check_fields(r, &t, seeds_known, "seeds") || compile_read_ll(r, &t, "global", 0, max, 0, &p->seeds.global))
      return -1;
    for (int s = 0; s < PLAN_N_SEEDS; s++) {
      long long v = -1;
      if (compile_read_ll(r, &t, plan_seed_name(s), 0, max, 0, &v))
        return -1;
      if (v >= 0) {
        p->seeds.value[s] = v;
        p->seeds.derived[s] = 0;
      }
    }
    lua_pop(r->L, 1);
  }

  static const char *const data_known[] = { "train", "val", "shuffle", "synthetic", NULL };
  static const char *const synthetic[] = { "addition", NULL };
  if (compile_open_section(r, root, "data", &t, &present))
    return -1;
  if (present) {
    k = 0;
    if (compile_check_fields(r, &t, data_known, "data") ||
        compile_read_str(r, &t, "train", 0, p->data.train, sizeof p->data.train) ||
        compile_read_str(r, &t, "val", 0, p->data.val, sizeof p->data.val) ||
        compile_read_bool(r, &t, "shuffle", &p->data.shuffle))
      return -1;
    char path[128], where[PLAN_PATH_MAX + 32];
    if (compile_get(r, &t, "synthetic", path, sizeof path, where, sizeof where) != LUA_TNIL) {
      if (compile_match_enum(r, -1, synthetic, path, where, "", &k))
        return -1;
      snprintf(p->data.synthetic, sizeof p->data.synthetic, "%s", synthetic[k]);
      if (p->data.train[0] || p->data.val[0])
        return compile_rfail(r, where, "%s = \"%s\": a synthetic corpus replaces data.train and data.val; "
                             "give one or the other", path, synthetic[k]);
    }
    lua_pop(r->L, 2);
  }

  static const char *const init_known[] = { "from", NULL };
  if (compile_open_section(r, root, "init", &t, &present))
    return -1;
  if (present) {
    if (compile_check_fields(r, &t, init_known, "init") || compile_read_str(r, &t, "from", 1, p->init.from, sizeof p->init.from))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const export_known[] = { "path", "every", NULL };
  if (compile_open_section(r, root, "export", &t, &present))
    return -1;
  if (present) {
    if (compile_check_fields(r, &t, export_known, "export") ||
        compile_read_str(r, &t, "path", 1, p->export_.path, sizeof p->export_.path) ||
        compile_read_int(r, &t, "every", 0, 1 << 30, 0, &p->export_.every))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const train_known[] = { "steps", "eval_every", "eval_batches", "max_loss_jump", NULL };
  p->train.steps = 1000;
  p->train.eval_batches = 10;
  if (compile_open_section(r, root, "train", &t, &present))
    return -1;
  if (present) {
    if (compile_check_fields(r, &t, train_known, "train") ||
        compile_read_ll(r, &t, "steps", 1, (long long)1 << 53, 0, &p->train.steps) ||
        compile_read_int(r, &t, "eval_every", 0, 1 << 30, 0, &p->train.eval_every) ||
        compile_read_int(r, &t, "eval_batches", 0, 1 << 30, 0, &p->train.eval_batches) ||
        compile_read_num(r, &t, "max_loss_jump", 0, INFINITY, 0, 1, 0, &p->train.max_loss_jump))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const ckpt_known[] = { "dir", "every", "keep", "async", "allow_changes", NULL };
  p->checkpoint.keep = 3;
  if (compile_open_section(r, root, "checkpoint", &t, &present))
    return -1;
  if (present) {
    if (compile_check_fields(r, &t, ckpt_known, "checkpoint") ||
        compile_read_str(r, &t, "dir", 1, p->checkpoint.dir, sizeof p->checkpoint.dir) ||
        compile_read_int(r, &t, "every", 0, 1 << 30, 0, &p->checkpoint.every) ||
        compile_read_int(r, &t, "keep", 1, 1 << 20, 0, &p->checkpoint.keep) ||
        compile_read_bool(r, &t, "async", &p->checkpoint.async) || read_allow_changes(r, &t))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const log_known[] = { "every", "metrics", "trace", "trace_steps", NULL };
  p->log.every = 10;
  p->log.trace_steps = 5;
  if (compile_open_section(r, root, "log", &t, &present))
    return -1;
  if (present) {
    if (compile_check_fields(r, &t, log_known, "log") || compile_read_int(r, &t, "every", 1, 1 << 30, 0, &p->log.every) ||
        compile_read_str(r, &t, "metrics", 0, p->log.metrics, sizeof p->log.metrics) ||
        compile_read_str(r, &t, "trace", 0, p->log.trace, sizeof p->log.trace) ||
        compile_read_int(r, &t, "trace_steps", 1, 1 << 20, 0, &p->log.trace_steps))
      return -1;
    lua_pop(r->L, 1);
  }
  return 0;
}

/* device: "auto", "cpu" or "cuda" (plan.h). "gpu" is refused like any other word, but the hint
 * names "cuda" (the closest word by spelling, "cpu", is the other device). */
static int read_device(struct reader *r, const struct tbl *root)
{
  static const char *const devices[] = { "auto", "cpu", "cuda", NULL };
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
  int d = PLAN_DEVICE_AUTO;
  int rc = compile_match_enum(r, -1, devices, path, where, "", &d);
  lua_pop(r->L, 1);
  r->p->device = (enum plan_device)d;
  return rc;
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
                                       "export", "train", "checkpoint", "log", "device", NULL };
  struct plan *p = r->p;
  if (compile_check_fields(r, root, known, "plan") ||
      compile_read_str(r, root, "name", 0, p->name, sizeof p->name) || read_model(r, root) ||
      read_mesh(r, root, world) ||
      compile_read_int(r, root, "virtual_stages", 1, 1 << 16, 0, &p->virtual_stages) ||
      compile_read_bool(r, root, "sequence_parallel", &p->sequence_parallel) ||
      compile_read_int(r, root, "zero", 0, 3, 0, &p->zero) || read_zero_every(r, root) ||
      compile_read_num(r, root, "bucket_mb", 0, 1 << 20, 1, 0, 0, &p->bucket_mb) || read_device(r, root) ||
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
  out->virtual_stages = 1;
  out->bucket_mb = 25;
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
