/* The sandboxed Lua state for plan files: see sandbox.h for the rules and why.
 *
 * How a plan is kept from crashing or hanging tycho. The limits are enforced in
 * process, by counting, not by a forked child under RLIMIT_CPU:
 *  - the count is deterministic: the same plan hits the instruction limit at the same
 *    instruction on every rank of a job (a CPU-time limit fires when the machine is slow, on
 *    one rank and not on another), so under mpirun all ranks stop together, with the same
 *    message;
 *  - the compiled plan keeps its live Lua side: plan_compile calls the plan's stages,
 *    tp_split and recompute functions while it reads, and every message names the field's
 *    file and line from source records kept in this state; a child would have to ship all of
 *    that back, and forking inside an MPI process (the trainer compiles plans at run time
 *    too) is unsafe with Open MPI;
 *  - in process, the ways out of the count are few and each is closed here:
 *    * the limit is sticky: once it fires, the count hook runs on every instruction and
 *      raises again, so pcall/xpcall (whose handler is skipped once the limit fired, since
 *      the error is raised where hooks are off), __close handlers and loops around them
 *      unwind to the host's own lua_pcall; and every error pcall catches or xpcall's
 *      handler sees costs ERROR_COST instructions, so a loop of caught errors reaches the
 *      limit about as fast as a plain loop;
 *    * pattern matching runs in C, uncounted: string.find, match, gmatch and gsub charge an
 *      upper bound of the matcher's work to the count first, and refuse a match whose bound
 *      exceeds what is left (see sandbox_patterns.c);
 *    * __gc finalizers would run at lua_close, after the plan was read: setmetatable refuses
 *      a metatable with __gc;
 *    * the rest of the C library is charged too: every allocation by its bytes, and the
 *      functions that loop or scan without allocating (string.rep of "", the table functions
 *      under a huge __len, utf8.len, table.sort's comparisons) by their work, before they do
 *      it (see sandbox_charge.c); tycho.extend charges its keys;
 *  - the host reads the plan table under lua_pcall too (host/plan/compile.c), so an __index
 *    that raises or loops is a plan error, never a Lua panic.
 * --unsafe lifts the limits (and these guards) with the rest of the sandbox. */
#define _XOPEN_SOURCE 700
#include "sandbox.h"

#include <ctype.h>
#include <errno.h>
#include <lauxlib.h>
#include <limits.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "sandbox_internal.h"
#include "util/path.h"

#define SANDBOX_KEY "tycho.sandbox"
#define PROV_KEY "tycho.prov"
#define LOADED_KEY "tycho.loaded"
#define HOOK_EVERY 1000

/* ---- limits ----------------------------------------------------------------------------- */

static void *sandbox_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
  struct sandbox *sb = ud;
  if (!ptr)
    osize = 0; /* osize then encodes the object type, not a size */
  if (nsize == 0) {
    free(ptr);
    sb->mem_used -= osize;
    return NULL;
  }
  if (nsize > osize && sb->mem_limit && sb->mem_used + (nsize - osize) > sb->mem_limit) {
    sb->mem_exceeded = 1;
    return NULL;
  }
  void *p = realloc(ptr, nsize);
  if (p) {
    sb->mem_used = sb->mem_used - osize + nsize;
    if (nsize > osize && sb->instruction_limit) /* the C work of filling it (see sandbox_charge) */
      sb->instructions += (long long)((double)(nsize - osize) / ALLOC_BYTES_PER_INSTRUCTION);
  }
  return p;
}

/* Once the limit fires it stays fired: the hook then runs on every instruction and raises the
 * same message again, so a pcall or xpcall that caught it (or a handler, a __close, a loop
 * around them) cannot run one more instruction; the error unwinds every Lua frame up to the
 * host's own lua_pcall. */
void sandbox_count_hook(lua_State *L, lua_Debug *ar)
{
  struct sandbox *sb = sandbox_of(L);
  (void)ar;
  if (!sb->limit_hit) {
    lua_Debug here;
    if (lua_getstack(L, 0, &here) && lua_getinfo(L, "Sl", &here) && here.currentline > 0)
      snprintf(sb->last_where, sizeof sb->last_where, "%s:%d", here.short_src, here.currentline);
    sb->instructions += HOOK_EVERY;
    if (!sb->instruction_limit || sb->instructions <= sb->instruction_limit)
      return;
    sb->limit_hit = 1;
    snprintf(sb->limit_msg, sizeof sb->limit_msg, "%s: plan exceeded the instruction limit of %lld Lua "
             "instructions (an endless loop?); raise it with --max-instructions",
             sb->last_where[0] ? sb->last_where : "plan", sb->instruction_limit);
    lua_sethook(L, sandbox_count_hook, LUA_MASKCOUNT, 1);
  }
  lua_pushstring(L, sb->limit_msg);
  lua_error(L);
}

