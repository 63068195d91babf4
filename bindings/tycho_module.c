/* The `tycho` Lua module: the constructors plan files call. The work of turning a plan table
 * into a compiled plan is the host's (host/plan/compile.c); here are only tycho.plan, which
 * marks a table as a plan, and tycho.extend, which composes plans while keeping, for every
 * field, the file and line it was written on (see host/lua/srcmap.h). */
#include "tycho_module.h"

#include <lauxlib.h>

#include "lua/sandbox.h"

#define PLANS_KEY "tycho.plans"

static void push_plans_set(lua_State *L)
{
  if (lua_getfield(L, LUA_REGISTRYINDEX, PLANS_KEY) == LUA_TTABLE)
    return;
  lua_pop(L, 1);
  lua_newtable(L);
  lua_newtable(L);
  lua_pushstring(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, PLANS_KEY);
}

static void mark_plan(lua_State *L, int idx)
{
  idx = lua_absindex(L, idx);
  push_plans_set(L);
  lua_pushvalue(L, idx);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

int tycho_is_plan(lua_State *L, int idx)
{
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx))
    return 0;
  push_plans_set(L);
  lua_pushvalue(L, idx);
  lua_rawget(L, -2);
  int yes = lua_toboolean(L, -1);
  lua_pop(L, 2);
  return yes;
}

int tycho_is_list(lua_State *L, int idx)
{
  idx = lua_absindex(L, idx);
  lua_Integer n = (lua_Integer)lua_rawlen(L, idx), count = 0;
  if (n == 0)
    return 0;
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pop(L, 1);
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1 || lua_tointeger(L, -1) > n) {
      lua_pop(L, 1);
      return 0;
    }
    count++;
  }
  return count == n;
}

/* How deep tycho.extend follows nested tables. Each level takes a C frame and a few Lua stack
 * slots; a plan's own tables are a handful of levels deep. */
#define EXTEND_MAX_DEPTH 100

static void check_depth(lua_State *L, int depth)
{
  if (depth > EXTEND_MAX_DEPTH)
    luaL_error(L, "tycho.extend: tables nested deeper than %d levels (a plan's sections are a few "
               "levels deep)", EXTEND_MAX_DEPTH);
  luaL_checkstack(L, 8, "tycho.extend: nested tables");
}

/* Pushes a deep copy of the table at idx; `seen` (absolute index) maps originals to copies, so
 * a table reached twice (or inside itself) is copied once. */
static void deep_copy(lua_State *L, int idx, int seen, int depth)
{
  check_depth(L, depth);
  idx = lua_absindex(L, idx);
  lua_pushvalue(L, idx);
  if (lua_rawget(L, seen) == LUA_TTABLE)
    return;
  lua_pop(L, 1);
  lua_newtable(L);
  int copy = lua_gettop(L);
  lua_pushvalue(L, idx);
  lua_pushvalue(L, copy);
  lua_rawset(L, seen);
  int id = sandbox_record_of(L, idx);
  if (id >= 0)
    sandbox_set_record(L, copy, id); /* same keys, same lines */
  if (lua_getmetatable(L, idx))
    lua_setmetatable(L, copy);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    lua_pushvalue(L, -2);
    if (lua_istable(L, -2))
      deep_copy(L, -2, seen, depth + 1);
    else
      lua_pushvalue(L, -2);
    lua_rawset(L, copy);
    lua_pop(L, 1);
  }
}

/* Merges `over` into `dst` (dst is already a private copy). `active` (absolute index) holds the
 * override tables being merged on the way here: meeting one again is a cycle, which a merge
 * (unlike a copy) would follow forever. */
