/* --set overrides for the plan compiler (see compile.c): "path.to.field=value" applied to the
 * plan table before it is read, and written back as Lua for tycho tune's plan files
 * (plan_set_as_lua). */
#define _POSIX_C_SOURCE 200809L
#include <lauxlib.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compile_internal.h"

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
    if (*end == 0 && index > 0) /* as compile_apply_set reads a numeric component */
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

/* How deep a --set table constructor may nest its brackets ({, ( and [ together). Lua's parser
 * stops near 200 levels with "C stack overflow", which names neither the cause nor the limit;
 * no plan field needs more than a few. */
#define SET_MAX_NESTING 100

/* Length of the long bracket opening at s ("[[" 2, "[==[" 4), or 0 when s opens none. */
static size_t long_bracket(const char *s, size_t *level)
{
  size_t k = 1;
  while (s[k] == '=') k++;
  *level = k - 1;
  return s[0] == '[' && s[k] == '[' ? k + 1 : 0;
}

/* The deepest nesting of brackets in a Lua expression, outside its strings and comments. */
static int set_nesting(const char *s)
{
  int depth = 0, most = 0;
  while (*s) {
    size_t level, open;
    if (*s == '"' || *s == '\'') { /* a short string: to its closing quote, escapes skipped */
      const char q = *s++;
      while (*s && *s != q) s += s[0] == '\\' && s[1] ? 2 : 1;
      if (*s) s++;
    } else if ((open = long_bracket(s, &level)) != 0 || (s[0] == '-' && s[1] == '-')) {
      if (open == 0) { /* a comment: long when a long bracket follows, else to the line's end */
        s += 2;
        open = long_bracket(s, &level);
        if (open == 0) {
          while (*s && *s != '\n') s++;
          continue;
        }
      }
      s += open; /* a long string or comment: to "]" level × "=" "]" */
      for (; *s; s++) {
        size_t k = 1;
        while (s[0] == ']' && s[k] == '=') k++;
        if (s[0] == ']' && k - 1 == level && s[k] == ']') {
          s += k + 1;
          break;
        }
      }
    } else {
      if (*s == '{' || *s == '(' || *s == '[') {
        if (++depth > most) most = depth;
      } else if ((*s == '}' || *s == ')' || *s == ']') && depth > 0) {
        depth--;
      }
      s++;
    }
  }
  return most;
}

/* Pushes a --set value that starts with '{': a Lua table constructor, e.g.
 * --set 'stages={{"embed",0,1},{2,3,"head"}}'. It runs with an empty environment (no globals
 * to call) under the plan's memory and instruction limits. 0, or -1 with nothing pushed. */
static int push_set_table(struct reader *r, const char *text, const char *where)
{
  lua_State *L = r->L;
  const int nesting = set_nesting(text);
  if (nesting > SET_MAX_NESTING)
    return compile_rfail(r, where, "the table constructor nests %d levels deep; at most %d levels of "
                         "brackets ({, ( and [ together) are read", nesting, SET_MAX_NESTING);
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
      compile_rfail(r, where, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "an error");
      lua_pop(L, 1);
      return -1;
    }
    char v[96];
    if (rc == LUA_OK)
      compile_describe(L, -1, v, sizeof v);
    else
      snprintf(v, sizeof v, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "an error");
    lua_pop(L, 1);
    return compile_rfail(r, where, "a value that starts with '{' must be a Lua table constructor (%s%s)",
                         rc == LUA_OK ? "it gave " : "", v);
  }
  return 0;
}

int compile_apply_set(struct reader *r, int plan_idx, const char *set)
{
  lua_State *L = r->L;
  const char *eq = strchr(set, '=');
  if (!eq || eq == set)
    return compile_rfail(r, "--set", "\"%s\": expected path.to.field=value (e.g. --set mesh.tp=2)", set);
  char path[256];
  snprintf(path, sizeof path, "%.*s", (int)(eq - set < 255 ? eq - set : 255), set);
  struct sandbox *sb = r->sb;
  char desc[512];
  const size_t len = strlen(set);
  if (len > 200) /* a long value is named by its start and its size, not echoed whole */
    snprintf(desc, sizeof desc, "--set %.*s... (%zu bytes)", (int)(eq - set < 150 ? eq - set + 40 : 190), set, len);
  else
    snprintf(desc, sizeof desc, "--set %s", set);
  const char *where = srcmap_intern(&sb->map, desc);
  const size_t plen = strlen(path); /* strtok_r would read a..b as a.b: refuse empty components */
  if (path[0] == '.' || path[plen - 1] == '.' || strstr(path, ".."))
    return compile_rfail(r, where, "%s: the path has an empty component", path);
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
      compile_describe(L, -1, v, sizeof v);
      lua_pop(L, 3);
      return compile_rfail(r, where, "%s is %s, not a table of fields", seg, v);
    } else {
      lua_remove(L, -2);
    }
    lua_remove(L, -2);
    seg = next;
  }
  lua_pop(L, 1);
  return compile_rfail(r, where, "expected path.to.field=value");
}
