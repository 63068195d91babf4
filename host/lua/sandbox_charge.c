/* The C library's work charged to the sandbox's instruction count (see sandbox.c): the
 * charge and the memory reservation the library wrappers and tycho.extend make, and the
 * wrapped or rewritten string, table, utf8 and base functions that loop or scan without
 * allocating. */
#include <lauxlib.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "sandbox_internal.h"

/* The count hook sees only VM instructions, yet one call of a library function can do work
 * no allocation pays for (string.rep("", n) loops n times and makes an empty string;
 * table.move over nils, table.insert under a huge __len, utf8.len over a long string), or
 * work the memory cap bounds per call but not per plan (a loop of string.rep calls, each
 * allocating and dropping 8 MB). So every allocation is charged to the count, one instruction
 * an ALLOC_BYTES_PER_INSTRUCTION bytes (sandbox_alloc), and the library functions that loop or
 * scan without allocating charge their work before they do it: an element a table function
 * moves or compares costs ELEMENT_COST instructions, a byte a function parses
 * 1 / SCAN_BYTES_PER_INSTRUCTION, an argument or a result one. Work
 * that would pass the limit fires the limit before it starts, naming the call, and the limit
 * stays fired as it does from the hook. */


/* "file:line" of the innermost plan (Lua) frame, for a charge made under C frames. */
static void plan_position(lua_State *L, char *buf, size_t n)
{
  lua_Debug ar;
  buf[0] = 0;
  for (int level = 0; level < 64 && lua_getstack(L, level, &ar); level++)
    if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0) {
      snprintf(buf, n, "%s:%d", ar.short_src, ar.currentline);
      return;
    }
}

void sandbox_charge(lua_State *L, const char *what, double instructions)
{
  struct sandbox *sb = sandbox_of(L);
  if (!sb || !sb->instruction_limit)
    return;
  if (!sb->limit_hit && instructions <= (double)(sb->instruction_limit - sb->instructions)) {
    sb->instructions += (long long)instructions;
    return;
  }
  if (!sb->limit_hit) {
    char where[512];
    plan_position(L, where, sizeof where);
    snprintf(sb->limit_msg, sizeof sb->limit_msg, "%s%s%s: plan exceeded the instruction limit of %lld "
             "Lua instructions (the C library's work counts too); raise it with --max-instructions",
             where, where[0] ? ": " : "", what, sb->instruction_limit);
    sb->limit_hit = 1;
    sb->instructions = sb->instruction_limit + 1;
    lua_sethook(L, sandbox_count_hook, LUA_MASKCOUNT, 1);
  }
  lua_pushstring(L, sb->limit_msg);
  lua_error(L);
}

void sandbox_reserve(lua_State *L, const char *what, double bytes, int keep)
{
  struct sandbox *sb = sandbox_of(L);
  if (!sb || !sb->mem_limit)
    return;
  if (bytes > (double)(sb->mem_limit - (sb->mem_used < sb->mem_limit ? sb->mem_used : sb->mem_limit))) {
    char where[512], msg[800];
    plan_position(L, where, sizeof where);
    snprintf(msg, sizeof msg, "%s%s%s: plan exceeded the memory cap of %zu MiB (it would need %.0f "
             "bytes more); raise it with --max-memory", where, where[0] ? ": " : "", what,
             sb->mem_limit >> 20, bytes);
    lua_pushstring(L, msg);
    lua_error(L);
  }
  if (keep)
    sb->mem_used += (size_t)bytes;
}

/* The errors of a library function called from a wrapper get the plan line and the call's
 * name, which a C function called from C would not have ("bad argument #1 to '?'"). */
