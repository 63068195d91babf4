/* What the trainer binding's files share (tycho_runtime.c: the module and the trainer object;
 * tycho_runtime_set.c: live settings; tycho_tensor.c: tensor objects; tycho_inspect.c: memory,
 * comm, plan and schedule; tycho_help.c: help(); tycho_generate.c: t:generate). */
#ifndef TYCHO_RUNTIME_INTERNAL_H
#define TYCHO_RUNTIME_INTERNAL_H
#include <lauxlib.h>
#include <lua.h>
#include <stddef.h>

#include "plan/plan.h"

struct trainer;

#define TRAINER_META "tycho.trainer"
#define TENSOR_META "tycho.tensor"
#define ERR_MAX 4096 /* a trainer call's error message */

/* The trainer userdata. Made closed (t NULL) before anything is acquired, so that an error while
 * opening leaves nothing __gc cannot free. */
struct lua_trainer {
  struct trainer *t;         /* NULL: closed */
  unsigned long long serial; /* the n-th tycho.open of this process (the same on every rank) */
  char path[PLAN_PATH_MAX];  /* the plan file, compiled again by t:replan */
  int n_sets;
  char **sets;               /* (n_sets) the --set strings of open and every replan since, in order */
  int has_loss;
  double loss;               /* the last step's loss */
  int borrowed;              /* t is the running job's (tycho_runtime_bind_borrowed): never closed here */
};

/* One entry of an object's (or the module's) table: the one list the object is built from, the
 * REPL completes from (its metatable's `methods` and `__fields`) and help() prints (`__help`). */
struct tycho_entry {
  const char *name;
  lua_CFunction fn;  /* a method or function; NULL: a field (answered by __index) */
  const char *usage; /* how it is written: "t:step([n])", "x.shape" */
  const char *help;  /* what it does or holds, one line */
};

/* tycho_help.c: sets the metatable (or module table) at idx up from entries (ended by a NULL
 * name): `methods` (the functions, also left on the stack for __index's upvalue), `__fields`
 * (the fields' names) and `__help` (every entry, titled `title`). Leaves the methods table. */
void tycho_entries_register(lua_State *L, int idx, const struct tycho_entry *entries, const char *title);
/* tycho_help.c: help([x]) (also tycho.help and t:help()): one line per command, function, field
 * and method, from the `__help` tables of the REPL, the module, the trainer and tensors. */
int tycho_help(lua_State *L);
/* tycho_help.c: the module's entries as help() prints them (the registry's "tycho.help.module"). */
void tycho_help_register_module(lua_State *L, const struct tycho_entry *entries);

/* The trainer at index i, open; a Lua error when it is not a trainer or is closed. */
struct lua_trainer *tycho_check_trainer(lua_State *L, int i);
/* Hands `text` to the state's global print (nothing when print is not a function). */
void tycho_print(lua_State *L, const char *text);
/* This process's rank in the world (0 without the comm layer). */
int tycho_world_rank(void);

/* tycho_runtime_set.c: t:set{...}, the live settings. */
int tycho_trainer_set(lua_State *L);
/* tycho_runtime.c: appends the settings at idx (t:set's table, applied) to lt's overrides, so
 * t:replan compiles the plan as it is live. A Lua error when out of memory. */
void tycho_trainer_keep_settings(lua_State *L, struct lua_trainer *lt, int idx);

/* tycho_tensor.c: t:param, t:grad, t:moment and the tensor metatable. */
int tycho_trainer_param(lua_State *L);
int tycho_trainer_grad(lua_State *L);
int tycho_trainer_moment(lua_State *L);
void tycho_tensor_register(lua_State *L);

/* tycho_inspect.c: t:memory, t:comm, t:plan, t:schedule. */
int tycho_trainer_memory(lua_State *L);
int tycho_trainer_comm(lua_State *L);
int tycho_trainer_plan(lua_State *L);
int tycho_trainer_schedule(lua_State *L);

/* tycho_generate.c: t:generate(prompt_ids [, opts]). */
int tycho_trainer_generate(lua_State *L);

#endif
