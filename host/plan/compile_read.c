/* The plan compiler's field readers (see compile.c): one field of a plan table read and checked
 * against the schema (type, range, one of a list of names, unknown fields with a "did you mean"),
 * with messages that quote the value and start with the file and line the field was written
 * on, and the call of a field given as a function. */
#include <lauxlib.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"
#include "fields.h"
#include "util/json.h"

int compile_rfail(struct reader *r, const char *where, const char *fmt, ...)
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

const char *compile_describe(lua_State *L, int idx, char *buf, size_t n)
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

static const char *closest(const char *word, const char *const *names)
{
  return plan_field_closest(word, names);
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
int compile_check_fields(struct reader *r, const struct tbl *t, const char *const *known, const char *what)
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
      compile_describe(L, -1, v, sizeof v);
      lua_pop(L, 1);
      return compile_rfail(r, where, "%s: unexpected entry [%s]; %s has named fields only (%s)",
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
      return compile_rfail(r, where, "%s: unknown field%s; %s fields are %s", path, mean, what, list);
    }
  }
  return 0;
}

/* Pushes t[key] and records where the field was written. Returns its Lua type. */
int compile_get(struct reader *r, const struct tbl *t, const char *key, char *path, size_t pn,
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

int compile_is_integral(lua_State *L, int idx, long long *out)
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

/* The checks of one value by type, shared by the compiler's readers and plan_field_from_lua
 * (t:set): 0, or -1 with "<path> = <value>: must be ..." in err, without the place. */
static int check_ll(lua_State *L, int idx, const char *path, long long min, long long max, long long *out, char *err,
                    size_t n)
{
  char v[96];
  long long x;
  if (!compile_is_integral(L, idx, &x) || x < min || x > max) {
    compile_describe(L, idx, v, sizeof v);
    if (max >= (long long)1 << 52)
      snprintf(err, n, "%s = %s: must be an integer ≥ %lld", path, v, min);
    else
      snprintf(err, n, "%s = %s: must be an integer in %lld..%lld", path, v, min, max);
    return -1;
  }
  *out = x;
  return 0;
}

/* A number in [min, max] (or with either end open). */
static int check_num(lua_State *L, int idx, const char *path, double min, double max, int min_open, int max_open,
                     double *out, char *err, size_t n)
{
  char v[96];
  double x = lua_tonumber(L, idx);
  if (lua_type(L, idx) != LUA_TNUMBER || isnan(x) || (min_open ? x <= min : x < min) || (max_open ? x >= max : x > max)) {
    compile_describe(L, idx, v, sizeof v);
    char range[96];
    if (isinf(max))
      snprintf(range, sizeof range, "a number %s %g", min_open ? ">" : "≥", min);
    else
      snprintf(range, sizeof range, "a number in %s%g, %g%s", min_open ? "(" : "[", min, max, max_open ? ")" : "]");
    snprintf(err, n, "%s = %s: must be %s", path, v, range);
    return -1;
  }
  *out = x;
  return 0;
}

static int check_bool(lua_State *L, int idx, const char *path, int *out, char *err, size_t n)
{
  char v[96];
  if (lua_type(L, idx) != LUA_TBOOLEAN) {
    compile_describe(L, idx, v, sizeof v);
    snprintf(err, n, "%s = %s: must be true or false", path, v);
    return -1;
  }
  *out = lua_toboolean(L, idx);
  return 0;
}

static int check_str(lua_State *L, int idx, const char *path, char *out, size_t size, char *err, size_t n)
{
  char v[96];
  size_t len = 0;
  const int type = lua_type(L, idx);
  const char *s = lua_tolstring(L, idx, &len); /* a number becomes its text, and is quoted so */
  if (type != LUA_TSTRING || len == 0 || len >= size) {
    compile_describe(L, idx, v, sizeof v);
    snprintf(err, n, "%s = %s: must be a non-empty string of at most %zu bytes", path, v, size - 1);
    return -1;
  }
  /* Names and paths reach checkpoint manifests and `check --json`, which are UTF-8 JSON that
   * tycho must read back: a string JSON cannot hold as it is is refused here, at its line. */
  for (size_t at = 0, step; at < len; at += step) {
    step = json_utf8_length((const unsigned char *)s + at, len - at);
    if (step == 0 || s[at] == 0) {
      const unsigned byte = (unsigned char)s[at];
      if (byte == 0)
        snprintf(err, n, "%s has a NUL byte at offset %zu (names and paths end at NUL)", path, at);
      else
        snprintf(err, n, "%s is not valid UTF-8 (byte 0x%02x at offset %zu)", path, byte, at);
      return -1;
    }
  }
  memcpy(out, s, len + 1);
  return 0;
}

/* The value at idx must be one of names; its index in *out. */
static int check_enum(lua_State *L, int idx, const char *const *names, const char *path, const char *context, int *out,
                      char *err, size_t n)
{
  char v[96], list[768], mean[80] = "", digits[32];
  if (lua_type(L, idx) == LUA_TSTRING || lua_isinteger(L, idx)) { /* an integer: a name such as "0" */
    const char *s = digits;
    if (lua_type(L, idx) == LUA_TSTRING)
      s = lua_tostring(L, idx);
    else
      snprintf(digits, sizeof digits, "%lld", (long long)lua_tointeger(L, idx));
    for (int i = 0; names[i]; i++)
      if (strcmp(names[i], s) == 0) {
        *out = i;
        return 0;
      }
    const char *hint = s == digits ? NULL : closest(s, names);
    if (hint)
      snprintf(mean, sizeof mean, " (did you mean \"%s\"?)", hint);
  }
  compile_describe(L, idx, v, sizeof v);
  size_t used = 0;
  list[0] = 0;
  for (int i = 0; names[i]; i++) {
    int w = snprintf(list + used, sizeof list - used, "%s\"%s\"", i ? ", " : "", names[i]);
    if (w < 0 || (size_t)w >= sizeof list - used)
      break;
    used += (size_t)w;
  }
  snprintf(err, n, "%s = %s%s: must be one of %s%s", path, v, context, list, mean);
  return -1;
}

int plan_field_from_lua(lua_State *L, int idx, const struct plan_field *f, struct plan *p, int finite, char *err,
                        size_t err_size)
{
  void *v = (char *)p + f->offset;
  long long x;
  double d;
  int k;
  switch (f->type) {
  case PLAN_FIELD_NUMBER:
    if (check_num(L, idx, f->path, f->min, f->max, (f->flags & PLAN_FIELD_MIN_OPEN) != 0,
                  (f->flags & PLAN_FIELD_MAX_OPEN) != 0, &d, err, err_size))
      return -1;
    if (finite && (f->flags & PLAN_FIELD_FINITE) && !isfinite(d)) {
      snprintf(err, err_size, "%s = %s: must be a finite number", f->path, d > 0 ? "inf" : "-inf");
      return -1;
    }
    *(double *)v = d;
    return 0;
  case PLAN_FIELD_INT:
  case PLAN_FIELD_LONG:
    if (check_ll(L, idx, f->path, (long long)f->min, (long long)f->max, &x, err, err_size))
      return -1;
    if (f->type == PLAN_FIELD_INT)
      *(int *)v = (int)x;
    else
      *(long long *)v = x;
    return 0;
  case PLAN_FIELD_BOOL: return check_bool(L, idx, f->path, (int *)v, err, err_size);
  case PLAN_FIELD_ENUM:
    if (check_enum(L, idx, f->names, f->path, "", &k, err, err_size))
      return -1;
    *(int *)v = k;
    return 0;
  case PLAN_FIELD_NAME:
    if (check_enum(L, idx, f->names, f->path, "", &k, err, err_size))
      return -1;
    snprintf(v, f->size, "%s", f->names[k]);
    return 0;
  case PLAN_FIELD_TEXT: return check_str(L, idx, f->path, v, f->size, err, err_size);
  }
  return -1;
}

/* A field of the table (fields.h) under t; *present (when not NULL) says whether it was written. */
int compile_read_field(struct reader *r, const struct tbl *t, const char *key, int *present)
{
  char path[128], where[PLAN_PATH_MAX + 32], msg[1536];
  int type = compile_get(r, t, key, path, sizeof path, where, sizeof where);
  const struct plan_field *f = plan_field_find(path);
  if (present)
    *present = type != LUA_TNIL;
  if (!f) {
    lua_pop(r->L, 1);
    return compile_rfail(r, where, "%s: not a field of the plan-field table", path);
  }
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    if (!(f->flags & PLAN_FIELD_REQUIRED))
      return 0;
    if (f->type == PLAN_FIELD_INT || f->type == PLAN_FIELD_LONG)
      return compile_rfail(r, t->where, "%s: missing; it is required (an integer ≥ %lld)", path, (long long)f->min);
    return compile_rfail(r, t->where, "%s: missing; it is required (%s)", path,
                         f->type == PLAN_FIELD_NUMBER ? "a number" : "a string");
  }
  int rc = plan_field_from_lua(r->L, -1, f, r->p, 0, msg, sizeof msg);
  lua_pop(r->L, 1);
  return rc ? compile_rfail(r, where, "%s", msg) : 0;
}