static int rethrow(lua_State *L, const char *what)
{
  struct sandbox *sb = sandbox_of(L);
  if (!(sb && sb->limit_hit) && lua_type(L, -1) == LUA_TSTRING) {
    const char *msg = lua_tostring(L, -1);
    const char *q = strstr(msg, " to '?'");
    if (q) { /* "bad argument #2 to 'string.byte'", as Lua says it of the unwrapped function */
      lua_pushlstring(L, msg, (size_t)(q - msg));
      lua_pushfstring(L, " to '%s'%s", what, q + 7);
      lua_concat(L, 2);
      lua_remove(L, -2);
      msg = lua_tostring(L, -1);
    }
    if (!sandbox_has_position(msg)) {
      luaL_where(L, 1);
      if (q)
        lua_pushliteral(L, ""); /* the message names the call already */
      else
        lua_pushfstring(L, "%s: ", what);
      lua_rotate(L, -3, 2);
      lua_concat(L, 3);
    }
  }
  return lua_error(L);
}

/* A library function (upvalue 1, named by upvalue 2) whose work is in the bytes of its string
 * arguments and the count of its arguments and results (string.byte, utf8.len, tonumber,
 * select...): charged before and after the call. string.format also pays upvalue 3
 * instructions a byte it made: printing a float digit by digit ("%99.99f" of 1e308 is 400
 * bytes in about 8 us) is slower than the allocation the bytes take. */
static int charged_call(lua_State *L)
{
  const char *what = lua_tostring(L, lua_upvalueindex(2));
  int n = lua_gettop(L);
  double bytes = 0;
  for (int i = 1; i <= n; i++)
    if (lua_type(L, i) == LUA_TSTRING)
      bytes += (double)lua_rawlen(L, i);
  sandbox_charge(L, what, n + bytes / SCAN_BYTES_PER_INSTRUCTION);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  if (lua_pcall(L, n, LUA_MULTRET, 0) != LUA_OK)
    return rethrow(L, what);
  double per_byte = lua_tonumber(L, lua_upvalueindex(3));
  if (per_byte > 0 && lua_type(L, 1) == LUA_TSTRING)
    sandbox_charge(L, what, per_byte * (double)lua_rawlen(L, 1));
  sandbox_charge(L, what, lua_gettop(L));
  return lua_gettop(L);
}

/* string.rep: n copies cost n instructions even when they are empty; the result must fit the
 * memory cap, which is checked first, so the library's own loop then runs within both. */
