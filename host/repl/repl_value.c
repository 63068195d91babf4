/* The values a chunk returns, as the prompt shows them (repl_value.h): a table by its contents
 * in one deterministic text — keys sorted, never an address — so every rank that holds the same
 * contents prints the same line and the ranks' output collapses. */
#include "repl/repl_value.h"

#include <lauxlib.h>
#include <stdlib.h>
#include <string.h>

struct fmt {
  lua_State *L;
  int seen;     /* stack index: the tables between the shown value and here (cycles) */
  size_t limit; /* the buffer's length past which the text stops */
  int cut;      /* the limit was reached: nothing more is added */
};

static int plain_table(lua_State *L, int idx)
{
  if (lua_type(L, idx) != LUA_TTABLE)
    return 0;
  if (luaL_getmetafield(L, idx, "__tostring") == LUA_TNIL)
    return 1;
  lua_pop(L, 1);
  return 0;
}

static void put_quoted(struct strbuf *b, const char *s, size_t n)
{
  sb_put(b, "\"", 1);
  for (size_t i = 0; i < n; i++) {
    const unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      char e[2] = { '\\', (char)c };
      sb_put(b, e, 2);
    } else if (c == '\n') {
      sb_put(b, "\\n", 2);
    } else if (c == '\t') {
      sb_put(b, "\\t", 2);
    } else if (c == '\r') {
      sb_put(b, "\\r", 2);
    } else if (c < 32 || c == 127) {
      sb_printf(b, "\\%03d", c);
    } else {
      sb_put(b, (const char *)&s[i], 1);
    }
  }
  sb_put(b, "\"", 1);
}