static void merge_into(lua_State *L, int dst, int over, int seen, int active, int depth)
{
  check_depth(L, depth);
  dst = lua_absindex(L, dst);
  over = lua_absindex(L, over);
  lua_pushvalue(L, over);
  lua_pushboolean(L, 1);
  lua_rawset(L, active);
  struct sandbox *sb = sandbox_of(L);
  int over_id = sandbox_record_of(L, over);
  int dst_id = sandbox_record_of(L, dst);
  /* dst may share its record with the table it was copied from: give it its own (keeping
   * the base constructor's place for keys the override does not name). Records may move
   * when one is added, so pointers into the map are taken only after. */
  /* outside a plan's sandbox (the REPL) there are no source records to keep */
  int new_id = sb ? srcmap_copy_record(&sb->map, dst_id, "tycho.extend", 0) : -1;
  const struct srcmap_record *orec = sb ? srcmap_get(&sb->map, over_id) : NULL;
  const struct srcmap_record *drec = sb ? srcmap_get(&sb->map, dst_id) : NULL;
  if (new_id >= 0) {
    struct srcmap_record *nrec = &sb->map.records[new_id];
    if (drec) {
      nrec->where = drec->where;
      nrec->line = drec->line;
    } else if (orec) {
      nrec->where = orec->where;
      nrec->line = orec->line;
    }
    sandbox_set_record(L, dst, new_id);
  }
  lua_pushnil(L);
  while (lua_next(L, over)) {
    int v = lua_gettop(L), k = v - 1;
    orec = sb ? srcmap_get(&sb->map, over_id) : NULL; /* re-read: a nested merge may have moved it */
    if (new_id >= 0 && orec) {
      const struct srcmap_field *f =
        lua_type(L, k) == LUA_TSTRING ? srcmap_find_field(&sb->map, over_id, lua_tostring(L, k), 0)
        : lua_isinteger(L, k) ? srcmap_find_field(&sb->map, over_id, NULL, (long)lua_tointeger(L, k))
        : NULL;
      int line = f ? f->line : orec->line;
      const char *where = f && f->where ? f->where : orec->where;
      if (lua_type(L, k) == LUA_TSTRING)
        srcmap_set_field(&sb->map, new_id, lua_tostring(L, k), 0, where, line);
      else if (lua_isinteger(L, k))
        srcmap_set_field(&sb->map, new_id, NULL, (long)lua_tointeger(L, k), where, line);
    }
    lua_pushvalue(L, k);
    int existing = lua_rawget(L, dst);
    if (existing == LUA_TTABLE && lua_istable(L, v) && !tycho_is_list(L, v)) {
      lua_pushvalue(L, v);
      if (lua_rawget(L, active) != LUA_TNIL)
        luaL_error(L, "tycho.extend: the override refers to itself through '%s' (a cycle), which "
                   "cannot be merged into the base", lua_type(L, k) == LUA_TSTRING ? lua_tostring(L, k) : "?");
      lua_pop(L, 1);
      merge_into(L, -1, v, seen, active, depth + 1);
      lua_pop(L, 1);
    } else {
      lua_pop(L, 1);
      lua_pushvalue(L, k);
      if (lua_istable(L, v))
        deep_copy(L, v, seen, depth + 1);
      else
        lua_pushvalue(L, v);
      lua_rawset(L, dst);
    }
    lua_pop(L, 1);
  }
  lua_pushvalue(L, over);
  lua_pushnil(L);
  lua_rawset(L, active);
}

void tycho_extend(lua_State *L, int base, int over)
{
  base = lua_absindex(L, base);
  over = lua_absindex(L, over);
  luaL_checkstack(L, 8, "tycho.extend");
  lua_newtable(L); /* seen: originals of base -> copies */
  int seen = lua_gettop(L);
  deep_copy(L, base, seen, 1);
  lua_newtable(L); /* a fresh map for the override side, so no table aliases one of base's */
  int seen_over = lua_gettop(L);
  lua_newtable(L); /* the override tables being merged */
  int active = lua_gettop(L);
  merge_into(L, -3, over, seen_over, active, 1);
  lua_pop(L, 2);
  lua_remove(L, seen);
}

static int l_plan(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  mark_plan(L, 1);
  return 1;
}

static int l_extend(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  tycho_extend(L, 1, 2);
  if (tycho_is_plan(L, 1) || tycho_is_plan(L, 2))
    mark_plan(L, -1);
  return 1;
}

static const luaL_Reg tycho_functions[] = {
  { "plan", l_plan },
  { "extend", l_extend },
  { NULL, NULL },
};

int luaopen_tycho(lua_State *L)
{
  luaL_newlib(L, tycho_functions);
  lua_pushstring(L, TYCHO_VERSION);
  lua_setfield(L, -2, "version");
  return 1;
}
