/* The plan compiler (see compile.h): runs the plan file in the sandbox, applies --set
 * overrides, reads every field of the plan table against the schema of ../shared/PLAN.md
 * (unknown fields, types, ranges), calls the fields given as functions once per layer or
 * (layer, module), and hands the data to plan_validate. Every message starts with the file
 * and line the offending field was written on. */
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

#include "lua/sandbox.h"
#include "tycho_module.h"
#include "util/json.h"

struct reader {
  lua_State *L;
  struct sandbox *sb;
  struct plan *p;
  char *err;
  size_t n;
  char field[128];                 /* the field being read, for a Lua error raised meanwhile */
  char field_where[PLAN_PATH_MAX + 32];
};

/* A table being read: its stack index, its dotted path and where it was written. */
struct tbl {
  int idx;
  char path[64];
  char where[PLAN_PATH_MAX + 32];
};

static int rfail(struct reader *r, const char *where, const char *fmt, ...)
{
  int used = snprintf(r->err, r->n, "%s: ", where);
  if (used < 0 || (size_t)used >= r->n)
    return -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->err + used, r->n - (size_t)used, fmt, ap);
  va_end(ap);
  return -1;
}

/* The string at idx quoted for a message: its first 60 bytes or so, cut between characters, with
 * bytes that are not UTF-8 text (and control bytes) written as \xNN, so a message stays one line
 * of valid text whatever the plan wrote. */
static void quote_prefix(lua_State *L, int idx, char *buf, size_t n)
{
  size_t len, used = 0, at = 0;
  const char *s = lua_tolstring(L, idx, &len);
  if (n < 8) {
    snprintf(buf, n, "%s", "");
    return;
  }
  buf[used++] = '"';
  while (at < len && at < 60) {
    size_t step = json_utf8_length((const unsigned char *)s + at, len - at);
    const int escape = step == 0 || (unsigned char)s[at] < 0x20 || s[at] == 0x7f;
    if (used + (escape ? 4 : step) + 5 > n) /* room for '..."' and the NUL */
      break;
    if (escape) {
      used += (size_t)snprintf(buf + used, n - used, "\\x%02x", (unsigned char)s[at]);
      step = 1;
    } else {
      memcpy(buf + used, s + at, step);
      used += step;
    }
    at += step;
  }
  snprintf(buf + used, n - used, "%s\"", at < len ? "..." : "");
}

static const char *describe(lua_State *L, int idx, char *buf, size_t n)
{
  switch (lua_type(L, idx)) {
  case LUA_TNIL: snprintf(buf, n, "nil"); break;
  case LUA_TBOOLEAN: snprintf(buf, n, "%s", lua_toboolean(L, idx) ? "true" : "false"); break;
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx))
      snprintf(buf, n, "%lld", (long long)lua_tointeger(L, idx));
    else
      snprintf(buf, n, "%.14g", lua_tonumber(L, idx));
    break;
  case LUA_TSTRING: quote_prefix(L, idx, buf, n); break;
  case LUA_TTABLE: snprintf(buf, n, "a table"); break;
  case LUA_TFUNCTION: snprintf(buf, n, "a function"); break;
  default: snprintf(buf, n, "a %s", lua_typename(L, lua_type(L, idx))); break;
  }
  return buf;
}

static void join(char *out, size_t n, const char *path, const char *key)
{
  if (snprintf(out, n, "%s%s%s", path, path[0] ? "." : "", key) >= (int)n)
    out[n - 1] = 0; /* a very long key is cut in messages only */
}

/* Where key of t was written (its own line, else the table's). */
static void key_where(struct reader *r, const struct tbl *t, const char *key, char *out, size_t n)
{
  if (!sandbox_where(r->L, t->idx, key, 0, out, n))
    snprintf(out, n, "%s", t->where);
}

/* Edit distance counting a swap of neighbours as one edit ("1fb1" is one away from "1f1b"). */
static int edit_distance(const char *a, const char *b)
{
  int la = (int)strlen(a), lb = (int)strlen(b);
  if (la > 63 || lb > 63)
    return 99;
  int d[64][64];
  for (int i = 0; i <= la; i++)
    d[i][0] = i;
  for (int j = 0; j <= lb; j++)
    d[0][j] = j;
  for (int i = 1; i <= la; i++)
    for (int j = 1; j <= lb; j++) {
      int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      if (d[i - 1][j] + 1 < c)
        c = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < c)
        c = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
        c = d[i - 2][j - 2] + 1;
      d[i][j] = c;
    }
  return d[la][lb];
}

static const char *closest(const char *word, const char *const *names)
{
  const char *best = NULL;
  int best_d = 99;
  for (int i = 0; names[i]; i++) {
    int d = edit_distance(word, names[i]);
    if (d < best_d) {
      best_d = d;
      best = names[i];
    }
  }
  int len = (int)strlen(word);
  return best_d <= (len <= 4 ? 1 : len <= 8 ? 2 : 3) ? best : NULL;
}

static void list_names(const char *const *names, char *buf, size_t n)
{
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; names[i]; i++) {
    int w = snprintf(buf + used, n - used, "%s%s", i ? ", " : "", names[i]);
    if (w < 0 || (size_t)w >= n - used)
      break;
    used += (size_t)w;
  }
}

/* Every key of t must be one of `known`. */
static int check_fields(struct reader *r, const struct tbl *t, const char *const *known, const char *what)
{
  lua_State *L = r->L;
  lua_pushnil(L);
  while (lua_next(L, t->idx)) {
    lua_pop(L, 1);
    char where[PLAN_PATH_MAX + 32], v[96], list[512];
    if (lua_type(L, -1) != LUA_TSTRING) {
      if (lua_isinteger(L, -1) && !sandbox_where(L, t->idx, NULL, (long)lua_tointeger(L, -1), where, sizeof where))
        snprintf(where, sizeof where, "%s", t->where);
      else if (!lua_isinteger(L, -1))
        snprintf(where, sizeof where, "%s", t->where);
      list_names(known, list, sizeof list);
      describe(L, -1, v, sizeof v);
      lua_pop(L, 1);
      return rfail(r, where, "%s: unexpected entry [%s]; %s has named fields only (%s)",
                   t->path[0] ? t->path : "plan", v, what, list);
    }
    const char *key = lua_tostring(L, -1);
    int ok = 0;
    for (int i = 0; known[i]; i++)
      ok |= strcmp(known[i], key) == 0;
    if (!ok) {
      char path[128];
      join(path, sizeof path, t->path, key);
      key_where(r, t, key, where, sizeof where);
      const char *hint = closest(key, known);
      list_names(known, list, sizeof list);
      char mean[80] = "";
      if (hint)
        snprintf(mean, sizeof mean, " (did you mean \"%s\"?)", hint);
      lua_pop(L, 1);
      return rfail(r, where, "%s: unknown field%s; %s fields are %s", path, mean, what, list);
    }
  }
  return 0;
}

