/* The sandboxed Lua state for plan files: see sandbox.h for the rules and why. */
#define _XOPEN_SOURCE 700
#include "sandbox.h"

#include <errno.h>
#include <lauxlib.h>
#include <limits.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>


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
  if (p)
    sb->mem_used = sb->mem_used - osize + nsize;
  return p;
}

static void count_hook(lua_State *L, lua_Debug *ar)
{
  struct sandbox *sb = sandbox_of(L);
  (void)ar;
  lua_Debug here;
  if (lua_getstack(L, 0, &here) && lua_getinfo(L, "Sl", &here) && here.currentline > 0)
    snprintf(sb->last_where, sizeof sb->last_where, "%s:%d", here.short_src, here.currentline);
  sb->instructions += HOOK_EVERY;
  if (sb->instruction_limit && sb->instructions > sb->instruction_limit) {
    char msg[700];
    snprintf(msg, sizeof msg, "%s: plan exceeded the instruction limit of %lld Lua instructions "
             "(an endless loop?); raise it with --max-instructions",
             sb->last_where[0] ? sb->last_where : "plan", sb->instruction_limit);
    lua_pushstring(L, msg);
    lua_error(L);
  }
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

static char *read_whole(const char *path, size_t *n, char *err, size_t err_size)
{
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(err, err_size, "%s: cannot open: %s", path, strerror(errno));
    return NULL;
  }
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  while (buf) {
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (len < cap)
      break;
    char *b2 = realloc(buf, cap *= 2);
    if (!b2) {
      free(buf);
      buf = NULL;
    } else {
      buf = b2;
    }
  }
  int failed = ferror(f);
  fclose(f);
  if (!buf || failed) {
    free(buf);
    snprintf(err, err_size, "%s: cannot read", path);
    return NULL;
  }
  *n = len;
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
    if (status == LUA_ERRMEM || sb->mem_exceeded)
      snprintf(err, err_size, "%s: plan exceeded the memory cap of %zu MiB", path, sb->mem_limit >> 20);
    else
      snprintf(err, err_size, "%s", lua_tostring(L, -1));
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
    if (stat(out, &st) != 0 || !S_ISREG(st.st_mode) || !realpath(out, real_file))
      continue;
    size_t dl = strlen(real_dir);
    if (strncmp(real_file, real_dir, dl) == 0 && real_file[dl] == '/')
      return 1;
  }
  return 0;
}

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

/* load(chunk [, chunkname [, mode [, env]]]) for text chunks only. */
static int sandbox_load(lua_State *L)
{
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  const char *chunkname = luaL_optstring(L, 2, "=(load)");
  const char *mode = luaL_optstring(L, 3, "t");
  if (strcmp(mode, "t") != 0)
    return luaL_error(L, "load: binary chunks are refused in plans (mode must be \"t\")");
  int status = luaL_loadbufferx(L, s, n, chunkname, "t");
  if (status != LUA_OK) {
    luaL_pushfail(L);
    lua_insert(L, -2);
    return 2;
  }
  if (!lua_isnone(L, 4)) {
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
    if (i > 1)
      fputc('\t', stderr);
    fwrite(s, 1, len, stderr);
    lua_pop(L, 1);
  }
  fputc('\n', stderr);
  return 0;
}

/* ---- set-up ---------------------------------------------------------------------------- */

static int add_search_dir(struct sandbox *sb, const char *dir)
{
  if (!dir || !*dir || sb->n_search >= (int)(sizeof sb->search / sizeof sb->search[0]))
    return 0;
  for (int i = 0; i < sb->n_search; i++)
    if (strcmp(sb->search[i], dir) == 0)
      return 0;
  char *copy = strdup(dir);
  if (!copy)
    return -1;
  sb->search[sb->n_search++] = copy;
  return 0;
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
    lua_setmetatable(L, -2);
    lua_pop(L, 1);
    lua_sethook(L, count_hook, LUA_MASKCOUNT, HOOK_EVERY);
  }

  if (add_search_dir(sb, opt->plan_dir && *opt->plan_dir ? opt->plan_dir : ".") < 0)
    goto nomem;
  const char *env = getenv("TYCHO_PATH");
  if (env) {
    char *copy = strdup(env);
    if (!copy)
      goto nomem;
    for (char *save = NULL, *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save))
      add_search_dir(sb, dir);
    free(copy);
  }
  if (add_search_dir(sb, TYCHO_PLANS_DIR) < 0)
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
