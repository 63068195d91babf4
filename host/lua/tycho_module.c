/* The `tycho` Lua module: the constructors plan files call. The work of turning a plan table
 * into a compiled plan is the host's (host/plan/compile.c); here are only tycho.plan, which
 * marks a table as a plan, tycho.extend, which composes plans while keeping, for every
 * field, the file and line it was written on (see host/lua/srcmap.h), and tycho.models.from_hf,
 * the model table of a Hugging Face config.json. All run on plan input: extend charges its keys
 * to the plan's instruction count and its source records to the memory cap, and takes time
 * linear in its tables; from_hf charges the file's bytes to both. */
#include "lua/tycho_module.h"

#include <lauxlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "io/hf.h"
#include "lua/sandbox.h"
#include "lua/sandbox_internal.h"
#include "util/path.h"

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
  luaL_checkstack(L, 12, "tycho.extend: nested tables");
}

/* What extend's work costs in the plan's instruction count: a key copied or merged is a few
 * table operations and a source-record lookup. */
#define EXTEND_KEY_COST 8.0

/* The C heap a source record of n fields takes (srcmap grows its arrays by doubling), which
 * the sandbox's allocator does not see: it is reserved against the memory cap by hand. */
static double record_bytes(const struct srcmap_record *r)
{
  double bytes = 2.0 * sizeof(struct srcmap_record);
  for (int i = 0; r && i < r->n_fields; i++)
    bytes += 2.0 * sizeof(struct srcmap_field) + (r->fields[i].key ? strlen(r->fields[i].key) + 1 : 0);
  return bytes;
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
  if (lua_getmetatable(L, idx)) {
    /* the sandbox's setmetatable refuses __gc, but a plan can add it to a metatable already
     * set; lua_setmetatable here would then make the copy a finalizer that runs at close */
    lua_pushliteral(L, "__gc");
    if (lua_rawget(L, -2) != LUA_TNIL)
      luaL_error(L, "tycho.extend: a table to copy has a metatable with __gc; finalizers are not "
                 "available to plans (sandbox)");
    lua_pop(L, 1);
    lua_setmetatable(L, copy);
  }
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    sandbox_charge(L, "tycho.extend", EXTEND_KEY_COST);
    lua_pushvalue(L, -2);
    if (lua_istable(L, -2))
      deep_copy(L, -2, seen, depth + 1);
    else
      lua_pushvalue(L, -2);
    lua_rawset(L, copy);
    lua_pop(L, 1);
  }
}

/* Pushes a table from the keys of record id to their positions in its field array, so that a
 * merge finds a key's line in constant time (a search of the record per key made extending a
 * table of n keys take n^2 steps). */
static void push_field_index(lua_State *L, struct sandbox *sb, int id)
{
  const struct srcmap_record *r = sb ? srcmap_get(&sb->map, id) : NULL;
  lua_createtable(L, 0, r ? r->n_fields : 0);
  for (int i = 0; r && i < r->n_fields; i++) {
    if (r->fields[i].key)
      lua_pushstring(L, r->fields[i].key);
    else
      lua_pushinteger(L, r->fields[i].index);
    lua_pushinteger(L, i);
    lua_rawset(L, -3);
  }
}

/* The position of key k (absolute index) in the record's index at idx, or -1. String keys and
 * integer keys are the ones records know. */