struct sandbox *sandbox_of(lua_State *L)
{
  lua_getfield(L, LUA_REGISTRYINDEX, SANDBOX_KEY);
  struct sandbox *sb = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return sb;
}

/* ---- provenance ------------------------------------------------------------------------ */

int sandbox_record_of(lua_State *L, int idx)
{
  idx = lua_absindex(L, idx);
  if (!lua_istable(L, idx))
    return -1;
  if (lua_getfield(L, LUA_REGISTRYINDEX, PROV_KEY) != LUA_TTABLE) { /* not a plan's state (the REPL's) */
    lua_pop(L, 1);
    return -1;
  }
  lua_pushvalue(L, idx);
  lua_rawget(L, -2);
  int id = lua_isinteger(L, -1) ? (int)lua_tointeger(L, -1) : -1;
  lua_pop(L, 2);
  return id;
}

void sandbox_set_record(lua_State *L, int idx, int id)
{
  idx = lua_absindex(L, idx);
  if (lua_getfield(L, LUA_REGISTRYINDEX, PROV_KEY) != LUA_TTABLE) { /* no source records here */
    lua_pop(L, 1);
    return;
  }
  lua_pushvalue(L, idx);
  lua_pushinteger(L, id);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

int sandbox_where(lua_State *L, int idx, const char *key, long index, char *buf, size_t n)
{
  struct sandbox *sb = sandbox_of(L);
  int id = sandbox_record_of(L, idx);
  const struct srcmap_record *r = srcmap_get(&sb->map, id);
  if (!r)
    return 0;
  const struct srcmap_field *f = srcmap_find_field(&sb->map, id, key, index);
  if (f) {
    const char *w = f->where ? f->where : r->where;
    if (f->line > 0)
      snprintf(buf, n, "%s:%d", w, f->line);
    else
      snprintf(buf, n, "%s", w);
  } else if (r->line > 0) {
    snprintf(buf, n, "%s:%d", r->where, r->line);
  } else {
    snprintf(buf, n, "%s", r->where);
  }
  return 1;
}

/* __tycho_tc(id, t): ties a table built by plan code to its constructor's record. */
static int tycho_tc(lua_State *L)
{
  lua_Integer id = luaL_checkinteger(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  sandbox_set_record(L, 2, (int)id);
  lua_settop(L, 2);
  return 1;
}

/* ---- strict globals -------------------------------------------------------------------- */

static int strict_index(lua_State *L)
{
  static const char *const withheld[] = { "io", "package", "debug", "dofile", "loadfile", "coroutine", NULL };
  const char *name = lua_tostring(L, 2);
  for (int i = 0; name && withheld[i]; i++)
    if (strcmp(name, withheld[i]) == 0)
      return luaL_error(L, "'%s' is not available in the plan sandbox; run tycho with --unsafe "
                        "if the plan needs it", name);
  return luaL_error(L, "reads undeclared global '%s' (a typo? plans see only declared globals "
                    "and the names require returns)", name ? name : "?");
}

static int strict_newindex(lua_State *L)
{
  const char *name = lua_tostring(L, 2);
  return luaL_error(L, "assigns to undeclared global '%s'; declare it with 'local %s'",
                    name ? name : "?", name ? name : "name");
}

/* ---- loading --------------------------------------------------------------------------- */

static int message_handler(lua_State *L)
{
  if (!lua_isstring(L, 1)) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
      return 1;
    lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  return 1;
}

int sandbox_pcall(struct sandbox *sb, int nargs, int nresults, char *err, size_t err_size)
{
  lua_State *L = sb->L;
  int base = lua_gettop(L) - nargs;
  lua_pushcfunction(L, message_handler);
  lua_insert(L, base);
  int status = lua_pcall(L, nargs, nresults, base);
  lua_remove(L, base);
  if (status == LUA_OK)
    return 0;
  if (status == LUA_ERRMEM || sb->mem_exceeded) {
    snprintf(err, err_size, "%s%splan exceeded the memory cap of %zu MiB; raise it with --max-memory",
             sb->last_where[0] ? sb->last_where : "", sb->last_where[0] ? ": " : "",
             sb->mem_limit >> 20);
  } else {
    snprintf(err, err_size, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "unknown error");
  }
  lua_pop(L, 1);
  return -1;
}

/* A plan or module source, opened without waiting and read only when it is a regular file of
 * at most PATH_MAX_TEXT_BYTES (a FIFO, a device such as /dev/zero or a folder is refused). */
static char *read_whole(const char *path, size_t *n, char *err, size_t err_size)
{
  char *buf;
  if (path_read_input(NULL, path, PATH_MAX_TEXT_BYTES, &buf, n, err, err_size))
    return NULL;
  return buf;
}

/* Loads a text chunk through the source-map rewriter; pushes the function or returns -1. */
static int load_rewritten(struct sandbox *sb, const char *path, char *err, size_t err_size)
{
  lua_State *L = sb->L;
  size_t n;
  char *src = read_whole(path, &n, err, err_size);
  if (!src)
    return -1;
  if (n >= 1 && src[0] == LUA_SIGNATURE[0]) {
    free(src);
    snprintf(err, err_size, "%s: binary chunks are refused; plans are Lua source", path);
    return -1;
  }
  char chunkname[1100];
  snprintf(chunkname, sizeof chunkname, "@%s", path);
  size_t rn = 0;
  char *rewritten = srcmap_rewrite(&sb->map, path, src, n, &rn);
  int status = LUA_ERRSYNTAX;
  if (rewritten) {
    status = luaL_loadbufferx(L, rewritten, rn, chunkname, "t");
    if (status != LUA_OK)
      lua_pop(L, 1);
    free(rewritten);
  }
  if (status != LUA_OK) /* the original text gives Lua's own message (or runs untracked) */
    status = luaL_loadbufferx(L, src, n, chunkname, "t");
  free(src);
  if (status != LUA_OK) {
    const char *msg = lua_tostring(L, -1) ? lua_tostring(L, -1) : "cannot load";
    size_t pl = strlen(path);
    if (status == LUA_ERRMEM || sb->mem_exceeded)
      snprintf(err, err_size, "%s: plan exceeded the memory cap of %zu MiB", path, sb->mem_limit >> 20);
    else if (strncmp(msg, path, pl) == 0 && msg[pl] == ':')
      snprintf(err, err_size, "%s", msg);
    else /* "C stack overflow" (nesting too deep for the parser) comes without a place */
      snprintf(err, err_size, "%s: %s", path, msg);
    lua_pop(L, 1);
    return -1;
  }
  return 0;
}

int sandbox_dofile(struct sandbox *sb, const char *path, int nargs, char *err, size_t err_size)
{
  if (load_rewritten(sb, path, err, err_size) < 0) {
    lua_pop(sb->L, nargs);
    return -1;
  }
  lua_insert(sb->L, -1 - nargs);
  return sandbox_pcall(sb, nargs, 1, err, err_size);
}

/* ---- require --------------------------------------------------------------------------- */

static int valid_module_name(const char *name)
{
  if (!*name || *name == '.')
    return 0;
  for (const char *p = name; *p; p++) {
    if (*p == '.') {
      if (p[1] == '.' || p[1] == 0)
        return 0;
    } else if (!(*p == '_' || *p == '-' || (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                 (*p >= '0' && *p <= '9'))) {
      return 0;
    }
  }
  return 1;
}

/* Finds name (dots already turned into '/') under dir; the real path must stay inside dir. */
static int find_module(const char *dir, const char *rel, char *out, size_t n)
{
  static const char *const forms[] = { "%s/%s.lua", "%s/%s/init.lua" };
  char real_dir[PATH_MAX], real_file[PATH_MAX];
  if (!realpath(dir, real_dir))
    return 0;
  for (int i = 0; i < 2; i++) {
    snprintf(out, n, forms[i], dir, rel);
    struct stat st;
    /* anything but a folder is found, so that a FIFO or a device is refused by name (read_whole) */
    if (stat(out, &st) != 0 || S_ISDIR(st.st_mode) || !realpath(out, real_file))
      continue;
    size_t dl = strlen(real_dir);
    if (strncmp(real_file, real_dir, dl) == 0 && real_file[dl] == '/')
      return 1;
  }
  return 0;
}

static void push_readonly(lua_State *L, int idx, const char *name);

static int sandbox_require(lua_State *L)
{
  struct sandbox *sb = sandbox_of(L);
  const char *name = luaL_checkstring(L, 1);
  lua_getfield(L, LUA_REGISTRYINDEX, LOADED_KEY);
  lua_getfield(L, -1, name);
  if (!lua_isnil(L, -1))
    return 1;
  lua_pop(L, 1);
  for (int i = 0; i < sb->n_modules; i++) {
    if (strcmp(name, sb->modules[i].name) == 0) {
      sb->modules[i].open(L);
      if (!sb->unsafe) { /* shared by every module of the plan, like the libraries */
        push_readonly(L, -1, name);
        lua_remove(L, -2);
      }
      lua_pushvalue(L, -1);
      lua_setfield(L, -3, name);
      return 1;
    }
  }
  if (!valid_module_name(name))
    return luaL_error(L, "require '%s': a plan module name is a dotted name like 'models.llama2' "
                      "(paths and '..' are refused)", name);
  char rel[512], path[PATH_MAX + 600];
  snprintf(rel, sizeof rel, "%s", name);
  for (char *p = rel; *p; p++)
    if (*p == '.')
      *p = '/';
  int found = 0;
  for (int i = 0; i < sb->n_search && !found; i++)
    found = find_module(sb->search[i], rel, path, sizeof path);
  if (!found) {
    if (sb->unsafe) { /* unsafe plans may also use Lua's own require */
      lua_getfield(L, LUA_REGISTRYINDEX, "tycho.lua_require");
      lua_pushvalue(L, 1);
      if (lua_pcall(L, 1, 1, 0) == LUA_OK)
        return 1;
      lua_pop(L, 1);
    }
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    luaL_addstring(&b, "module '");
    luaL_addstring(&b, name);
    luaL_addstring(&b, "' not found in the plan search path (");
    for (int i = 0; i < sb->n_search; i++) {
      if (i)
        luaL_addstring(&b, ", ");
      luaL_addstring(&b, sb->search[i]);
    }
    luaL_addstring(&b, sb->unsafe ? "), nor by Lua's require; add a folder with TYCHO_PATH"
                                  : "); add a folder with TYCHO_PATH");
    luaL_pushresult(&b);
    return luaL_error(L, "%s", lua_tostring(L, -1));
  }
  char err[1024];
  if (load_rewritten(sb, path, err, sizeof err) < 0)
    return luaL_error(L, "%s", err);
  lua_pushstring(L, name);
  lua_pushstring(L, path);
  lua_call(L, 2, 1); /* errors propagate with their own file:line */
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_pushboolean(L, 1);
  }
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, name);
  return 1;
}

/* load(chunk [, chunkname [, mode [, env]]]) for text chunks only. The chunk's environment is
 * env when one is given (nil included, as in Lua), else the plan's own globals. */
static int sandbox_load(lua_State *L)
{
  size_t n;
  int has_env = !lua_isnone(L, 4);
  lua_settop(L, 4); /* the chunk is pushed at 5, never mistaken for an env */
  const char *s = luaL_checklstring(L, 1, &n);
  const char *chunkname = luaL_optstring(L, 2, "=(load)");
  const char *mode = luaL_optstring(L, 3, "t");
  if (strcmp(mode, "t") != 0)
    return luaL_error(L, "load: binary chunks are refused in plans (mode must be \"t\")");
  sandbox_charge(L, "load", (double)n / SCAN_BYTES_PER_INSTRUCTION);
  int status = luaL_loadbufferx(L, s, n, chunkname, "t");
  if (status != LUA_OK) {
    luaL_pushfail(L);
    lua_insert(L, -2);
    return 2;
  }
  if (has_env) {
    lua_pushvalue(L, 4);
    if (!lua_setupvalue(L, -2, 1))
      lua_pop(L, 1);
  }
  return 1;
}

/* print writes to stderr: stdout belongs to tycho's own output (check --json). */
static int sandbox_print(lua_State *L)
{
  int n = lua_gettop(L);
  for (int i = 1; i <= n; i++) {
    size_t len;
    const char *s = luaL_tolstring(L, i, &len);
    sandbox_charge(L, "print", 1 + (double)len / SCAN_BYTES_PER_INSTRUCTION);
    if (i > 1)
      fputc('\t', stderr);
    fwrite(s, 1, len, stderr);
    lua_pop(L, 1);
  }
  fputc('\n', stderr);
  return 0;
}

/* ---- read-only libraries, locked metatables --------------------------------------------- */

/* The libraries a plan sees are read-only proxies, so a plan (or a module it requires) cannot
 * replace string.rep for every other module and for the methods of every string; reading a
 * field the sandbox removed says so instead of giving nil. The globals' strict guard and the
 * proxies' metatables are locked (__metatable), getmetatable on a string gives nil, and
 * rawset refuses the proxies. */
#define READONLY_KEY "tycho.readonly"

static const char *const removed_fields[] = {
  "os.execute", "os.exit", "os.remove", "os.rename", "os.tmpname", "os.setlocale", "os.difftime",
  "string.dump", NULL
};

static int proxy_index(lua_State *L)
{
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL || lua_type(L, 2) != LUA_TSTRING)
    return 1;
  const char *full = lua_pushfstring(L, "%s.%s", lua_tostring(L, lua_upvalueindex(2)), lua_tostring(L, 2));
  for (int i = 0; removed_fields[i]; i++)
    if (strcmp(full, removed_fields[i]) == 0)
      return luaL_error(L, "%s is not available to plans (sandbox); --unsafe lifts it", full);
  lua_pushnil(L);
  return 1;
}

