/* help() in Lua (docs/repl.md, "Help"): one line per REPL command, module function, trainer field
 * and method, and tensor field and method. Every object is built from one list of entries (struct
 * tycho_entry: name, function or field, how it is written, one line of help), and that list also
 * makes the metatable's `methods` and `__fields`, which the REPL completes from; so what
 * completes, what __index answers and what help() prints cannot drift apart.
 *
 * Where the lines live: each metatable's `__help` (the trainer's, a tensor's), the registry's
 * "tycho.help.module" (the module's, tycho_runtime.c) and "tycho.help.repl" (the REPL's commands,
 * which the REPL puts there in the same shape: a table with `title` and one { name, usage, help,
 * method } per entry). help() reads them and prints; it touches no other rank, so it runs on any
 * set of ranks. The live fields t:set takes come from the plan-field table (plan/fields.h). */
#include <lauxlib.h>
#include <string.h>

#include "plan/fields.h"
#include "tycho_runtime_internal.h"
#include "util/strbuf.h"

#define MODULE_HELP "tycho.help.module"
#define REPL_HELP "tycho.help.repl" /* filled by the REPL (repl_install_capture) */
#define USAGE_WIDTH 22             /* the column the lines' text starts at, when the usage fits */

/* Pushes a `__help` table made from entries. */
static void push_help(lua_State *L, const struct tycho_entry *e, const char *title)
{
  lua_newtable(L);
  lua_pushstring(L, title);
  lua_setfield(L, -2, "title");
  for (int i = 0; e[i].name; i++) {
    lua_createtable(L, 0, 4);
    lua_pushstring(L, e[i].name);
    lua_setfield(L, -2, "name");
    lua_pushstring(L, e[i].usage);
    lua_setfield(L, -2, "usage");
    lua_pushstring(L, e[i].help);
    lua_setfield(L, -2, "help");
    lua_pushboolean(L, e[i].fn != NULL);
    lua_setfield(L, -2, "method");
    lua_rawseti(L, -2, i + 1);
  }
}

void tycho_entries_register(lua_State *L, int idx, const struct tycho_entry *entries, const char *title)
{
  idx = lua_absindex(L, idx);
  lua_newtable(L); /* __fields */
  lua_newtable(L); /* methods */
  int n_fields = 0;
  for (int i = 0; entries[i].name; i++) {
    if (entries[i].fn) {
      lua_pushcfunction(L, entries[i].fn);
      lua_setfield(L, -2, entries[i].name);
    } else {
      lua_pushstring(L, entries[i].name);
      lua_rawseti(L, -3, ++n_fields);
    }
  }
  lua_pushvalue(L, -1);
  lua_setfield(L, idx, "methods");
  lua_rotate(L, -2, 1);
  lua_setfield(L, idx, "__fields");
  push_help(L, entries, title);
  lua_setfield(L, idx, "__help");
}

void tycho_help_register_module(lua_State *L, const struct tycho_entry *entries)
{
  push_help(L, entries, "the tycho module");
  lua_setfield(L, LUA_REGISTRYINDEX, MODULE_HELP);
}

/* ---- printing (into a C buffer: a luaL_Buffer would hold stack slots the lookups move) ---- */

/* One entry's line (the entry table at idx): its usage padded to the column, then its help. */
static void add_entry(struct strbuf *b, lua_State *L, int entry)
{
  lua_getfield(L, entry, "usage");
  lua_getfield(L, entry, "help");
  const char *usage = lua_tostring(L, -2), *help = lua_tostring(L, -1);
  sb_printf(b, "  %-*s%s%s\n", USAGE_WIDTH, usage ? usage : "?",
            usage && strlen(usage) >= USAGE_WIDTH ? "  " : "", help ? help : "");
  lua_pop(L, 2);
}

/* The live fields t:set takes, on one line: the plan-field table's LIVE rows. */
static void add_live_fields(struct strbuf *b)
{
  sb_puts(b, "  t:set's fields:");
  size_t col = 18;
  for (int i = 0; i < plan_n_fields; i++)
    if (plan_fields[i].flags & PLAN_FIELD_LIVE) {
      const size_t n = strlen(plan_fields[i].path);
      if (col + 1 + n > 100) {
        sb_puts(b, "\n   ");
        col = 3;
      }
      sb_printf(b, " %s", plan_fields[i].path);
      col += 1 + n;
    }
  sb_puts(b, "\n");
}

/* The section at idx (a `__help` table, or nothing), whole: its title, then a line per entry. */
static void add_section(struct strbuf *b, lua_State *L, int idx)
{
  if (!lua_istable(L, idx))
    return;
  if (lua_getfield(L, idx, "title") == LUA_TSTRING)
    sb_printf(b, "%s:\n", lua_tostring(L, -1));
  lua_pop(L, 1);
  const lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, i);
    add_entry(b, L, lua_gettop(L));
    lua_pop(L, 1);
  }
}

/* Pushes the `__help` of the value at idx (a trainer, a tensor, the module), or nil. */
static void push_section_of(lua_State *L, int idx)
{
  if (luaL_testudata(L, idx, TRAINER_META) || luaL_testudata(L, idx, TENSOR_META)) {
    lua_getmetatable(L, idx);
    lua_getfield(L, -1, "__help");
    lua_remove(L, -2);
    return;
  }
  int module = 0;
  if (lua_istable(L, idx)) { /* the module: its open and its version */
    module = lua_getfield(L, idx, "open") == LUA_TFUNCTION && lua_getfield(L, idx, "version") == LUA_TSTRING;
    lua_settop(L, idx);
  }
  if (module)
    lua_getfield(L, LUA_REGISTRYINDEX, MODULE_HELP);
  else
    lua_pushnil(L);
}

