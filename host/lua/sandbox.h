/* The sandboxed Lua state that plan files run in (docs/design.md, "Plans are compiled
 * once"; Redis's scripting is the model).
 *
 * Plans are code users did not all write themselves, and they run on a laptop before a job
 * and on every rank of it. The sandbox gives them the base library without dofile, loadfile
 * or binary chunks, plus string, table, math and utf8; os cut to clock, time, date, getenv;
 * no io, no package, no debug. `require` finds modules only in the plan search path (the
 * plan's own folder, TYCHO_PATH, the shipped plans/), never outside it. Reading or writing an
 * undeclared global is an error, and that guard cannot be removed; the libraries, the modules
 * written in C and the globals are read-only, and reading a removed function says so
 * ("os.execute is not available to plans"). A count hook stops a plan that runs too long (pcall
 * cannot catch it, the C library's work is charged to it, __gc is refused: see sandbox.c) and a
 * counting allocator stops one that takes too much memory, each with a message naming the limit.
 * `unsafe` lifts all of this for users who need io in plan code.
 *
 * Every chunk is loaded through srcmap_rewrite, so every table built by plan code knows on
 * which lines its fields were written (sandbox_record_of). */
#ifndef TYCHO_SANDBOX_H
#define TYCHO_SANDBOX_H
#include <lua.h>
#include <stddef.h>

#include "srcmap.h"

#define SANDBOX_DEFAULT_MEMORY_LIMIT (256u << 20)
#define SANDBOX_DEFAULT_INSTRUCTION_LIMIT 200000000LL
#define SANDBOX_MAX_SEARCH 16 /* folders in the plan search path */

/* A module written in C that `require name` opens (the caller's: the sandbox knows no module
 * of its own, so the bindings above it can use it without a cycle). */
struct sandbox_module {
  const char *name;
  lua_CFunction open;
};

struct sandbox_options {
  int unsafe;
  size_t memory_limit;          /* bytes; 0: default */
  long long instruction_limit;  /* VM instructions; 0: default */
  const char *plan_dir;         /* the plan's own folder, first in the search path */
  const struct sandbox_module *modules; /* (n_modules) opened by require before the search path */
  int n_modules;
};

struct sandbox {
  lua_State *L;
  struct srcmap map;
  int unsafe;
  size_t mem_used, mem_limit;
  int mem_exceeded;
  long long instructions, instruction_limit;
  char last_where[512];         /* the plan line last seen by the count hook */
  int limit_hit;                /* the instruction limit fired: every later instruction raises */
  char limit_msg[700];
  int n_search;
  char *search[SANDBOX_MAX_SEARCH]; /* the plan search path, in order */
  const struct sandbox_module *modules;
  int n_modules;
};

/* Creates the state. 0 ok; -1 with a message in err. */
int sandbox_open(struct sandbox *sb, const struct sandbox_options *opt, char *err, size_t err_size);
void sandbox_close(struct sandbox *sb);

/* The sandbox that owns L. */
struct sandbox *sandbox_of(lua_State *L);

/* The file `require "name"` loads in a plan whose own folder is plan_dir (the same search as
 * the sandbox's: plan_dir, TYCHO_PATH's folders, the shipped plans; the first name.lua or
 * name/init.lua whose real path stays inside its folder), into out. 1 found; 0 when nothing is
 * found or name is not a module name a plan may require ("tycho" is the built-in module). */
int sandbox_find_module(const char *plan_dir, const char *name, char *out, size_t n);

/* Loads and runs a Lua file in the sandbox with `nargs` arguments already pushed, leaving
 * its first result on the stack. 0 ok; otherwise nothing is pushed and err holds the
 * one-line message ("plans/x.lua:12: attempt to index a nil value", "... exceeded the memory
 * cap of 256 MiB"). */
int sandbox_dofile(struct sandbox *sb, const char *path, int nargs, char *err, size_t err_size);

/* Calls the function below `nargs` arguments on the stack under the sandbox's error handling,
 * leaving `nresults` results. 0 ok; otherwise nothing is left and err holds the message. */
int sandbox_pcall(struct sandbox *sb, int nargs, int nresults, char *err, size_t err_size);

/* Charges C work done for the plan to its instruction count: `instructions` VM instructions
 * worth (a binding's loop, a library function's scan). When that passes the limit, the limit
 * fires (sticky, as from the count hook) with a message naming `what` and the plan line, and
 * this raises; it returns only when the work fits. No-op outside a sandbox or with no limit. */
void sandbox_charge(lua_State *L, const char *what, double instructions);

/* Checks that `bytes` more fit under the memory cap, else raises "FILE:LINE: what: plan exceeded
 * the memory cap of N MiB ...". With keep, counts them as used from now on: for memory the
 * sandbox's allocator does not see (the source records bindings add). */
void sandbox_reserve(lua_State *L, const char *what, double bytes, int keep);

/* Source record of the table at idx (see srcmap.h), or -1 when the table has none. */
int sandbox_record_of(lua_State *L, int idx);
void sandbox_set_record(lua_State *L, int idx, int id);

/* Writes "file:line" for key `key` (string) or `index` (key NULL) of the table at idx into buf:
 * the line of the field itself when known, else the line of the table's constructor.
 * Returns 1 when something was found, 0 when the table has no record. */
int sandbox_where(lua_State *L, int idx, const char *key, long index, char *buf, size_t n);

#endif