static int proxy_newindex(lua_State *L)
{
  const char *key = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : luaL_typename(L, 2);
  return luaL_error(L, "%s.%s: the sandbox's libraries are read-only (every module of the plan shares "
                    "them); keep your own version in a local", lua_tostring(L, lua_upvalueindex(1)), key);
}

/* __pairs: an iterator over the library (upvalue 1) that hands out its keys and values but
 * never the library itself (next and the table, the usual triple, would give a plan the
 * writable table behind the proxy). */
static int proxy_next(lua_State *L)
{
  lua_settop(L, 2);
  if (lua_next(L, lua_upvalueindex(1)))
    return 2;
  lua_pushnil(L);
  return 1;
}

static int proxy_pairs(lua_State *L)
{
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_pushvalue(L, 1);
  lua_pushnil(L);
  return 3;
}

/* Pushes a read-only proxy of the library table at idx, named `name` in messages. */
/* The metatable on top (its __index and __newindex set) completed for a read-only view of the
 * table at `target`: pairs walks the target through an iterator that never hands it out, the
 * metatable is hidden, and the view, left on top, is registered as read-only. */
static void finish_readonly_view(lua_State *L, int target)
{
  lua_pushvalue(L, target);
  lua_pushcclosure(L, proxy_next, 1);
  lua_pushcclosure(L, proxy_pairs, 1);
  lua_setfield(L, -2, "__pairs");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
  lua_getfield(L, LUA_REGISTRYINDEX, READONLY_KEY);
  lua_pushvalue(L, -2);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}