static int checked_rep(lua_State *L)
{
  size_t l, lsep;
  luaL_checklstring(L, 1, &l);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_optlstring(L, 3, "", &lsep);
  if (n > 0) {
    sandbox_reserve(L, "string.rep", (double)n * (double)l + (double)(n - 1) * (double)lsep, 0);
    sandbox_charge(L, "string.rep", (double)n);
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  if (lua_pcall(L, lua_gettop(L) - 1, 1, 0) != LUA_OK)
    return rethrow(L, "string.rep");
  return 1;
}

/* The table functions that loop over a range are written here rather than wrapped: the range
 * comes from __len, which a plan may make return a different number on each call, so it is
 * read once, the whole range charged, and then walked. */
static void charge_elements(lua_State *L, const char *what, lua_Integer from, lua_Integer to)
{
  if (to >= from)
    sandbox_charge(L, what, ((double)to - (double)from + 1) * ELEMENT_COST);
}

static int checked_insert(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer e = luaL_len(L, 1);
  luaL_argcheck(L, e < LUA_MAXINTEGER, 1, "table too long to insert into");
  e++; /* the first empty slot */
  lua_Integer pos;
  switch (lua_gettop(L)) {
  case 2:
    pos = e;
    break;
  case 3:
    pos = luaL_checkinteger(L, 2);
    luaL_argcheck(L, (lua_Unsigned)pos - 1u < (lua_Unsigned)e, 2, "position out of bounds");
    charge_elements(L, "table.insert", pos + 1, e);
    for (lua_Integer i = e; i > pos; i--) {
      lua_geti(L, 1, i - 1);
      lua_seti(L, 1, i);
    }
    break;
  default:
    return luaL_error(L, "wrong number of arguments to 'insert'");
  }
  lua_seti(L, 1, pos);
  return 0;
}

static int checked_remove(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer size = luaL_len(L, 1);
  lua_Integer pos = luaL_optinteger(L, 2, size);
  if (pos != size)
    luaL_argcheck(L, (lua_Unsigned)pos - 1u <= (lua_Unsigned)size, 2, "position out of bounds");
  charge_elements(L, "table.remove", pos + 1, size);
  lua_geti(L, 1, pos);
  for (; pos < size; pos++) {
    lua_geti(L, 1, pos + 1);
    lua_seti(L, 1, pos);
  }
  lua_pushnil(L);
  lua_seti(L, 1, pos);
  return 1;
}

static int checked_move(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer f = luaL_checkinteger(L, 2);
  lua_Integer e = luaL_checkinteger(L, 3);
  lua_Integer t = luaL_checkinteger(L, 4);
  int tt = lua_isnoneornil(L, 5) ? 1 : 5;
  luaL_checktype(L, tt, LUA_TTABLE);
  if (e >= f) {
    luaL_argcheck(L, f > 0 || e < LUA_MAXINTEGER + f, 3, "too many elements to move");
    luaL_argcheck(L, t <= LUA_MAXINTEGER - (e - f), 4, "destination wrap around");
    charge_elements(L, "table.move", f, e);
    if (t > e || t <= f || (tt != 1 && !lua_compare(L, 1, tt, LUA_OPEQ))) {
      for (lua_Integer i = 0; i <= e - f; i++) {
        lua_geti(L, 1, f + i);
        lua_seti(L, tt, t + i);
      }
    } else {
      for (lua_Integer i = e - f; i >= 0; i--) {
        lua_geti(L, 1, f + i);
        lua_seti(L, tt, t + i);
      }
    }
  }
  lua_pushvalue(L, tt);
  return 1;
}

static int checked_concat(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TTABLE);
  size_t lsep;
  const char *sep = luaL_optlstring(L, 2, "", &lsep);
  lua_Integer i = luaL_optinteger(L, 3, 1);
  lua_Integer last = lua_isnoneornil(L, 4) ? luaL_len(L, 1) : luaL_checkinteger(L, 4);
  charge_elements(L, "table.concat", i, last);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (; i <= last; i++) {
    lua_geti(L, 1, i);
    if (!lua_isstring(L, -1))
      return luaL_error(L, "invalid value (%s) at index %I in table for 'concat'", luaL_typename(L, -1),
                        (LUAI_UACINT)i);
    luaL_addvalue(&b);
    if (i < last)
      luaL_addlstring(&b, sep, lsep);
    if (i == LUA_MAXINTEGER)
      break;
  }
  luaL_pushresult(&b);
  return 1;
}

static int checked_unpack(lua_State *L)
{
  lua_Integer i = luaL_optinteger(L, 2, 1);
  lua_Integer e = lua_isnoneornil(L, 3) ? (luaL_checkany(L, 1), luaL_len(L, 1)) : luaL_checkinteger(L, 3);
  if (i > e)
    return 0;
  lua_Unsigned n = (lua_Unsigned)e - (lua_Unsigned)i;
  if (n >= (unsigned int)INT_MAX || !lua_checkstack(L, (int)(++n)))
    return luaL_error(L, "too many results to unpack");
  charge_elements(L, "table.unpack", i, e);
  for (; i < e; i++)
    lua_geti(L, 1, i);
  lua_geti(L, 1, e);
  return (int)n;
}

/* table.sort's comparisons: each is charged, so an n log n sort of a table whose __len is
 * huge (and whose __index makes every element up) stops at the limit. Upvalue 1: the plan's
 * comparator, or nil for '<'. */
static int sort_compare(lua_State *L)
{
  sandbox_charge(L, "table.sort", ELEMENT_COST);
  if (lua_isnil(L, lua_upvalueindex(1))) {
    lua_pushboolean(L, lua_compare(L, 1, 2, LUA_OPLT));
    return 1;
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, 2, 1);
  return 1;
}