/* Pushes t[key] and records where the field was written. Returns its Lua type. */
static int get(struct reader *r, const struct tbl *t, const char *key, char *path, size_t pn,
               char *where, size_t wn)
{
  join(path, pn, t->path, key);
  key_where(r, t, key, where, wn);
  snprintf(r->field, sizeof r->field, "%s", path);
  snprintf(r->field_where, sizeof r->field_where, "%s", where);
  int type = lua_getfield(r->L, t->idx, key); /* may run the plan's __index */
  if (type != LUA_TNIL)
    plan_set_loc(r->p, path, where);
  return type;
}

static int is_integral(lua_State *L, int idx, long long *out)
{
  if (lua_isinteger(L, idx)) {
    *out = (long long)lua_tointeger(L, idx);
    return 1;
  }
  if (lua_type(L, idx) == LUA_TNUMBER) {
    double d = lua_tonumber(L, idx);
    if (d == floor(d) && fabs(d) < 9.2e18) {
      *out = (long long)d;
      return 1;
    }
  }
  return 0;
}

/* required: 1 error when missing; else the default is kept. */
static int read_ll(struct reader *r, const struct tbl *t, const char *key, long long min, long long max,
                   int required, long long *out)
{
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = get(r, t, key, path, sizeof path, where, sizeof where);
  long long x;
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    if (required)
      return rfail(r, t->where, "%s: missing; it is required (an integer ≥ %lld)", path, min);
    return 0;
  }
  if (!is_integral(r->L, -1, &x) || x < min || x > max) {
    describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    if (max >= (long long)1 << 52)
      return rfail(r, where, "%s = %s: must be an integer ≥ %lld", path, v, min);
    return rfail(r, where, "%s = %s: must be an integer in %lld..%lld", path, v, min, max);
  }
  lua_pop(r->L, 1);
  *out = x;
  return 0;
}

static int read_int(struct reader *r, const struct tbl *t, const char *key, int min, int max, int required, int *out)
{
  long long x = *out;
  if (read_ll(r, t, key, min, max, required, &x))
    return -1;
  *out = (int)x;
  return 0;
}

/* A number in [min, max] (or [min, max) when max_open). */
static int read_num(struct reader *r, const struct tbl *t, const char *key, double min, double max,
                    int min_open, int max_open, int required, double *out)
{
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = get(r, t, key, path, sizeof path, where, sizeof where);
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    if (required)
      return rfail(r, t->where, "%s: missing; it is required (a number)", path);
    return 0;
  }
  double x = lua_tonumber(r->L, -1);
  int bad = type != LUA_TNUMBER || isnan(x) || (min_open ? x <= min : x < min) || (max_open ? x >= max : x > max);
  if (bad) {
    describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    char range[96];
    if (isinf(max))
      snprintf(range, sizeof range, "a number %s %g", min_open ? ">" : "≥", min);
    else
      snprintf(range, sizeof range, "a number in %s%g, %g%s", min_open ? "(" : "[", min, max, max_open ? ")" : "]");
    return rfail(r, where, "%s = %s: must be %s", path, v, range);
  }
  lua_pop(r->L, 1);
  *out = x;
  return 0;
}

static int read_bool(struct reader *r, const struct tbl *t, const char *key, int *out)
{
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = get(r, t, key, path, sizeof path, where, sizeof where);
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    return 0;
  }
  if (type != LUA_TBOOLEAN) {
    describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    return rfail(r, where, "%s = %s: must be true or false", path, v);
  }
  *out = lua_toboolean(r->L, -1);
  lua_pop(r->L, 1);
  return 0;
}

static int read_str(struct reader *r, const struct tbl *t, const char *key, int required, char *out, size_t n)
{
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = get(r, t, key, path, sizeof path, where, sizeof where);
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    if (required)
      return rfail(r, t->where, "%s: missing; it is required (a string)", path);
    return 0;
  }
  size_t len;
  const char *s = lua_tolstring(r->L, -1, &len);
  if (type != LUA_TSTRING || len == 0 || len >= n) {
    describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    return rfail(r, where, "%s = %s: must be a non-empty string of at most %zu bytes", path, v, n - 1);
  }
  /* Names and paths reach checkpoint manifests and `check --json`, which are UTF-8 JSON that
   * tycho must read back: a string JSON cannot hold as it is is refused here, at its line. */
  for (size_t at = 0, step; at < len; at += step) {
    step = json_utf8_length((const unsigned char *)s + at, len - at);
    if (step == 0 || s[at] == 0) {
      const unsigned byte = (unsigned char)s[at];
      lua_pop(r->L, 1);
      if (byte == 0)
        return rfail(r, where, "%s has a NUL byte at offset %zu (names and paths end at NUL)", path, at);
      return rfail(r, where, "%s is not valid UTF-8 (byte 0x%02x at offset %zu)", path, byte, at);
    }
  }
  memcpy(out, s, len + 1);
  lua_pop(r->L, 1);
  return 0;
}

/* The value at idx must be one of names; its index in *out. */
static int match_enum(struct reader *r, int idx, const char *const *names, const char *path,
                      const char *where, const char *context, int *out)
{
  char v[96], list[768], mean[80] = "";
  if (lua_type(r->L, idx) == LUA_TSTRING) {
    const char *s = lua_tostring(r->L, idx);
    for (int i = 0; names[i]; i++)
      if (strcmp(names[i], s) == 0) {
        *out = i;
        return 0;
      }
    const char *hint = closest(s, names);
    if (hint)
      snprintf(mean, sizeof mean, " (did you mean \"%s\"?)", hint);
  }
  describe(r->L, idx, v, sizeof v);
  size_t used = 0;
  list[0] = 0;
  for (int i = 0; names[i]; i++) {
    int w = snprintf(list + used, sizeof list - used, "%s\"%s\"", i ? ", " : "", names[i]);
    if (w < 0 || (size_t)w >= sizeof list - used)
      break;
    used += (size_t)w;
  }
  return rfail(r, where, "%s = %s%s: must be one of %s%s", path, v, context, list, mean);
}

static int read_enum(struct reader *r, const struct tbl *t, const char *key, const char *const *names, int *out)
{
  char path[128], where[PLAN_PATH_MAX + 32];
  if (get(r, t, key, path, sizeof path, where, sizeof where) == LUA_TNIL) {
    lua_pop(r->L, 1);
    return 0;
  }
  int rc = match_enum(r, -1, names, path, where, "", out);
  lua_pop(r->L, 1);
  return rc;
}

/* Pushes the sub-table t[key] as a struct tbl; returns 0 (absent: *present = 0), -1 error. */
static int open_section(struct reader *r, const struct tbl *t, const char *key, struct tbl *sub, int *present)
{
  char v[96];
  join(sub->path, sizeof sub->path, t->path, key);
  key_where(r, t, key, sub->where, sizeof sub->where);
  snprintf(r->field, sizeof r->field, "%s", sub->path);
  snprintf(r->field_where, sizeof r->field_where, "%s", sub->where);
  int type = lua_getfield(r->L, t->idx, key); /* may run the plan's __index */
  *present = type != LUA_TNIL;
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    return 0;
  }
  plan_set_loc(r->p, sub->path, sub->where);
  if (type != LUA_TTABLE) {
    describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    return rfail(r, sub->where, "%s = %s: must be a table", sub->path, v);
  }
  sub->idx = lua_gettop(r->L);
  return 0;
}