static void push_readonly(lua_State *L, int idx, const char *name)
{
  int lib = lua_absindex(L, idx);
  lua_newtable(L); /* the proxy */
  lua_newtable(L); /* its metatable */
  lua_pushvalue(L, lib);
  lua_pushstring(L, name);
  lua_pushcclosure(L, proxy_index, 2);
  lua_setfield(L, -2, "__index");
  lua_pushstring(L, name);
  lua_pushcclosure(L, proxy_newindex, 1);
  lua_setfield(L, -2, "__newindex");
  finish_readonly_view(L, lib);
}

/* Replaces global `name` (a library table) by a read-only proxy of it. */
static void make_readonly(lua_State *L, const char *name)
{
  lua_getglobal(L, name);
  push_readonly(L, -1, name);
  lua_setglobal(L, name);
  lua_pop(L, 1);
}

static int is_readonly(lua_State *L, int idx)
{
  idx = lua_absindex(L, idx);
  lua_getfield(L, LUA_REGISTRYINDEX, READONLY_KEY);
  lua_pushvalue(L, idx);
  int yes = lua_rawget(L, -2) != LUA_TNIL;
  lua_pop(L, 2);
  return yes;
}

/* getmetatable: nil for strings (their metatable holds every string's methods). */
static int sandbox_getmetatable(lua_State *L)
{
  luaL_checkany(L, 1);
  if (lua_type(L, 1) == LUA_TSTRING || !lua_getmetatable(L, 1)) {
    lua_pushnil(L);
    return 1;
  }
  luaL_getmetafield(L, 1, "__metatable"); /* the lock, when there is one */
  return 1;
}