/* Adds the entries of the section at idx named `name` (a method only when `method` is 1, a field
 * only when 0, either when -1). Returns how many. */
static int add_named(struct strbuf *b, lua_State *L, int idx, const char *name, int method)
{
  int found = 0;
  const lua_Integer n = lua_istable(L, idx) ? (lua_Integer)lua_rawlen(L, idx) : 0;
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, idx, i);
    const int e = lua_gettop(L);
    lua_getfield(L, e, "name");
    lua_getfield(L, e, "method");
    const int same = lua_tostring(L, -2) && strcmp(lua_tostring(L, -2), name) == 0 &&
                     (method < 0 || lua_toboolean(L, -1) == method);
    lua_pop(L, 2);
    if (same) {
      add_entry(b, L, e);
      found++;
    }
    lua_pop(L, 1);
  }
  return found;
}

/* Adds the entries named `name` of the section under registry key `key` (meta 0) or the
 * `__help` of the metatable named `key` (meta 1). */
static int add_named_in(struct strbuf *b, lua_State *L, const char *key, int meta, const char *name, int method)
{
  const int top = lua_gettop(L);
  lua_getfield(L, LUA_REGISTRYINDEX, key);
  if (meta && lua_istable(L, -1))
    lua_getfield(L, -1, "__help");
  int found = add_named(b, L, lua_gettop(L), name, method);
  lua_settop(L, top);
  return found;
}

/* help("t:step"), help("x.shape"), help("tycho.open"), help("quit"): the entries of that name. The
 * prefix picks the object (t: the trainer's, tycho: the module's, any other: the REPL's and a
 * tensor's; none: all); ':' asks for a method, '.' for a field or function. */
static int help_named(lua_State *L, struct strbuf *b, const char *word)
{
  const char *cut = strrchr(word, ':'), *dot = strrchr(word, '.');
  if (dot && (!cut || dot > cut))
    cut = dot;
  const char *name = cut ? cut + 1 : word;
  const int method = cut ? *cut == ':' : -1;
  const size_t plen = cut ? (size_t)(cut - word) : 0;
  const int module = plen == 5 && strncmp(word, "tycho", 5) == 0;
  const int trainer = plen == 1 && word[0] == 't';
  const int other = !cut || (!module && !trainer);
  int found = 0;
  if (other)
    found += add_named_in(b, L, REPL_HELP, 0, name, method);
  if (!cut || module)
    found += add_named_in(b, L, MODULE_HELP, 0, name, -1);
  if (!cut || trainer)
    found += add_named_in(b, L, TRAINER_META, 1, name, method);
  if (other)
    found += add_named_in(b, L, TENSOR_META, 1, name, method);
  if (found && (!cut || trainer) && strcmp(name, "set") == 0)
    add_live_fields(b);
  return found;
}

int tycho_help(lua_State *L)
{
  struct strbuf b;
  sb_init(&b);
  char why[512] = "";
  if (lua_isnoneornil(L, 1)) { /* everything but a tensor's entries, which the last line names */
    const char *keys[] = { REPL_HELP, MODULE_HELP, TRAINER_META };
    for (int k = 0; k < 3; k++) {
      lua_getfield(L, LUA_REGISTRYINDEX, keys[k]);
      if (k == 2 && lua_istable(L, -1))
        lua_getfield(L, -1, "__help");
      if (lua_istable(L, -1)) {
        add_section(&b, L, lua_gettop(L));
        if (k == 2)
          add_live_fields(&b);
        sb_puts(&b, "\n");
      }
      lua_settop(L, 1);
    }
    sb_puts(&b, "A tensor's fields and methods: help(x), x = t:param(name). One entry: help(\"t:step\").\n");
  } else if (lua_type(L, 1) == LUA_TSTRING) {
    if (!help_named(L, &b, lua_tostring(L, 1)))
      snprintf(why, sizeof why, "help: nothing is named '%s' (help() lists the commands, functions, fields and methods)",
               lua_tostring(L, 1));
  } else {
    lua_settop(L, 1);
    push_section_of(L, 1);
    if (lua_istable(L, 2)) {
      add_section(&b, L, 2);
      if (luaL_testudata(L, 1, TRAINER_META))
        add_live_fields(&b);
    } else {
      snprintf(why, sizeof why, "help: no help for a %s value; help() for the commands, help(t) for a trainer's, "
               "help(x) for a tensor's, help(\"t:step\") for one entry", luaL_typename(L, 1));
    }
  }
  if (why[0] || b.failed) {
    sb_free(&b);
    return luaL_error(L, "%s", why[0] ? why : "help: out of memory");
  }
  /* through the state's print: the REPL captures it per rank */
  lua_getglobal(L, "print");
  if (lua_isfunction(L, -1)) {
    lua_pushlstring(L, b.s, b.n && b.s[b.n - 1] == '\n' ? b.n - 1 : b.n); /* print adds the last newline */
    sb_free(&b);
    lua_call(L, 1, 0);
  } else {
    sb_free(&b);
  }
  return 0;
}