static int field_pos(lua_State *L, int index_idx, int k)
{
  if (lua_type(L, k) != LUA_TSTRING && !lua_isinteger(L, k))
    return -1;
  lua_pushvalue(L, k);
  int pos = lua_rawget(L, index_idx) == LUA_TNUMBER ? (int)lua_tointeger(L, -1) : -1;
  lua_pop(L, 1);
  return pos;
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
  if (sb)
    sandbox_reserve(L, "tycho.extend", record_bytes(srcmap_get(&sb->map, dst_id)), 1);
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
  push_field_index(L, sb, over_id);
  int over_index = lua_gettop(L);
  push_field_index(L, sb, new_id);
  int new_index = lua_gettop(L);
  lua_pushnil(L);
  while (lua_next(L, over)) {
    int v = lua_gettop(L), k = v - 1;
    sandbox_charge(L, "tycho.extend", EXTEND_KEY_COST);
    orec = sb ? srcmap_get(&sb->map, over_id) : NULL; /* re-read: a nested merge may have moved it */
    if (new_id >= 0 && orec && (lua_type(L, k) == LUA_TSTRING || lua_isinteger(L, k))) {
      int opos = field_pos(L, over_index, k);
      const struct srcmap_field *f = opos >= 0 ? &orec->fields[opos] : NULL;
      int line = f ? f->line : orec->line;
      const char *where = f && f->where ? f->where : orec->where;
      int npos = field_pos(L, new_index, k);
      if (npos >= 0) {
        struct srcmap_field *nf = &sb->map.records[new_id].fields[npos];
        nf->where = where;
        nf->line = line;
      } else {
        const char *key = lua_type(L, k) == LUA_TSTRING ? lua_tostring(L, k) : NULL;
        sandbox_reserve(L, "tycho.extend", 2.0 * sizeof(struct srcmap_field) + (key ? strlen(key) + 1 : 0), 1);
        if (srcmap_add_field(&sb->map, new_id, key, key ? 0 : (long)lua_tointeger(L, k), where, line) == 0) {
          lua_pushvalue(L, k);
          lua_pushinteger(L, sb->map.records[new_id].n_fields - 1);
          lua_rawset(L, new_index);
        }
      }
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
  lua_pop(L, 2); /* the field indexes */
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

/* tycho.models.from_hf(dir): the one file a plan reads besides its modules, and only this one:
 * DIR/config.json, opened without waiting, refused unless a regular file of at most
 * PATH_MAX_TEXT_BYTES, its bytes charged to the instruction count and the memory cap first, and
 * nothing of it reaches the plan but the model's numbers. */
static int l_from_hf(lua_State *L)
{
  const char *dir = luaL_checkstring(L, 1);
  char path[4200], why[1024];
  struct stat st;
  snprintf(path, sizeof path, "%s/%s", dir, HF_CONFIG);
  const double bytes = stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size < PATH_MAX_TEXT_BYTES
                           ? (double)st.st_size : (double)PATH_MAX_TEXT_BYTES;
  sandbox_charge(L, "tycho.models.from_hf", bytes / SCAN_BYTES_PER_INSTRUCTION);
  sandbox_reserve(L, "tycho.models.from_hf", 4.0 * bytes, 0); /* the text, its nodes and strings */
  struct hf_config c;
  if (hf_config_read(dir, &c, why, sizeof why))
    return luaL_error(L, "tycho.models.from_hf: %s", why);
  lua_createtable(L, 0, 12);
  lua_pushstring(L, "llama");
  lua_setfield(L, -2, "family");
  const struct { const char *key; int v; } ints[] = {
    { "n_layers", c.n_layers }, { "dim", c.dim }, { "n_heads", c.n_heads }, { "n_kv_heads", c.n_kv_heads },
    { "ffn_dim", c.ffn_dim }, { "vocab", c.vocab }, { "max_seq", c.max_seq },
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    lua_pushinteger(L, ints[i].v);
    lua_setfield(L, -2, ints[i].key);
  }
  lua_pushnumber(L, c.norm_eps);
  lua_setfield(L, -2, "norm_eps");
  lua_pushnumber(L, c.rope_theta);
  lua_setfield(L, -2, "rope_theta");
  lua_pushboolean(L, c.tie_embeddings);
  lua_setfield(L, -2, "tie_embeddings");
  if (c.experts > 0) { /* Mixtral: every layer's MLP sparse, each expert intermediate_size wide */
    lua_createtable(L, 0, 3);
    lua_pushinteger(L, c.experts);
    lua_setfield(L, -2, "experts");
    lua_pushinteger(L, c.top_k);
    lua_setfield(L, -2, "top_k");
    lua_pushnumber(L, c.aux_loss);
    lua_setfield(L, -2, "aux_loss");
    lua_setfield(L, -2, "moe");
  }
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
  lua_createtable(L, 0, 1);
  lua_pushcfunction(L, l_from_hf);
  lua_setfield(L, -2, "from_hf");
  lua_setfield(L, -2, "models");
  return 1;
}