/* setmetatable: no __gc. A finalizer runs when the collector (or lua_close, after the plan was
 * read) decides, where its time is nobody's and an error in it is lost. */
static int sandbox_setmetatable(lua_State *L)
{
  int t = lua_type(L, 2);
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_argexpected(L, t == LUA_TNIL || t == LUA_TTABLE, 2, "nil or table");
  if (t == LUA_TTABLE) {
    lua_pushliteral(L, "__gc");
    int gc = lua_rawget(L, 2) != LUA_TNIL;
    lua_pop(L, 1);
    if (gc)
      return luaL_error(L, "setmetatable: __gc metamethods are not available to plans (sandbox): a "
                        "finalizer would run outside the plan's limits; --unsafe lifts it");
  }
  if (luaL_getmetafield(L, 1, "__metatable") != LUA_TNIL)
    return luaL_error(L, "cannot change a protected metatable");
  lua_settop(L, 2);
  lua_setmetatable(L, 1);
  return 1;
}

static int sandbox_rawset(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkany(L, 2);
  luaL_checkany(L, 3);
  if (is_readonly(L, 1))
    return luaL_error(L, "rawset: the sandbox's libraries and globals are read-only (every module of "
                      "the plan shares them); keep your own version in a local");
  lua_settop(L, 3);
  lua_rawset(L, 1);
  return 1;
}