/* A key that Lua reads bare (`name = v`): an identifier that is not a reserved word. */
static int is_name(const char *s, size_t n)
{
  static const char *const reserved[] = { "and", "break", "do", "else", "elseif", "end", "false", "for",
                                          "function", "goto", "if", "in", "local", "nil", "not", "or",
                                          "repeat", "return", "then", "true", "until", "while", NULL };
  if (!n || !(s[0] == '_' || (s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z')))
    return 0;
  for (size_t i = 1; i < n; i++)
    if (!(s[i] == '_' || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9')))
      return 0;
  for (int i = 0; reserved[i]; i++)
    if (strlen(reserved[i]) == n && !memcmp(reserved[i], s, n))
      return 0;
  return 1;
}

/* A number as Lua writes it (3, 0.0005, 2.0, inf), without metamethods. */
static void put_number(lua_State *L, int idx, struct strbuf *b)
{
  size_t len;
  lua_pushvalue(L, idx);
  const char *s = lua_tolstring(L, -1, &len); /* converts the copy */
  sb_put(b, s, len);
  lua_pop(L, 1);
}

/* As print shows it (luaL_tolstring: __tostring, or the type and an address). */
static void put_printed(lua_State *L, int idx, struct strbuf *b)
{
  size_t len;
  const char *s = luaL_tolstring(L, idx, &len);
  sb_put(b, s, len);
  lua_pop(L, 1);
}

/* ---- keys ---- */

struct key {
  int cls;        /* 0 number, 1 string, 2 boolean, 3 anything else */
  int is_int;
  lua_Integer i;
  double d;
  const char *s;
  size_t len;
  int pos;        /* in the key list, for the order of the keys of class 3 */
};

static int compare_keys(const void *pa, const void *pb)
{
  const struct key *a = pa, *b = pb;
  if (a->cls != b->cls)
    return a->cls < b->cls ? -1 : 1;
  if (a->cls == 0) {
    if (a->is_int && b->is_int)
      return a->i < b->i ? -1 : a->i > b->i;
    const double x = a->is_int ? (double)a->i : a->d, y = b->is_int ? (double)b->i : b->d;
    if (x != y)
      return x < y ? -1 : 1;
  } else if (a->cls == 1) {
    const int c = memcmp(a->s, b->s, a->len < b->len ? a->len : b->len);
    if (c || a->len != b->len)
      return c ? c : a->len < b->len ? -1 : 1;
  } else if (a->cls == 2 && a->i != b->i) {
    return a->i < b->i ? -1 : 1;
  }
  return a->pos < b->pos ? -1 : a->pos > b->pos;
}

/* Pushes the list of t's keys outside its list part 1..*n_seq, sorted; returns how many. */
static int sorted_keys(lua_State *L, int t, int *n_seq)
{
  lua_Integer n = 0;
  while (lua_rawgeti(L, t, n + 1) != LUA_TNIL) {
    lua_pop(L, 1);
    n++;
  }
  lua_pop(L, 1);
  *n_seq = (int)(n < 0x3fffffff ? n : 0x3fffffff);
  lua_newtable(L);
  const int list = lua_gettop(L);
  int count = 0;
  lua_pushnil(L);
  while (lua_next(L, t)) {
    lua_pop(L, 1);
    if (lua_isinteger(L, -1) && lua_tointeger(L, -1) >= 1 && lua_tointeger(L, -1) <= *n_seq)
      continue;
    lua_pushvalue(L, -1);
    lua_rawseti(L, list, ++count);
  }
  if (count < 2)
    return count;
  struct key *keys = lua_newuserdatauv(L, (size_t)count * sizeof *keys, 0); /* freed by the collector */
  for (int j = 0; j < count; j++) {
    struct key *k = &keys[j];
    memset(k, 0, sizeof *k);
    k->pos = j + 1;
    switch (lua_rawgeti(L, list, j + 1)) {
    case LUA_TNUMBER:
      k->is_int = lua_isinteger(L, -1);
      k->i = k->is_int ? lua_tointeger(L, -1) : 0;
      k->d = lua_tonumber(L, -1);
      break;
    case LUA_TSTRING:
      k->cls = 1;
      k->s = lua_tolstring(L, -1, &k->len); /* the list holds the string */
      break;
    case LUA_TBOOLEAN:
      k->cls = 2;
      k->i = lua_toboolean(L, -1);
      break;
    default:
      k->cls = 3;
    }
    lua_pop(L, 1);
  }
  qsort(keys, (size_t)count, sizeof *keys, compare_keys);
  lua_createtable(L, count, 0);
  for (int j = 0; j < count; j++) {
    lua_rawgeti(L, list, keys[j].pos);
    lua_rawseti(L, -2, j + 1);
  }
  lua_replace(L, list);
  lua_pop(L, 1); /* the key array */
  return count;
}

/* `name = `, `["a b"] = `, `[10] = `, `[true] = `. */
static void put_key(lua_State *L, int k, struct strbuf *b)
{
  size_t len;
  switch (lua_type(L, k)) {
  case LUA_TSTRING: {
    const char *s = lua_tolstring(L, k, &len);
    if (is_name(s, len)) {
      sb_put(b, s, len);
    } else {
      sb_put(b, "[", 1);
      put_quoted(b, s, len);
      sb_put(b, "]", 1);
    }
    break;
  }
  case LUA_TNUMBER:
    sb_put(b, "[", 1);
    put_number(L, k, b);
    sb_put(b, "]", 1);
    break;
  case LUA_TBOOLEAN:
    sb_puts(b, lua_toboolean(L, k) ? "[true]" : "[false]");
    break;
  default:
    sb_printf(b, "[<%s>]", luaL_typename(L, k));
  }
  sb_puts(b, " = ");
}

/* ---- values ---- */

static int put_table(struct fmt *f, int idx, struct strbuf *b, int indent, int depth, int one_line);

/* A value inside a table: strings quoted, no addresses. */
static void put_nested(struct fmt *f, int idx, struct strbuf *b, int indent, int depth)
{
  lua_State *L = f->L;
  switch (lua_type(L, idx)) {
  case LUA_TSTRING: {
    size_t len;
    const char *s = lua_tolstring(L, idx, &len);
    put_quoted(b, s, len);
    break;
  }
  case LUA_TNUMBER:
    put_number(L, idx, b);
    break;
  case LUA_TNIL:
  case LUA_TBOOLEAN:
    sb_puts(b, lua_toboolean(L, idx) ? "true" : lua_isnil(L, idx) ? "nil" : "false");
    break;
  case LUA_TTABLE:
    if (plain_table(L, idx))
      put_table(f, idx, b, indent, depth, 0);
    else
      put_printed(L, idx, b); /* its __tostring */
    break;
  default:
    if (luaL_getmetafield(L, idx, "__tostring") != LUA_TNIL) {
      lua_pop(L, 1);
      put_printed(L, idx, b);
    } else {
      sb_printf(b, "<%s>", luaL_typename(L, idx));
    }
  }
}

/* One entry of a multi-line table: its value on one line when that fits in the width left after
 * the indent and the key, else as a table of its own lines. */
static void put_entry_value(struct fmt *f, int v, struct strbuf *b, int indent, size_t key_len, int depth)
{
  lua_State *L = f->L;
  if (!plain_table(L, v)) {
    put_nested(f, v, b, indent, depth);
    return;
  }
  const size_t used = (size_t)indent + key_len + 1; /* the comma after it */
  struct strbuf line;
  sb_init(&line);
  struct fmt g = { L, f->seen, used < REPL_VALUE_WIDTH ? REPL_VALUE_WIDTH - used : 0, 0 };
  if (g.limit && put_table(&g, v, &line, 0, depth, 1) == 0 && !line.failed)
    sb_put(b, line.s, line.n);
  else
    put_table(f, v, b, indent, depth, 0);
  sb_free(&line);
}

/* The table at idx: "{ a = 1, b = 2 }" (one_line: -1 as soon as the text passes f->limit), or
 * one entry a line at indent + 2, closed at indent. */
static int put_table(struct fmt *f, int idx, struct strbuf *b, int indent, int depth, int one_line)
{
  lua_State *L = f->L;
  idx = lua_absindex(L, idx);
  if (depth > REPL_VALUE_MAX_DEPTH) {
    sb_puts(b, "{...}");
    return one_line && b->n > f->limit ? -1 : 0;
  }
  lua_pushvalue(L, idx);
  if (lua_rawget(L, f->seen) != LUA_TNIL) {
    lua_pop(L, 1);
    sb_puts(b, "<cycle>");
    return one_line && b->n > f->limit ? -1 : 0;
  }
  lua_pop(L, 1);
  lua_pushvalue(L, idx);
  lua_pushboolean(L, 1);
  lua_rawset(L, f->seen);
  const int top = lua_gettop(L);

  int n_seq, rc = 0;
  const int n_keys = sorted_keys(L, idx, &n_seq);
  const int keys = lua_gettop(L);
  const int n = n_seq + n_keys;
  if (n == 0) {
    sb_puts(b, "{}");
  } else {
    sb_puts(b, one_line ? "{ " : "{\n");
    for (int j = 1; j <= n && !f->cut; j++) {
      if (!one_line)
        for (int s = 0; s < indent + 2; s++) sb_put(b, " ", 1);
      const size_t at = b->n;
      if (j <= n_seq) {
        lua_rawgeti(L, idx, j);
      } else {
        lua_rawgeti(L, keys, j - n_seq);
        put_key(L, lua_gettop(L), b);
        lua_pushvalue(L, -1);
        lua_rawget(L, idx);
      }
      const int v = lua_gettop(L);
      if (one_line) {
        if (plain_table(L, v))
          rc = put_table(f, v, b, 0, depth + 1, 1);
        else
          put_nested(f, v, b, 0, depth + 1);
        if (j < n)
          sb_puts(b, ", ");
        if (rc || b->n > f->limit) {
          rc = -1;
          break;
        }
      } else {
        put_entry_value(f, v, b, indent + 2, b->n - at, depth + 1);
        sb_puts(b, ",\n");
        if (b->n > f->limit && !f->cut) {
          f->cut = 1;
          for (int s = 0; s < indent + 2; s++) sb_put(b, " ", 1);
          sb_puts(b, "...\n");
        }
      }
      lua_settop(L, keys);
    }
    if (!rc) {
      if (one_line) {
        sb_puts(b, " }");
        rc = b->n > f->limit ? -1 : 0;
      } else {
        for (int s = 0; s < indent; s++) sb_put(b, " ", 1);
        sb_puts(b, "}");
      }
    }
  }
  lua_settop(L, top);
  lua_pushvalue(L, idx);
  lua_pushnil(L);
  lua_rawset(L, f->seen);
  return rc;
}

void repl_format_value(lua_State *L, int idx, struct strbuf *out)
{
  idx = lua_absindex(L, idx);
  if (!plain_table(L, idx)) {
    put_printed(L, idx, out); /* as print: a string unquoted, a trainer by its __tostring */
    return;
  }
  luaL_checkstack(L, 8 * REPL_VALUE_MAX_DEPTH + 40, "showing a value");
  lua_newtable(L);
  struct fmt f = { L, lua_gettop(L), REPL_VALUE_WIDTH, 0 };
  struct strbuf line;
  sb_init(&line);
  if (put_table(&f, idx, &line, 0, 0, 1) == 0 && !line.failed) {
    sb_put(out, line.s, line.n);
  } else {
    f.limit = out->n + REPL_VALUE_MAX_BYTES;
    put_table(&f, idx, out, 0, 0, 0);
  }
  sb_free(&line);
  lua_pop(L, 1);
}

static int free_text(lua_State *L)
{
  sb_free(lua_touserdata(L, 1));
  return 0;
}

int repl_format_values(lua_State *L)
{
  const int n = lua_gettop(L);
  struct strbuf *b = lua_newuserdatauv(L, sizeof *b, 0);
  sb_init(b);
  if (luaL_newmetatable(L, "tycho.repl.text")) {
    lua_pushcfunction(L, free_text);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2); /* the collector frees the text if showing a value raises */
  for (int i = 1; i <= n; i++) {
    if (i > 1)
      sb_put(b, "\t", 1);
    repl_format_value(L, i, b);
  }
  sb_put(b, "\n", 1);
  if (b->failed)
    return luaL_error(L, "not enough memory to show the values");
  lua_pushlstring(L, b->s, b->n);
  sb_free(b);
  return 1;
}