static int checked_sort(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TTABLE);
  if (!lua_isnoneornil(L, 2))
    luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  lua_pushcclosure(L, sort_compare, 1);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  if (lua_pcall(L, 2, 0, 0) != LUA_OK)
    return rethrow(L, "table.sort");
  return 0;
}

/* collectgarbage: "count", and "collect" and "step" charged the heap they walk. The others
 * would let a plan make every allocation walk the heap (setpause 0) or change nothing a plan
 * needs. */
static int checked_collectgarbage(lua_State *L)
{
  static const char *const opts[] = { "collect", "step", "count", NULL };
  int o = luaL_checkoption(L, 1, "collect", opts);
  struct sandbox *sb = sandbox_of(L);
  if (o == 2) {
    int k = lua_gc(L, LUA_GCCOUNT), b = lua_gc(L, LUA_GCCOUNTB);
    lua_pushnumber(L, (lua_Number)k + ((lua_Number)b / 1024));
    return 1;
  }
  if (sb)
    sandbox_charge(L, "collectgarbage", (double)sb->mem_used / ALLOC_BYTES_PER_INSTRUCTION);
  if (o == 0) {
    lua_gc(L, LUA_GCCOLLECT);
    lua_pushinteger(L, 0);
  } else {
    lua_pushboolean(L, lua_gc(L, LUA_GCSTEP, 0));
  }
  return 1;
}

static void wrap_field(lua_State *L, int lib, const char *libname, const char *name, lua_CFunction f,
                       int with_name)
{
  lua_getfield(L, lib, name);
  int n = 1;
  if (with_name) {
    lua_pushfstring(L, "%s%s%s", libname ? libname : "", libname ? "." : "", name);
    lua_pushnil(L); /* charged_call's cost a byte made (string.format) */
    n = 3;
  }
  lua_pushcclosure(L, f, n);
  lua_setfield(L, lib, name);
}

static void set_field(lua_State *L, int lib, const char *name, lua_CFunction f)
{
  lua_pushcfunction(L, f);
  lua_setfield(L, lib, name);
}

/* Installs all of the above in the real library tables (before their read-only proxies), so
 * the methods of every string get them too. */
void sandbox_charge_libraries(lua_State *L)
{
  static const char *const string_charged[] = { "byte", "unpack", "packsize", "pack", "format", NULL };
  static const char *const utf8_charged[] = { "len", "offset", "codepoint", NULL };
  static const char *const base_charged[] = { "tonumber", "rawequal", "select", NULL };
  lua_getglobal(L, "string");
  int lib = lua_gettop(L);
  wrap_field(L, lib, NULL, "rep", checked_rep, 0);
  for (int i = 0; string_charged[i]; i++)
    wrap_field(L, lib, "string", string_charged[i], charged_call, 1);
  lua_getfield(L, lib, "format"); /* now charged_call: add its per-byte cost */
  lua_pushnumber(L, FORMAT_BYTE_COST);
  lua_setupvalue(L, -2, 3);
  lua_pop(L, 1);
  lua_getglobal(L, "utf8");
  lib = lua_gettop(L);
  for (int i = 0; utf8_charged[i]; i++)
    wrap_field(L, lib, "utf8", utf8_charged[i], charged_call, 1);
  lua_getglobal(L, "table");
  lib = lua_gettop(L);
  set_field(L, lib, "insert", checked_insert);
  set_field(L, lib, "remove", checked_remove);
  set_field(L, lib, "move", checked_move);
  set_field(L, lib, "concat", checked_concat);
  set_field(L, lib, "unpack", checked_unpack);
  wrap_field(L, lib, NULL, "sort", checked_sort, 0);
  lua_pushglobaltable(L);
  lib = lua_gettop(L);
  for (int i = 0; base_charged[i]; i++)
    wrap_field(L, lib, NULL, base_charged[i], charged_call, 1);
  set_field(L, lib, "collectgarbage", checked_collectgarbage);
  lua_pop(L, 4);
}