/* The message handler of a plan's xpcall, once the instruction limit fired, hands the message
 * on without running: the limit's error is raised from the count hook, where hooks are off, so
 * the plan's handler would otherwise run uncounted. */
/* A caught error costs the count ERROR_COST instructions: raising, unwinding and formatting an
 * error is C work worth far more than one instruction, and a loop of caught errors (or of
 * message handlers that raise in turn, up to Lua's C-call limit) would otherwise take 30 times
 * as long to reach the limit as a plain loop. */
#define ERROR_COST 1000

static void charge_error(struct sandbox *sb)
{
  if (sb && sb->instruction_limit)
    sb->instructions += ERROR_COST;
}

/* pcall: Lua's, plus the charge for an error it catches. */
static int sandbox_pcall_lua(lua_State *L)
{
  luaL_checkany(L, 1);
  if (lua_pcall(L, lua_gettop(L) - 1, LUA_MULTRET, 0) != LUA_OK) {
    charge_error(sandbox_of(L));
    lua_pushboolean(L, 0);
    lua_insert(L, -2);
    return 2;
  }
  lua_pushboolean(L, 1);
  lua_insert(L, 1);
  return lua_gettop(L);
}

static int guarded_handler(lua_State *L)
{
  struct sandbox *sb = sandbox_of(L);
  charge_error(sb);
  if (sb && sb->limit_hit) {
    lua_settop(L, 1);
    return 1;
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

static int sandbox_xpcall(lua_State *L)
{
  int n = lua_gettop(L);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_pushvalue(L, 2);
  lua_pushcclosure(L, guarded_handler, 1);
  lua_replace(L, 2);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, n, LUA_MULTRET);
  return lua_gettop(L);
}

static void wrap_global(lua_State *L, const char *name, lua_CFunction f)
{
  lua_pushcfunction(L, f);
  lua_setglobal(L, name);
}

/* The globals are read-only too: `string = {...}` in one module would otherwise change `string`
 * for every module after it, as writing string.rep would. The plan's environment is an empty
 * table over the real globals (upvalue 1 here), so that every assignment reaches __newindex;
 * reads go through to the real table (a table __index, as fast as a plain global) and from
 * there to the strict guard. */
static int globals_newindex(lua_State *L)
{
  lua_pushvalue(L, 2);
  if (lua_rawget(L, lua_upvalueindex(1)) == LUA_TNIL)
    return strict_newindex(L);
  const char *name = lua_type(L, 2) == LUA_TSTRING ? lua_tostring(L, 2) : luaL_typename(L, 2);
  return luaL_error(L, "assigns to global '%s': the sandbox's globals are read-only (every module of "
                    "the plan shares them); keep your own version in a local", name);
}

static void lock_globals(lua_State *L)
{
  lua_pushglobaltable(L);
  int real = lua_gettop(L);
  lua_newtable(L); /* the plan's environment */
  lua_newtable(L);
  lua_pushvalue(L, real);
  lua_setfield(L, -2, "__index");
  lua_pushvalue(L, real);
  lua_pushcclosure(L, globals_newindex, 1);
  lua_setfield(L, -2, "__newindex");
  finish_readonly_view(L, real);
  lua_pushvalue(L, -1);
  lua_setfield(L, real, "_G"); /* _G is the plan's environment */
  lua_rawseti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);
  lua_pop(L, 1);
}