/* The value at idx must be one of names; its index in *out. */
int compile_match_enum(struct reader *r, int idx, const char *const *names, const char *path,
                       const char *where, const char *context, int *out)
{
  char msg[1536];
  if (check_enum(r->L, idx, names, path, context, out, msg, sizeof msg))
    return compile_rfail(r, where, "%s", msg);
  return 0;
}

int compile_read_enum(struct reader *r, const struct tbl *t, const char *key, const char *const *names, int *out)
{
  char path[128], where[PLAN_PATH_MAX + 32];
  if (compile_get(r, t, key, path, sizeof path, where, sizeof where) == LUA_TNIL) {
    lua_pop(r->L, 1);
    return 0;
  }
  int rc = compile_match_enum(r, -1, names, path, where, "", out);
  lua_pop(r->L, 1);
  return rc;
}

/* Pushes the sub-table t[key] as a struct tbl; returns 0 (absent: *present = 0), -1 error. */
int compile_open_section(struct reader *r, const struct tbl *t, const char *key, struct tbl *sub, int *present)
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
    compile_describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    return compile_rfail(r, sub->where, "%s = %s: must be a table", sub->path, v);
  }
  sub->idx = lua_gettop(r->L);
  return 0;
}

/* Calls the function at fidx with args pushed by the caller; leaves one result. */
int compile_call_plan_function(struct reader *r, int fidx, int nargs, const char *what)
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