/* Calls the function at fidx with args pushed by the caller; leaves one result. */
static int call_plan_function(struct reader *r, int fidx, int nargs, const char *what)
{
  lua_pushvalue(r->L, fidx);
  lua_insert(r->L, -1 - nargs);
  char msg[1024];
  if (sandbox_pcall(r->sb, nargs, 1, msg, sizeof msg) != 0) {
    snprintf(r->err, r->n, "%s (in %s)", msg, what);
    return -1;
  }
  return 0;
}

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
      if (call_plan_function(r, f, 1, what))
        return -1;
      if (!lua_isboolean(L, -1)) {
        describe(L, -1, v, sizeof v);
        return rfail(r, where, "%s: the function returned %s for layer %d; it must return true (the layer's "
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
      if (!is_integral(L, -1, &layer)) {
        describe(L, -1, v, sizeof v);
        return rfail(r, item_where, "%s[%d] = %s: must be a layer index (0-based)", path, i, v);
      }
      lua_pop(L, 1);
      if (layer < 0 || layer >= n_layers)
        return rfail(r, item_where, "%s[%d] = %lld: layer %lld does not exist; layers are 0..%d", path, i, layer,
                     layer, n_layers - 1);
      if (p->layers[layer].moe)
        return rfail(r, item_where, "%s[%d] = %lld: layer %lld appears twice; list each sparse layer once",
                     path, i, layer, layer);
      p->layers[layer].moe = 1;
    }
  } else {
    describe(L, -1, v, sizeof v);
    return rfail(r, where, "%s = %s: must be \"all\", a list of layer indices (0-based) or a "
                 "function(layer) -> boolean", path, v);
  }
  int sparse = 0;
  for (int l = 0; l < n_layers; l++)
    sparse += p->layers[l].moe;
  if (sparse == 0)
    return rfail(r, where, "%s selects no layer; list at least one layer, or leave model.moe out for a dense "
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
  if (open_section(r, model, "moe", &t, &present))
    return -1;
  if (!present)
    return 0;
  e->ffn_dim = r->p->model.ffn_dim;
  e->aux_loss = 0.01; /* Switch Transformer's coefficient */
  if (check_fields(r, &t, known, "model.moe") || read_int(r, &t, "experts", 1, 1 << 16, 1, &e->experts) ||
      read_int(r, &t, "top_k", 1, 1 << 16, 1, &e->top_k))
    return -1;
  if (e->top_k > e->experts)
    return rfail(r, plan_where(r->p, "model.moe.top_k"), "model.moe.top_k = %d: more than model.moe.experts = %d; "
                 "each token goes to top_k of the experts, so 1 ≤ top_k ≤ %d", e->top_k, e->experts, e->experts);
  if (read_int(r, &t, "ffn_dim", 1, 1 << 22, 0, &e->ffn_dim) ||
      read_num(r, &t, "aux_loss", 0, INFINITY, 0, 0, 0, &e->aux_loss) ||
      read_num(r, &t, "z_loss", 0, INFINITY, 0, 0, 0, &e->z_loss) ||
      read_num(r, &t, "capacity_factor", 0, INFINITY, 0, 0, 0, &e->capacity_factor))
    return -1;
  char path[128], where[PLAN_PATH_MAX + 32];
  get(r, &t, "layers", path, sizeof path, where, sizeof where);
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
  if (open_section(r, root, "model", &t, &present))
    return -1;
  if (!present)
    return rfail(r, root->where, "model: missing; a plan needs a model (e.g. require(\"models.llama2\")[\"7b\"])");
  m->norm_eps = 1e-5;
  m->rope_theta = 10000;
  m->n_kv_heads = 0;
  int rc = check_fields(r, &t, known, "model") || read_enum(r, &t, "family", families, &family) ||
           read_int(r, &t, "n_layers", 1, 100000, 1, &m->n_layers) ||
           read_int(r, &t, "dim", 1, 1 << 20, 1, &m->dim) ||
           read_int(r, &t, "n_heads", 1, 1 << 16, 1, &m->n_heads) ||
           read_int(r, &t, "n_kv_heads", 1, 1 << 16, 0, &m->n_kv_heads) ||
           read_int(r, &t, "ffn_dim", 1, 1 << 22, 1, &m->ffn_dim) ||
           read_int(r, &t, "vocab", 2, 1 << 24, 1, &m->vocab) ||
           read_int(r, &t, "max_seq", 1, 1 << 24, 1, &m->max_seq) ||
           read_num(r, &t, "norm_eps", 0, INFINITY, 1, 0, 0, &m->norm_eps) ||
           read_num(r, &t, "rope_theta", 0, INFINITY, 1, 0, 0, &m->rope_theta) ||
           read_num(r, &t, "dropout", 0, 1, 0, 1, 0, &m->dropout) ||
           read_bool(r, &t, "tie_embeddings", &m->tie_embeddings);
  if (!rc && !(r->p->layers = calloc((size_t)m->n_layers, sizeof *r->p->layers)))
    return rfail(r, root->where, "out of memory");
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
  if (open_section(r, root, "mesh", &t, &present))
    return -1;
  if (!present)
    return 0;
  /* ep: expert parallelism inside dp (plan.h); whether it divides dp and the experts is plan_validate's */
  if (check_fields(r, &t, known, "mesh") || read_int(r, &t, "tp", 1, 1 << 20, 0, &me->tp) ||
      read_int(r, &t, "pp", 1, 1 << 20, 0, &me->pp) || read_int(r, &t, "ep", 1, 1 << 20, 0, &me->ep))
    return -1;
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = get(r, &t, "dp", path, sizeof path, where, sizeof where);
  long long dp;
  if (type == LUA_TSTRING && strcmp(lua_tostring(r->L, -1), "auto") == 0) {
    me->dp_auto = 1;
  } else if (type != LUA_TNIL) {
    if (!is_integral(r->L, -1, &dp) || dp < 1 || dp > 1 << 20) {
      describe(r->L, -1, v, sizeof v);
      return rfail(r, where, "%s = %s: must be an integer ≥ 1 or \"auto\" (world / (tp × pp))", path, v);
    }
    me->dp_auto = 0;
    me->dp = (int)dp;
  }
  lua_pop(r->L, 1);
  type = get(r, &t, "order", path, sizeof path, where, sizeof where);
  if (type != LUA_TNIL) {
    int seen[PLAN_N_AXES] = { 0 };
    if (type != LUA_TTABLE || lua_rawlen(r->L, -1) != PLAN_N_AXES) {
      describe(r->L, -1, v, sizeof v);
      return rfail(r, where, "%s = %s: must list the three axes \"tp\", \"dp\", \"pp\" once each, "
                   "fastest-varying first (default { \"tp\", \"dp\", \"pp\" })", path, v);
    }
    for (int i = 0; i < PLAN_N_AXES; i++) {
      lua_rawgeti(r->L, -1, i + 1);
      int a;
      char ipath[160];
      snprintf(ipath, sizeof ipath, "%s[%d]", path, i + 1);
      if (match_enum(r, -1, axes, ipath, where, "", &a))
        return -1;
      lua_pop(r->L, 1);
      if (seen[a]++)
        return rfail(r, where, "%s: axis \"%s\" appears twice; list \"tp\", \"dp\", \"pp\" once each",
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
  if (match_enum(r, -1, names, path, where, " (the fields a resume compares)", &k))
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
  int type = get(r, t, "allow_changes", path, sizeof path, where, sizeof where);
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    return 0;
  }
  if (type == LUA_TSTRING)
    return allow_one(r, path, where);
  if (type != LUA_TTABLE) {
    describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    return rfail(r, where, "%s = %s: must be a list of field names, e.g. { \"train.steps\", "
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
  if (open_section(r, root, "schedule", &t, &present))
    return -1;
  if (present) {
    k = p->schedule;
    if (check_fields(r, &t, sched_known, "schedule") || read_enum(r, &t, "kind", sched_kinds, &k))
      return -1;
    p->schedule = (enum plan_schedule)k;
    lua_pop(r->L, 1);
  }

  static const char *const batch_known[] = { "global", "micro", "seq", NULL };
  p->batch.micro = 1;
  if (open_section(r, root, "batch", &t, &present))
    return -1;
  if (!present)
    return rfail(r, root->where, "batch: missing; a plan needs batch = { global = ..., micro = ..., seq = ... }");
  if (check_fields(r, &t, batch_known, "batch") || read_int(r, &t, "global", 1, 1 << 30, 1, &p->batch.global) ||
      read_int(r, &t, "micro", 1, 1 << 30, 0, &p->batch.micro) ||
      read_int(r, &t, "seq", 1, 1 << 24, 1, &p->batch.seq))
    return -1;
  lua_pop(r->L, 1);

  static const char *const prec_known[] = { "compute", "grads", "master", NULL };
  static const char *const dtypes[] = { "fp32", "bf16", "fp16", NULL };
  if (open_section(r, root, "precision", &t, &present))
    return -1;
  if (present) {
    int c = 0, g = 0, m = 0;
    if (check_fields(r, &t, prec_known, "precision") || read_enum(r, &t, "compute", dtypes, &c) ||
        read_enum(r, &t, "grads", dtypes, &g) || read_enum(r, &t, "master", dtypes, &m))
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
  if (open_section(r, root, "optimizer", &t, &present))
    return -1;
  if (present) {
    k = 0;
    if (check_fields(r, &t, opt_known, "optimizer") || read_enum(r, &t, "kind", opt_kinds, &k) ||
        read_num(r, &t, "lr", 0, INFINITY, 1, 0, 0, &p->optimizer.lr) ||
        read_num(r, &t, "beta1", 0, 1, 0, 1, 0, &p->optimizer.beta1) ||
        read_num(r, &t, "beta2", 0, 1, 0, 1, 0, &p->optimizer.beta2) ||
        read_num(r, &t, "eps", 0, INFINITY, 1, 0, 0, &p->optimizer.eps) ||
        read_num(r, &t, "weight_decay", 0, INFINITY, 0, 0, 0, &p->optimizer.weight_decay) ||
        read_num(r, &t, "grad_clip", 0, INFINITY, 0, 0, 0, &p->optimizer.grad_clip))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const lrs_known[] = { "warmup", "decay", "decay_steps", "min_lr", NULL };
  static const char *const decays[] = { "constant", "cosine", "linear", NULL };
  if (open_section(r, root, "lr_schedule", &t, &present))
    return -1;
  if (present) {
    k = 0;
    if (check_fields(r, &t, lrs_known, "lr_schedule") ||
        read_int(r, &t, "warmup", 0, 1 << 30, 0, &p->lr_schedule.warmup) ||
        read_enum(r, &t, "decay", decays, &k) ||
        read_ll(r, &t, "decay_steps", 1, (long long)1 << 53, 0, &p->lr_schedule.decay_steps) ||
        read_num(r, &t, "min_lr", 0, INFINITY, 0, 0, 0, &p->lr_schedule.min_lr))
      return -1;
    p->lr_schedule.decay = (enum plan_decay)k;
    lua_pop(r->L, 1);
  }

  static const char *const seeds_known[] = { "global", "model", "data", "dropout", NULL };
  p->seeds.global = 1234;
  for (int s = 0; s < PLAN_N_SEEDS; s++)
    p->seeds.derived[s] = 1;
  if (open_section(r, root, "seeds", &t, &present))
    return -1;
  if (present) {
    const long long max = ((long long)1 << 53) - 1;
    if (check_fields(r, &t, seeds_known, "seeds") || read_ll(r, &t, "global", 0, max, 0, &p->seeds.global))
      return -1;
    for (int s = 0; s < PLAN_N_SEEDS; s++) {
      long long v = -1;
      if (read_ll(r, &t, plan_seed_name(s), 0, max, 0, &v))
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
  if (open_section(r, root, "data", &t, &present))
    return -1;
  if (present) {
    k = 0;
    if (check_fields(r, &t, data_known, "data") ||
        read_str(r, &t, "train", 0, p->data.train, sizeof p->data.train) ||
        read_str(r, &t, "val", 0, p->data.val, sizeof p->data.val) ||
        read_bool(r, &t, "shuffle", &p->data.shuffle))
      return -1;
    char path[128], where[PLAN_PATH_MAX + 32];
    if (get(r, &t, "synthetic", path, sizeof path, where, sizeof where) != LUA_TNIL) {
      if (match_enum(r, -1, synthetic, path, where, "", &k))
        return -1;
      snprintf(p->data.synthetic, sizeof p->data.synthetic, "%s", synthetic[k]);
      if (p->data.train[0] || p->data.val[0])
        return rfail(r, where, "%s = \"%s\": a synthetic corpus replaces data.train and data.val; "
                     "give one or the other", path, synthetic[k]);
    }
    lua_pop(r->L, 2);
  }

  static const char *const init_known[] = { "from", NULL };
  if (open_section(r, root, "init", &t, &present))
    return -1;
  if (present) {
    if (check_fields(r, &t, init_known, "init") || read_str(r, &t, "from", 1, p->init.from, sizeof p->init.from))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const export_known[] = { "path", "every", NULL };
  if (open_section(r, root, "export", &t, &present))
    return -1;
  if (present) {
    if (check_fields(r, &t, export_known, "export") ||
        read_str(r, &t, "path", 1, p->export_.path, sizeof p->export_.path) ||
        read_int(r, &t, "every", 0, 1 << 30, 0, &p->export_.every))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const train_known[] = { "steps", "eval_every", "eval_batches", "max_loss_jump", NULL };
  p->train.steps = 1000;
  p->train.eval_batches = 10;
  if (open_section(r, root, "train", &t, &present))
    return -1;
  if (present) {
    if (check_fields(r, &t, train_known, "train") ||
        read_ll(r, &t, "steps", 1, (long long)1 << 53, 0, &p->train.steps) ||
        read_int(r, &t, "eval_every", 0, 1 << 30, 0, &p->train.eval_every) ||
        read_int(r, &t, "eval_batches", 0, 1 << 30, 0, &p->train.eval_batches) ||
        read_num(r, &t, "max_loss_jump", 0, INFINITY, 0, 1, 0, &p->train.max_loss_jump))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const ckpt_known[] = { "dir", "every", "keep", "async", "allow_changes", NULL };
  p->checkpoint.keep = 3;
  if (open_section(r, root, "checkpoint", &t, &present))
    return -1;
  if (present) {
    if (check_fields(r, &t, ckpt_known, "checkpoint") ||
        read_str(r, &t, "dir", 1, p->checkpoint.dir, sizeof p->checkpoint.dir) ||
        read_int(r, &t, "every", 0, 1 << 30, 0, &p->checkpoint.every) ||
        read_int(r, &t, "keep", 1, 1 << 20, 0, &p->checkpoint.keep) ||
        read_bool(r, &t, "async", &p->checkpoint.async) || read_allow_changes(r, &t))
      return -1;
    lua_pop(r->L, 1);
  }

  static const char *const log_known[] = { "every", "metrics", "trace", "trace_steps", NULL };
  p->log.every = 10;
  p->log.trace_steps = 5;
  if (open_section(r, root, "log", &t, &present))
    return -1;
  if (present) {
    if (check_fields(r, &t, log_known, "log") || read_int(r, &t, "every", 1, 1 << 30, 0, &p->log.every) ||
        read_str(r, &t, "metrics", 0, p->log.metrics, sizeof p->log.metrics) ||
        read_str(r, &t, "trace", 0, p->log.trace, sizeof p->log.trace) ||
        read_int(r, &t, "trace_steps", 1, 1 << 20, 0, &p->log.trace_steps))
      return -1;
    lua_pop(r->L, 1);
  }
  return 0;
}

/* ---- per-layer fields: stages, tp_split, recompute ------------------------------------ */

static int read_stages(struct reader *r, const struct tbl *root)
{
  struct plan *p = r->p;
  int L = p->model.n_layers, S = p->mesh.pp * p->virtual_stages;
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = get(r, root, "stages", path, sizeof path, where, sizeof where);
  p->stages_kind = PLAN_STAGES_EVEN;
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    return 0;
  }
  if (type == LUA_TSTRING) {
    static const char *const kinds[] = { "even", "balanced", NULL };
    int k;
    if (match_enum(r, -1, kinds, path, where, "", &k))
      return -1;
    p->stages_kind = k ? PLAN_STAGES_BALANCED : PLAN_STAGES_EVEN;
  } else if (type == LUA_TFUNCTION) {
    p->stages_kind = PLAN_STAGES_FUNCTION;
    p->stages_is_function = 1;
    int f = lua_gettop(r->L);
    for (int l = 0; l < L; l++) {
      char what[96];
      snprintf(what, sizeof what, "the stages function, called for layer %d", l);
      lua_pushinteger(r->L, l);
      if (call_plan_function(r, f, 1, what))
        return -1;
      long long s;
      if (!is_integral(r->L, -1, &s) || s < 0 || s >= S) {
        describe(r->L, -1, v, sizeof v);
        return rfail(r, where, "stages: the function returned %s for layer %d; it must return a stage "
                     "index in 0..%d (pp %d × virtual_stages %d)", v, l, S - 1, p->mesh.pp, p->virtual_stages);
      }
      p->layers[l].stage = (int)s;
      lua_pop(r->L, 1);
    }
  } else if (type == LUA_TTABLE) {
    p->stages_kind = PLAN_STAGES_LIST;
    struct tbl t = { lua_gettop(r->L), "stages", "" };
    snprintf(t.where, sizeof t.where, "%s", where);
    int n = (int)lua_rawlen(r->L, t.idx);
    if (n != S)
      return rfail(r, where, "stages: %d entries, but pp %d × virtual_stages %d = %d stages; give one "
                   "list of layers per stage", n, p->mesh.pp, p->virtual_stages, S);
    int next_layer = 0;
    for (int s = 0; s < S; s++) {
      char ewhere[PLAN_PATH_MAX + 32];
      if (!sandbox_where(r->L, t.idx, NULL, s + 1, ewhere, sizeof ewhere))
        snprintf(ewhere, sizeof ewhere, "%s", where);
      lua_rawgeti(r->L, t.idx, s + 1);
      if (!lua_istable(r->L, -1)) {
        describe(r->L, -1, v, sizeof v);
        return rfail(r, ewhere, "stages[%d] = %s: each stage is a list of layer indices (0-based) and "
                     "\"embed\" / \"head\"", s + 1, v);
      }
      int e = lua_gettop(r->L), m = (int)lua_rawlen(r->L, e), items = 0;
      for (int i = 1; i <= m; i++) {
        lua_rawgeti(r->L, e, i);
        long long layer;
        if (lua_type(r->L, -1) == LUA_TSTRING && strcmp(lua_tostring(r->L, -1), "embed") == 0) {
          if (s != 0 || next_layer != 0)
            return rfail(r, ewhere, "stages[%d]: \"embed\" belongs at the start of the first stage", s + 1);
        } else if (lua_type(r->L, -1) == LUA_TSTRING && strcmp(lua_tostring(r->L, -1), "head") == 0) {
          if (s != S - 1 || i != m)
            return rfail(r, ewhere, "stages[%d]: \"head\" belongs at the end of the last stage "
                         "(stages[%d])", s + 1, S);
        } else if (is_integral(r->L, -1, &layer)) {
          if (layer < 0 || layer >= L)
            return rfail(r, ewhere, "stages[%d]: layer %lld does not exist; layers are 0..%d", s + 1, layer, L - 1);
          if (layer < next_layer)
            return rfail(r, ewhere, "stages[%d]: layer %lld appears twice or out of order; every layer "
                         "goes to exactly one stage, in order", s + 1, layer);
          if (layer > next_layer)
            return rfail(r, ewhere, "stages[%d]: layer %d is missing (the list jumps to %lld); every "
                         "layer goes to exactly one stage, in order", s + 1, next_layer, layer);
          p->layers[next_layer++].stage = s;
        } else {
          describe(r->L, -1, v, sizeof v);
          return rfail(r, ewhere, "stages[%d][%d] = %s: must be a layer index (0-based), \"embed\" or "
                       "\"head\"", s + 1, i, v);
        }
        items++;
        lua_pop(r->L, 1);
      }
      if (items == 0)
        return rfail(r, ewhere, "stages[%d]: empty; every stage holds at least one layer (or embed/head)", s + 1);
      lua_pop(r->L, 1);
    }
    if (next_layer != L)
      return rfail(r, where, "stages: layers %d..%d are in no stage; every layer goes to exactly one stage",
                   next_layer, L - 1);
  } else {
    describe(r->L, -1, v, sizeof v);
    return rfail(r, where, "stages = %s: must be \"even\", \"balanced\", a list of stages or a "
                 "function(layer) -> stage", v);
  }
  lua_pop(r->L, 1);
  return 0;
}

static const char *const split_names[] = { "replicate", "column", "row", "vocab", NULL };
static const char *const module_names[] = { "embed", "q", "k", "v", "o", "gate", "up", "down", "head", NULL };

static int default_split(int mod)
{
  switch (mod) {
  case PLAN_MOD_EMBED: case PLAN_MOD_HEAD: return PLAN_SPLIT_VOCAB;
  case PLAN_MOD_O: case PLAN_MOD_DOWN: return PLAN_SPLIT_ROW;
  default: return PLAN_SPLIT_COLUMN;
  }
}

/* Checks a split value (at stack top) for a module; nil gives the default. */
static int split_value(struct reader *r, int mod, const char *where, const char *context, uint8_t *out)
{
  char path[64];
  snprintf(path, sizeof path, "tp_split.%s", module_names[mod]);
  if (lua_isnil(r->L, -1)) {
    *out = (uint8_t)default_split(mod);
    return 0;
  }
  int s;
  if (match_enum(r, -1, split_names, path, where, context, &s))
    return -1;
  int vocab_module = mod == PLAN_MOD_EMBED || mod == PLAN_MOD_HEAD;
  if (vocab_module && (s == PLAN_SPLIT_COLUMN || s == PLAN_SPLIT_ROW))
    return rfail(r, where, "%s = \"%s\"%s: the %s splits as \"vocab\" (rows of the vocabulary) or "
                 "\"replicate\"", path, split_names[s], context, mod == PLAN_MOD_EMBED ? "embedding" : "LM head");
  if (!vocab_module && s == PLAN_SPLIT_VOCAB)
    return rfail(r, where, "%s = \"vocab\"%s: only embed and head split by vocabulary; use \"column\", "
                 "\"row\" or \"replicate\"", path, context);
  *out = (uint8_t)s;
  return 0;
}

static int read_tp_split(struct reader *r, const struct tbl *root)
{
  struct plan *p = r->p;
  int L = p->model.n_layers;
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = get(r, root, "tp_split", path, sizeof path, where, sizeof where);
  if (type == LUA_TTABLE) {
    struct tbl t = { lua_gettop(r->L), "tp_split", "" };
    snprintf(t.where, sizeof t.where, "%s", where);
    if (check_fields(r, &t, module_names, "tp_split"))
      return -1;
    for (int mod = 0; mod < PLAN_N_MODULES; mod++) {
      char fpath[128], fwhere[PLAN_PATH_MAX + 32];
      get(r, &t, module_names[mod], fpath, sizeof fpath, fwhere, sizeof fwhere);
      uint8_t s;
      if (split_value(r, mod, fwhere, "", &s))
        return -1;
      lua_pop(r->L, 1);
      if (mod == PLAN_MOD_EMBED)
        p->embed_split = s;
      else if (mod == PLAN_MOD_HEAD)
        p->head_split = s;
      else
        for (int l = 0; l < L; l++)
          p->layers[l].split[mod] = s;
    }
  } else if (type == LUA_TFUNCTION) {
    p->tp_split_is_function = 1;
    int f = lua_gettop(r->L);
    for (int l = -1; l <= L; l++) { /* -1: embed, L: head; both called with layer = nil */
      int first = l < 0 ? PLAN_MOD_EMBED : l == L ? PLAN_MOD_HEAD : PLAN_LAYER_MOD_FIRST;
      int last = l < 0 ? PLAN_MOD_EMBED : l == L ? PLAN_MOD_HEAD : PLAN_LAYER_MOD_LAST;
      for (int mod = first; mod <= last; mod++) {
        char what[128], ctx[128];
        if (l < 0 || l == L) {
          snprintf(what, sizeof what, "the tp_split function, called for (nil, \"%s\")", module_names[mod]);
          snprintf(ctx, sizeof ctx, " (returned by the tp_split function for module \"%s\")", module_names[mod]);
          lua_pushnil(r->L);
        } else {
          snprintf(what, sizeof what, "the tp_split function, called for (%d, \"%s\")", l, module_names[mod]);
          snprintf(ctx, sizeof ctx, " (returned by the tp_split function for layer %d)", l);
          lua_pushinteger(r->L, l);
        }
        lua_pushstring(r->L, module_names[mod]);
        if (call_plan_function(r, f, 2, what))
          return -1;
        uint8_t s;
        if (split_value(r, mod, where, ctx, &s))
          return -1;
        lua_pop(r->L, 1);
        if (mod == PLAN_MOD_EMBED)
          p->embed_split = s;
        else if (mod == PLAN_MOD_HEAD)
          p->head_split = s;
        else
          p->layers[l].split[mod] = s;
      }
    }
  } else if (type == LUA_TNIL) {
    p->embed_split = PLAN_SPLIT_VOCAB;
    p->head_split = PLAN_SPLIT_VOCAB;
    for (int l = 0; l < L; l++)
      for (int mod = PLAN_LAYER_MOD_FIRST; mod <= PLAN_LAYER_MOD_LAST; mod++)
        p->layers[l].split[mod] = (uint8_t)default_split(mod);
  } else {
    describe(r->L, -1, v, sizeof v);
    return rfail(r, where, "tp_split = %s: must be a table of module = split (modules %s...) or a "
                 "function(layer, module) -> split", v, "embed, q, k, v, o, gate, up, down, head; ");
  }
  lua_pop(r->L, 1);
  return 0;
}

/* The recompute value at stack top → mask. */
static int recompute_value(struct reader *r, const char *where, const char *context, uint8_t *out)
{
  static const char *const parts[] = { "attn_norm", "attn_core", "attn", "mlp_norm", "mlp_act", "mlp", NULL };
  static const char *const words[] = { "none", "full", "attn_norm", "attn_core", "attn", "mlp_norm",
                                       "mlp_act", "mlp", NULL };
  char v[96];
  lua_State *L = r->L;
  if (lua_type(L, -1) == LUA_TSTRING) {
    int w;
    if (match_enum(r, -1, words, "recompute", where, context, &w))
      return -1;
    *out = w == 0 ? 0 : w == 1 ? PLAN_RC_FULL : (uint8_t)(1 << (w - 2));
    return 0;
  }
  if (lua_type(L, -1) == LUA_TTABLE) {
    int n = (int)lua_rawlen(L, -1);
    uint8_t mask = 0;
    for (int i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      int part;
      char path[32];
      snprintf(path, sizeof path, "recompute[%d]", i);
      if (match_enum(r, -1, parts, path, where, context, &part))
        return -1;
      mask |= (uint8_t)(1 << part);
      lua_pop(L, 1);
    }
    *out = mask;
    return 0;
  }
  describe(L, -1, v, sizeof v);
  return rfail(r, where, "recompute = %s%s: must be \"none\", \"full\", a list of parts (attn_norm, "
               "attn_core, attn, mlp_norm, mlp_act, mlp) or a function(layer) -> one of those", v, context);
}

static int read_recompute(struct reader *r, const struct tbl *root)
{
  struct plan *p = r->p;
  int L = p->model.n_layers;
  char path[128], where[PLAN_PATH_MAX + 32];
  int type = get(r, root, "recompute", path, sizeof path, where, sizeof where);
  if (type == LUA_TFUNCTION) {
    p->recompute_is_function = 1;
    int f = lua_gettop(r->L);
    for (int l = 0; l < L; l++) {
      char what[96], ctx[96];
      snprintf(what, sizeof what, "the recompute function, called for layer %d", l);
      snprintf(ctx, sizeof ctx, " (returned by the recompute function for layer %d)", l);
      lua_pushinteger(r->L, l);
      if (call_plan_function(r, f, 1, what))
        return -1;
      uint8_t mask = 0;
      if (!lua_isnil(r->L, -1) && recompute_value(r, where, ctx, &mask))
        return -1;
      p->layers[l].recompute = mask;
      lua_pop(r->L, 1);
    }
  } else if (type != LUA_TNIL) {
    uint8_t mask;
    if (recompute_value(r, where, "", &mask))
      return -1;
    for (int l = 0; l < L; l++)
      p->layers[l].recompute = mask;
  }
  lua_pop(r->L, 1);
  return 0;
}

/* ---- --set overrides ------------------------------------------------------------------ */

/* What a --set text means, read by one rule for the value pushed (push_set_value) and the value
 * written as Lua (set_value_as_lua): 'quoted' or "quoted" forces a string, a comma makes a
 * list (where allowed), then true/false, nil, an integer, a number, else a string. */
enum set_kind { SET_QUOTED, SET_LIST, SET_BOOLEAN, SET_NIL, SET_INTEGER, SET_NUMBER, SET_STRING };

static enum set_kind set_value_kind(const char *text, int allow_list, long long *integer, double *number)
{
  const size_t n = strlen(text);
  char *end;
  if (n >= 2 && (text[0] == '"' || text[0] == '\'') && text[n - 1] == text[0])
    return SET_QUOTED;
  if (allow_list && strchr(text, ','))
    return SET_LIST;
  if (strcmp(text, "true") == 0 || strcmp(text, "false") == 0)
    return SET_BOOLEAN;
  if (strcmp(text, "nil") == 0)
    return SET_NIL;
  *integer = strtoll(text, &end, 10);
  if (*text && *end == 0)
    return SET_INTEGER;
  *number = strtod(text, &end);
  if (*text && *end == 0)
    return SET_NUMBER;
  return SET_STRING;
}

/* The next non-empty item of a comma list at *s (at most 255 bytes of it) into item, *s moved
 * past it; 0 when the list has no more. */
static int set_list_next(const char **s, char item[256])
{
  while (*s) {
    const char *c = strchr(*s, ',');
    const size_t len = c ? (size_t)(c - *s) : strlen(*s);
    snprintf(item, 256, "%.*s", (int)(len < 255 ? len : 255), *s);
    *s = c ? c + 1 : NULL;
    if (item[0])
      return 1;
  }
  return 0;
}

/* Pushes the Lua value of a --set text (set_value_kind). */
static void push_set_value(lua_State *L, const char *text, int allow_list)
{
  long long integer = 0;
  double number = 0;
  char item[256];
  switch (set_value_kind(text, allow_list, &integer, &number)) {
  case SET_QUOTED: lua_pushlstring(L, text + 1, strlen(text) - 2); break;
  case SET_LIST: {
    lua_newtable(L);
    int i = 1;
    for (const char *s = text; set_list_next(&s, item);) {
      push_set_value(L, item, 0);
      lua_rawseti(L, -2, i++);
    }
    break;
  }
  case SET_BOOLEAN: lua_pushboolean(L, text[0] == 't'); break;
  case SET_NIL: lua_pushnil(L); break;
  case SET_INTEGER: lua_pushinteger(L, (lua_Integer)integer); break;
  case SET_NUMBER: lua_pushnumber(L, number); break;
  case SET_STRING: lua_pushstring(L, text); break;
  }
}

/* A Lua string literal of the n bytes at s, byte for byte. */
static void lua_literal(FILE *f, const char *s, size_t n)
{
  fputc('"', f);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20 || c >= 0x7f)
      fprintf(f, "\\%03u", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

/* The value push_set_value pushes, as Lua source. */
static void set_value_as_lua(FILE *f, const char *text, int allow_list)
{
  long long integer = 0;
  double number = 0;
  char item[256];
  switch (set_value_kind(text, allow_list, &integer, &number)) {
  case SET_QUOTED: lua_literal(f, text + 1, strlen(text) - 2); break;
  case SET_LIST:
    fputs("{ ", f);
    for (const char *s = text; set_list_next(&s, item);) {
      set_value_as_lua(f, item, 0);
      fputs(", ", f);
    }
    fputs("}", f);
    break;
  case SET_BOOLEAN: case SET_NIL: fputs(text, f); break;
  case SET_INTEGER:
    if (integer == LLONG_MIN) /* -9223372036854775808 would read as a float */
      fputs("math.mininteger", f);
    else
      fprintf(f, "%lld", integer);
    break;
  case SET_NUMBER:
    if (isnan(number))
      fputs("(0/0)", f);
    else if (isinf(number))
      fputs(number > 0 ? "(1/0)" : "(-1/0)", f);
    else
      fprintf(f, "%a", number); /* a hex float: the same double, and a float as lua_pushnumber's */
    break;
  case SET_STRING: lua_literal(f, text, strlen(text)); break;
  }
}

void plan_set_as_lua(FILE *f, const char *set)
{
  const char *eq = strchr(set, '=');
  if (!eq)
    return;
  fputs("set({ ", f);
  for (const char *seg = set; seg < eq;) {
    const char *dot = memchr(seg, '.', (size_t)(eq - seg));
    const size_t len = dot ? (size_t)(dot - seg) : (size_t)(eq - seg);
    char key[256], *end;
    snprintf(key, sizeof key, "%.*s", (int)(len < 255 ? len : 255), seg);
    long index = strtol(key, &end, 10);
    if (*end == 0 && index > 0) /* as apply_set reads a numeric component */
      fprintf(f, "%ld, ", index);
    else {
      lua_literal(f, key, strlen(key));
      fputs(", ", f);
    }
    seg += len + (dot ? 1 : 0);
    if (!dot)
      break;
  }
  fputs("}, ", f);
  if (eq[1] == '{') { /* a table constructor runs as --set runs it: with an empty environment */
    fputs("load(", f);
    lua_literal(f, "return ", 7);
    fputs(" .. ", f);
    lua_literal(f, eq + 1, strlen(eq + 1));
    fputs(", \"=--set\", \"t\", {})()", f);
  } else {
    set_value_as_lua(f, eq + 1, 1);
  }
  fputs(")", f);
  fprintf(f, " -- --set ");
  for (const char *c = set; *c; c++) /* the comment stays one line */
    fputc((unsigned char)*c < 0x20 ? '?' : *c, f);
  fputc('\n', f);
}

/* Pushes a --set value that starts with '{': a Lua table constructor, e.g.
 * --set 'stages={{"embed",0,1},{2,3,"head"}}'. It runs with an empty environment (no globals
 * to call) under the plan's memory and instruction limits. 0, or -1 with nothing pushed. */
static int push_set_table(struct reader *r, const char *text, const char *where)
{
  lua_State *L = r->L;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  luaL_addstring(&b, "return ");
  luaL_addstring(&b, text);
  luaL_pushresult(&b);
  size_t n;
  const char *chunk = lua_tolstring(L, -1, &n);
  int rc = luaL_loadbufferx(L, chunk, n, "=--set", "t");
  lua_remove(L, -2);
  if (rc == LUA_OK) {
    lua_newtable(L);
    if (!lua_setupvalue(L, -2, 1))
      lua_pop(L, 1);
    rc = lua_pcall(L, 0, 1, 0);
  }
  if (rc != LUA_OK || !lua_istable(L, -1)) {
    if (rc != LUA_OK && rc != LUA_ERRSYNTAX) { /* it ran and failed (a limit, an error): that, whole */
      rfail(r, where, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "an error");
      lua_pop(L, 1);
      return -1;
    }
    char v[96];
    if (rc == LUA_OK)
      describe(L, -1, v, sizeof v);
    else
      snprintf(v, sizeof v, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "an error");
    lua_pop(L, 1);
    return rfail(r, where, "a value that starts with '{' must be a Lua table constructor (%s%s)",
                 rc == LUA_OK ? "it gave " : "", v);
  }
  return 0;
}

static int apply_set(struct reader *r, int plan_idx, const char *set)
{
  lua_State *L = r->L;
  const char *eq = strchr(set, '=');
  if (!eq || eq == set)
    return rfail(r, "--set", "\"%s\": expected path.to.field=value (e.g. --set mesh.tp=2)", set);
  char path[256];
  snprintf(path, sizeof path, "%.*s", (int)(eq - set < 255 ? eq - set : 255), set);
  struct sandbox *sb = r->sb;
  char desc[512];
  snprintf(desc, sizeof desc, "--set %s", set);
  const char *where = srcmap_intern(&sb->map, desc);
  const size_t plen = strlen(path); /* strtok_r would read a..b as a.b: refuse empty components */
  if (path[0] == '.' || path[plen - 1] == '.' || strstr(path, ".."))
    return rfail(r, where, "%s: the path has an empty component", path);
  lua_pushvalue(L, plan_idx);
  char *save = NULL;
  char *seg = strtok_r(path, ".", &save);
  while (seg) {
    char *next = strtok_r(NULL, ".", &save);
    char *end;
    long index = strtol(seg, &end, 10);
    int numeric = *end == 0 && index > 0;
    /* the table receiving the key gets its own record, with this key set by --set */
    int id = srcmap_copy_record(&sb->map, sandbox_record_of(L, -1), where, 0);
    if (id >= 0) {
      int old = sandbox_record_of(L, -1);
      const struct srcmap_record *orec = srcmap_get(&sb->map, old);
      if (orec) {
        sb->map.records[id].where = orec->where;
        sb->map.records[id].line = orec->line;
      }
      srcmap_set_field(&sb->map, id, numeric ? NULL : seg, numeric ? index : 0, where, 0);
      sandbox_set_record(L, -1, id);
    }
    if (numeric)
      lua_pushinteger(L, index);
    else
      lua_pushstring(L, seg);
    if (!next) {
      if (eq[1] == '{') {
        if (push_set_table(r, eq + 1, where)) {
          lua_pop(L, 2);
          return -1;
        }
      } else {
        push_set_value(L, eq + 1, 1);
      }
      lua_rawset(L, -3);
      lua_pop(L, 1);
      return 0;
    }
    lua_pushvalue(L, -1);
    int type = lua_rawget(L, -3);
    if (type == LUA_TNIL) {
      lua_pop(L, 1);
      lua_newtable(L);
      lua_pushvalue(L, -2);
      lua_pushvalue(L, -2);
      lua_rawset(L, -5);
      lua_remove(L, -2);
    } else if (type != LUA_TTABLE) {
      char v[96];
      describe(L, -1, v, sizeof v);
      lua_pop(L, 3);
      return rfail(r, where, "%s is %s, not a table of fields", seg, v);
    } else {
      lua_remove(L, -2);
    }
    lua_remove(L, -2);
    seg = next;
  }
  lua_pop(L, 1);
  return rfail(r, where, "expected path.to.field=value");
}

/* device: "auto", "cpu" or "cuda" (plan.h). "gpu" is refused like any other word, but the hint
 * names "cuda" (the closest word by spelling, "cpu", is the other device). */
static int read_device(struct reader *r, const struct tbl *root)
{
  static const char *const devices[] = { "auto", "cpu", "cuda", NULL };
  char path[128], where[PLAN_PATH_MAX + 32];
  int type = get(r, root, "device", path, sizeof path, where, sizeof where);
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    return 0;
  }
  if (type == LUA_TSTRING && strcasecmp(lua_tostring(r->L, -1), "gpu") == 0) {
    char v[96];
    describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    return rfail(r, where, "%s = %s: must be one of \"auto\", \"cpu\", \"cuda\" (did you mean \"cuda\"? "
                 "the GPU runtime is named by its backend)", path, v);
  }
  int d = PLAN_DEVICE_AUTO;
  int rc = match_enum(r, -1, devices, path, where, "", &d);
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
  if (open_section(r, root, "zero_every", &t, &present))
    return -1;
  if (!present)
    return 0;
  int g = -1, q = -1;
  if (check_fields(r, &t, known, "zero_every") || read_enum(r, &t, "grads", names, &g) ||
      read_enum(r, &t, "params", names, &q))
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
  if (check_fields(r, root, known, "plan") ||
      read_str(r, root, "name", 0, p->name, sizeof p->name) || read_model(r, root) ||
      read_mesh(r, root, world) ||
      read_int(r, root, "virtual_stages", 1, 1 << 16, 0, &p->virtual_stages) ||
      read_bool(r, root, "sequence_parallel", &p->sequence_parallel) ||
      read_int(r, root, "zero", 0, 3, 0, &p->zero) || read_zero_every(r, root) ||
      read_num(r, root, "bucket_mb", 0, 1 << 20, 1, 0, 0, &p->bucket_mb) || read_device(r, root) ||
      read_simple_sections(r, root))
    return -1;
  if (read_stages(r, root) || read_tp_split(r, root) || read_recompute(r, root))
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
    describe(L, 2, v, sizeof v);
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
    if (apply_set(r, root.idx, job->opt->sets[i]))
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