/* Everything above, once the libraries are open (not for --unsafe). */
static void harden(lua_State *L)
{
  lua_newtable(L); /* weak-keyed set of the read-only proxies */
  lua_newtable(L);
  lua_pushstring(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, READONLY_KEY);
  lua_getglobal(L, "string");
  sandbox_guard_patterns(L, -1);
  lua_pop(L, 1);
  sandbox_charge_libraries(L);
  wrap_global(L, "getmetatable", sandbox_getmetatable);
  wrap_global(L, "setmetatable", sandbox_setmetatable);
  wrap_global(L, "rawset", sandbox_rawset);
  wrap_global(L, "pcall", sandbox_pcall_lua);
  lua_getglobal(L, "xpcall");
  lua_pushcclosure(L, sandbox_xpcall, 1);
  lua_setglobal(L, "xpcall");
  static const char *const libs[] = { "string", "table", "math", "utf8", "os" };
  for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++)
    make_readonly(L, libs[i]);
  lock_globals(L);
}

/* ---- set-up ---------------------------------------------------------------------------- */

static int add_search_dir(char **dirs, int *n, const char *dir)
{
  if (!dir || !*dir || *n >= SANDBOX_MAX_SEARCH)
    return 0;
  for (int i = 0; i < *n; i++)
    if (strcmp(dirs[i], dir) == 0)
      return 0;
  char *copy = strdup(dir);
  if (!copy)
    return -1;
  dirs[(*n)++] = copy;
  return 0;
}

/* The plan search path of a plan in folder plan_dir ("" or NULL: the working folder), in order:
 * that folder, each folder of TYCHO_PATH, the shipped plans; strdup'ed into dirs. -1 out of
 * memory. */
static int fill_search_path(char **dirs, int *n, const char *plan_dir)
{
  if (add_search_dir(dirs, n, plan_dir && *plan_dir ? plan_dir : ".") < 0)
    return -1;
  const char *env = getenv("TYCHO_PATH");
  if (env) {
    char *copy = strdup(env);
    if (!copy)
      return -1;
    for (char *save = NULL, *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save))
      add_search_dir(dirs, n, dir);
    free(copy);
  }
  return add_search_dir(dirs, n, TYCHO_PLANS_DIR);
}

int sandbox_find_module(const char *plan_dir, const char *name, char *out, size_t n)
{
  if (!valid_module_name(name) || strcmp(name, "tycho") == 0)
    return 0;
  char rel[512], *dirs[SANDBOX_MAX_SEARCH];
  int n_dirs = 0, found = 0;
  if (snprintf(rel, sizeof rel, "%s", name) >= (int)sizeof rel)
    return 0;
  for (char *p = rel; *p; p++)
    if (*p == '.')
      *p = '/';
  if (fill_search_path(dirs, &n_dirs, plan_dir) == 0)
    for (int i = 0; i < n_dirs && !found; i++)
      found = find_module(dirs[i], rel, out, n);
  for (int i = 0; i < n_dirs; i++)
    free(dirs[i]);
  return found;
}

