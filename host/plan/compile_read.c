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

/* required: 1 error when missing; else the default is kept. */
int compile_read_ll(struct reader *r, const struct tbl *t, const char *key, long long min, long long max,
                    int required, long long *out)
{
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = compile_get(r, t, key, path, sizeof path, where, sizeof where);
  long long x;
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    if (required)
      return compile_rfail(r, t->where, "%s: missing; it is required (an integer ≥ %lld)", path, min);
    return 0;
  }
  if (!compile_is_integral(r->L, -1, &x) || x < min || x > max) {
    compile_describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    if (max >= (long long)1 << 52)
      return compile_rfail(r, where, "%s = %s: must be an integer ≥ %lld", path, v, min);
    return compile_rfail(r, where, "%s = %s: must be an integer in %lld..%lld", path, v, min, max);
  }
  lua_pop(r->L, 1);
  *out = x;
  return 0;
}

int compile_read_int(struct reader *r, const struct tbl *t, const char *key, int min, int max, int required, int *out)
{
  long long x = *out;
  if (compile_read_ll(r, t, key, min, max, required, &x))
    return -1;
  *out = (int)x;
  return 0;
}

/* A number in [min, max] (or [min, max) when max_open). */
int compile_read_num(struct reader *r, const struct tbl *t, const char *key, double min, double max,
                     int min_open, int max_open, int required, double *out)
{
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = compile_get(r, t, key, path, sizeof path, where, sizeof where);
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    if (required)
      return compile_rfail(r, t->where, "%s: missing; it is required (a number)", path);
    return 0;
  }
  double x = lua_tonumber(r->L, -1);
  int bad = type != LUA_TNUMBER || isnan(x) || (min_open ? x <= min : x < min) || (max_open ? x >= max : x > max);
  if (bad) {
    compile_describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    char range[96];
    if (isinf(max))
      snprintf(range, sizeof range, "a number %s %g", min_open ? ">" : "≥", min);
    else
      snprintf(range, sizeof range, "a number in %s%g, %g%s", min_open ? "(" : "[", min, max, max_open ? ")" : "]");
    return compile_rfail(r, where, "%s = %s: must be %s", path, v, range);
  }
  lua_pop(r->L, 1);
  *out = x;
  return 0;
}

int compile_read_bool(struct reader *r, const struct tbl *t, const char *key, int *out)
{
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = compile_get(r, t, key, path, sizeof path, where, sizeof where);
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    return 0;
  }
  if (type != LUA_TBOOLEAN) {
    compile_describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    return compile_rfail(r, where, "%s = %s: must be true or false", path, v);
  }
  *out = lua_toboolean(r->L, -1);
  lua_pop(r->L, 1);
  return 0;
}

int compile_read_str(struct reader *r, const struct tbl *t, const char *key, int required, char *out, size_t n)
{
  char path[128], where[PLAN_PATH_MAX + 32], v[96];
  int type = compile_get(r, t, key, path, sizeof path, where, sizeof where);
  if (type == LUA_TNIL) {
    lua_pop(r->L, 1);
    if (required)
      return compile_rfail(r, t->where, "%s: missing; it is required (a string)", path);
    return 0;
  }
  size_t len;
  const char *s = lua_tolstring(r->L, -1, &len);
  if (type != LUA_TSTRING || len == 0 || len >= n) {
    compile_describe(r->L, -1, v, sizeof v);
    lua_pop(r->L, 1);
    return compile_rfail(r, where, "%s = %s: must be a non-empty string of at most %zu bytes", path, v, n - 1);
  }
  /* Names and paths reach checkpoint manifests and `check --json`, which are UTF-8 JSON that
   * tycho must read back: a string JSON cannot hold as it is is refused here, at its line. */
  for (size_t at = 0, step; at < len; at += step) {
    step = json_utf8_length((const unsigned char *)s + at, len - at);
    if (step == 0 || s[at] == 0) {
      const unsigned byte = (unsigned char)s[at];
      lua_pop(r->L, 1);
      if (byte == 0)
        return compile_rfail(r, where, "%s has a NUL byte at offset %zu (names and paths end at NUL)", path, at);
      return compile_rfail(r, where, "%s is not valid UTF-8 (byte 0x%02x at offset %zu)", path, byte, at);
    }
  }
  memcpy(out, s, len + 1);
  lua_pop(r->L, 1);
  return 0;
}

/* The value at idx must be one of names; its index in *out. */
int compile_match_enum(struct reader *r, int idx, const char *const *names, const char *path,
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
  compile_describe(r->L, idx, v, sizeof v);
  size_t used = 0;
  list[0] = 0;
  for (int i = 0; names[i]; i++) {
    int w = snprintf(list + used, sizeof list - used, "%s\"%s\"", i ? ", " : "", names[i]);
    if (w < 0 || (size_t)w >= sizeof list - used)
      break;
    used += (size_t)w;
  }
  return compile_rfail(r, where, "%s = %s%s: must be one of %s%s", path, v, context, list, mean);
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