static void open_sandboxed_libs(lua_State *L)
{
  static const char *const base_removed[] = { "dofile", "loadfile", "require" };
  luaL_requiref(L, LUA_GNAME, luaopen_base, 1);
  lua_pop(L, 1);
  lua_pushglobaltable(L);
  for (size_t i = 0; i < sizeof base_removed / sizeof base_removed[0]; i++) {
    lua_pushnil(L);
    lua_setfield(L, -2, base_removed[i]);
  }
  lua_pushcfunction(L, sandbox_load);
  lua_setfield(L, -2, "load");
  lua_pushcfunction(L, sandbox_print);
  lua_setfield(L, -2, "print");
  lua_pop(L, 1);
  luaL_requiref(L, LUA_STRLIBNAME, luaopen_string, 1);
  lua_pushnil(L);
  lua_setfield(L, -2, "dump");
  lua_pop(L, 1);
  luaL_requiref(L, LUA_TABLIBNAME, luaopen_table, 1);
  lua_pop(L, 1);
  luaL_requiref(L, LUA_MATHLIBNAME, luaopen_math, 1);
  lua_pop(L, 1);
  luaL_requiref(L, LUA_UTF8LIBNAME, luaopen_utf8, 1);
  lua_pop(L, 1);
  /* os: only clock, time, date, getenv */
  luaopen_os(L);
  lua_newtable(L);
  static const char *const os_kept[] = { "clock", "time", "date", "getenv" };
  for (size_t i = 0; i < sizeof os_kept / sizeof os_kept[0]; i++) {
    lua_getfield(L, -2, os_kept[i]);
    lua_setfield(L, -2, os_kept[i]);
  }
  lua_setglobal(L, "os");
  lua_pop(L, 1);
}

int sandbox_open(struct sandbox *sb, const struct sandbox_options *opt, char *err, size_t err_size)
{
  memset(sb, 0, sizeof *sb);
  srcmap_init(&sb->map);
  sb->unsafe = opt->unsafe;
  sb->modules = opt->modules;
  sb->n_modules = opt->n_modules;
  sb->mem_limit = opt->unsafe ? 0 : (opt->memory_limit ? opt->memory_limit : SANDBOX_DEFAULT_MEMORY_LIMIT);
  sb->instruction_limit = opt->unsafe ? 0
                          : (opt->instruction_limit ? opt->instruction_limit : SANDBOX_DEFAULT_INSTRUCTION_LIMIT);
  lua_State *L = lua_newstate(sandbox_alloc, sb);
  if (!L) {
    snprintf(err, err_size, "cannot create a Lua state (out of memory)");
    return -1;
  }
  sb->L = L;
  lua_pushlightuserdata(L, sb);
  lua_setfield(L, LUA_REGISTRYINDEX, SANDBOX_KEY);
  lua_newtable(L); /* weak-keyed: table -> source record id */
  lua_newtable(L);
  lua_pushstring(L, "k");
  lua_setfield(L, -2, "__mode");
  lua_setmetatable(L, -2);
  lua_setfield(L, LUA_REGISTRYINDEX, PROV_KEY);
  lua_newtable(L);
  lua_setfield(L, LUA_REGISTRYINDEX, LOADED_KEY);

  if (opt->unsafe) {
    luaL_openlibs(L);
    lua_getglobal(L, "require");
    lua_setfield(L, LUA_REGISTRYINDEX, "tycho.lua_require");
  } else {
    open_sandboxed_libs(L);
  }
  lua_pushcfunction(L, sandbox_require);
  lua_setglobal(L, "require");
  lua_pushcfunction(L, tycho_tc);
  lua_setglobal(L, "__tycho_tc");

  if (!opt->unsafe) {
    lua_pushglobaltable(L);
    lua_newtable(L);
    lua_pushcfunction(L, strict_index);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, strict_newindex);
    lua_setfield(L, -2, "__newindex");
    lua_pushboolean(L, 0); /* the guard cannot be removed: setmetatable(_ENV, nil) is refused */
    lua_setfield(L, -2, "__metatable");
    lua_setmetatable(L, -2);
    lua_pop(L, 1);
    harden(L);
    lua_sethook(L, sandbox_count_hook, LUA_MASKCOUNT, HOOK_EVERY);
  }

  if (fill_search_path(sb->search, &sb->n_search, opt->plan_dir) < 0)
    goto nomem;
  return 0;
nomem:
  snprintf(err, err_size, "out of memory setting up the plan sandbox");
  sandbox_close(sb);
  return -1;
}

void sandbox_close(struct sandbox *sb)
{
  if (sb->L)
    lua_close(sb->L);
  sb->L = NULL;
  srcmap_free(&sb->map);
  for (int i = 0; i < sb->n_search; i++)
    free(sb->search[i]);
  sb->n_search = 0;
}
