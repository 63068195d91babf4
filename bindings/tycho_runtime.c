/* The trainer in Lua (tycho_runtime.h; docs/repl.md, "The trainer in Lua"): tycho.open compiles
 * a plan file for the job's world and opens a trainer on mesh groups of its own; the trainer
 * object steps, evaluates, saves, loads, takes live settings and re-plans. Built as liolib is:
 * one metatable, a check function, one idempotent close behind __gc, __close and :close(), and
 * an object made closed before the trainer it will hold is opened.
 *
 * Collectives and agreement. Every function that changes or reads the whole job runs on every
 * rank (the REPL runs each chunk everywhere); work one rank may fail alone (compiling, opening,
 * loading) is followed by an agreement over the world (comm_agree_err), so every rank raises the
 * same error, and a chunk that reaches a collective on part of the job only is refused by the
 * comm layer before anyone waits. Closing frees the trainer's mesh groups, which is collective
 * too: close trainers with t:close() (or `local t <close>`) rather than leaving them to the
 * garbage collector, which runs on each rank at a time of its own.
 *
 * Output: progress and evaluation lines, as `tycho run` prints them (runtime/train/train_progress.h),
 * on world rank 0 only, through the state's global print.
 *
 * The live settings (t:set) are in tycho_runtime_set.c. */
#define _POSIX_C_SOURCE 200809L
#include "tycho_runtime.h"

#include <lauxlib.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm.h"
#include "plan/compile.h"
#include "runtime/model/alloc.h"
#include "runtime/state/ckpt.h"
#include "runtime/train/run_guard.h"
#include "runtime/train/train.h"
#include "runtime/train/train_progress.h"
#include "util/path.h"
#include "lua/tycho_module.h"
#include "tycho_runtime_internal.h"

#define MAX_SETS 256 /* overrides in one call */

static int (*stop_hook)(void *ctx);
static void *stop_ctx;

void tycho_runtime_set_stop_hook(int (*stop)(void *ctx), void *ctx)
{
  stop_hook = stop;
  stop_ctx = ctx;
}

static double now_seconds(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int tycho_world_rank(void)
{
  struct comm_group *w = comm_world();
  return w ? w->rank : 0;
}

void tycho_print(lua_State *L, const char *text)
{
  if (lua_getglobal(L, "print") != LUA_TFUNCTION) {
    lua_pop(L, 1);
    return;
  }
  lua_pushstring(L, text);
  lua_call(L, 1, 0);
}

/* Rank 0's line, through print. */
static void print_rank0(lua_State *L, const char *text)
{
  if (tycho_world_rank() == 0)
    tycho_print(L, text);
}

/* ---- overrides: a Lua table → --set strings ------------------------------------------------ */

/* Pushes the --set text of the scalar at idx: numbers keep their kind (a float keeps a point),
 * strings are quoted (so "auto" stays a string), booleans as words. */
static void push_set_value(lua_State *L, int idx, const char *path)
{
  char num[64];
  switch (lua_type(L, idx)) {
  case LUA_TBOOLEAN:
    lua_pushstring(L, lua_toboolean(L, idx) ? "true" : "false");
    break;
  case LUA_TNUMBER:
    if (lua_isinteger(L, idx)) {
      snprintf(num, sizeof num, "%lld", (long long)lua_tointeger(L, idx));
    } else {
      snprintf(num, sizeof num, "%.17g", (double)lua_tonumber(L, idx));
      if (!strpbrk(num, ".eEni"))
        strcat(num, ".0");
    }
    lua_pushstring(L, num);
    break;
  case LUA_TSTRING:
    lua_pushfstring(L, "'%s'", lua_tostring(L, idx));
    break;
  default:
    luaL_error(L, "override %s: a %s cannot be given (numbers, strings, booleans, lists of them and "
               "nested tables can)", path, luaL_typename(L, idx));
  }
}

/* Pushes "path=value" strings for the table at idx into the Lua list at `out` (nested tables
 * give dotted paths, lists comma lists). */
static void collect_sets(lua_State *L, int idx, const char *prefix, int out)
{
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    const int value = lua_gettop(L);
    char path[512];
    if (lua_type(L, -2) == LUA_TSTRING)
      snprintf(path, sizeof path, "%s%s", prefix, lua_tostring(L, -2));
    else if (lua_isinteger(L, -2) && lua_tointeger(L, -2) > 0)
      snprintf(path, sizeof path, "%s%lld", prefix, (long long)lua_tointeger(L, -2));
    else
      luaL_error(L, "override %s: keys are field names (or positive integers)", prefix[0] ? prefix : "table");
    if (lua_istable(L, value) && !tycho_is_list(L, value)) {
      char sub[520];
      snprintf(sub, sizeof sub, "%s.", path);
      collect_sets(L, value, sub, out);
    } else {
      lua_pushfstring(L, "%s=", path); /* the text so far, on top */
      if (lua_istable(L, value)) {
        const lua_Integer n = (lua_Integer)lua_rawlen(L, value);
        for (lua_Integer i = 1; i <= n; i++) {
          if (i > 1) {
            lua_pushliteral(L, ",");
            lua_concat(L, 2);
          }
          lua_rawgeti(L, value, i);
          push_set_value(L, -1, path);
          lua_remove(L, -2);
          lua_concat(L, 2);
        }
      } else {
        push_set_value(L, value, path);
        lua_concat(L, 2);
      }
      lua_rawseti(L, out, (lua_Integer)lua_rawlen(L, out) + 1);
    }
    lua_settop(L, value - 1);
  }
}

static int compare_strings(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Appends the overrides at idx (nil, a nested table, or a list of "k=v" strings) to lt->sets:
 * a nested table's strings sorted (every rank then compiles the same list whatever order its
 * table iterates in), a list's in its order. */
static void append_overrides(lua_State *L, struct lua_trainer *lt, int idx)
{
  if (lua_isnoneornil(L, idx))
    return;
  luaL_checktype(L, idx, LUA_TTABLE);
  lua_newtable(L);
  const int out = lua_gettop(L);
  int sorted = 1;
  if (tycho_is_list(L, idx)) {
    sorted = 0;
    const lua_Integer n = (lua_Integer)lua_rawlen(L, idx);
    for (lua_Integer i = 1; i <= n; i++) {
      if (lua_rawgeti(L, idx, i) != LUA_TSTRING || !strchr(lua_tostring(L, -1), '='))
        luaL_error(L, "overrides: item %d is not a \"path.to.field=value\" string", (int)i);
      lua_rawseti(L, out, i);
    }
  } else {
    collect_sets(L, idx, "", out);
  }
  const int n = (int)lua_rawlen(L, out);
  if (n > MAX_SETS)
    luaL_error(L, "overrides: %d fields; at most %d at a time", n, MAX_SETS);
  char **sets = realloc(lt->sets, (size_t)(lt->n_sets + n + 1) * sizeof *sets);
  if (!sets)
    luaL_error(L, "out of memory for the overrides");
  lt->sets = sets;
  const int first = lt->n_sets;
  for (int i = 0; i < n; i++) {
    lua_rawgeti(L, out, i + 1);
    char *s = strdup(lua_tostring(L, -1));
    lua_pop(L, 1);
    if (!s)
      luaL_error(L, "out of memory for the overrides");
    lt->sets[lt->n_sets++] = s;
  }
  if (sorted)
    qsort(lt->sets + first, (size_t)n, sizeof *lt->sets, compare_strings);
  lua_pop(L, 1);
}

void tycho_trainer_keep_settings(lua_State *L, struct lua_trainer *lt, int idx)
{
  append_overrides(L, lt, idx);
}

/* ---- the trainer object --------------------------------------------------------------------- */

#define totrainer(L) ((struct lua_trainer *)luaL_checkudata(L, 1, TRAINER_META))

struct lua_trainer *tycho_check_trainer(lua_State *L, int i)
{
  struct lua_trainer *lt = luaL_checkudata(L, i, TRAINER_META);
  if (!lt->t)
    luaL_error(L, "attempt to use a closed trainer");
  return lt;
}

static void free_sets(struct lua_trainer *lt)
{
  for (int i = 0; i < lt->n_sets; i++) free(lt->sets[i]);
  free(lt->sets);
  lt->sets = NULL;
  lt->n_sets = 0;
}

/* __gc, __close and :close(): closes the trainer once (collective over the world: its mesh
 * groups are freed); later calls do nothing. */
/* Closing is collective over the world (it frees the trainer's groups), but the garbage
 * collector finalizes a dropped trainer at a different moment on each rank. So with peers, __gc
 * only sets the trainer aside; the REPL closes what every rank has set aside, agreed at the end
 * of a chunk (tycho_runtime_collected, tycho_runtime_close_collected). Without peers it closes
 * at once. t:close() and <close> close at once, in program order, as everything else. */
static struct collected {
  unsigned long long serial;
  struct trainer *t;
} *collected;
static int n_collected;
static unsigned long long next_serial = 1;

static void close_trainer(struct trainer *t)
{
  trainer_close(t);
  free(t);
}

static int trainer_close_now(lua_State *L)
{
  struct lua_trainer *lt = totrainer(L);
  if (lt->borrowed && lt->t)
    return luaL_error(L, "t:close: t is the running job's trainer (tycho run --listen): the job closes it at its "
                      "end; detach() leaves it training");
  if (lt->t) {
    struct trainer *t = lt->t;
    lt->t = NULL;
    close_trainer(t);
  }
  return 0;
}

static int trainer_gc(lua_State *L)
{
  struct lua_trainer *lt = totrainer(L);
  if (lt->borrowed) { /* the job's: it stays open */
    lt->t = NULL;
    free_sets(lt);
    return 0;
  }
  struct comm_group *w = comm_world();
  if (lt->t && w && w->size > 1) {
    struct collected *grown = realloc(collected, (size_t)(n_collected + 1) * sizeof *collected);
    if (grown) {
      collected = grown;
      collected[n_collected++] = (struct collected){ lt->serial, lt->t };
      lt->t = NULL;
    }
  }
  if (lt->t) /* no peers (or no memory to set it aside: closing now is all that is left) */
    trainer_close_now(L);
  free_sets(lt);
  return 0;
}

int tycho_runtime_collected(unsigned long long *serials, int max)
{
  for (int i = 0; i < n_collected && i < max; i++) serials[i] = collected[i].serial;
  return n_collected;
}

void tycho_runtime_close_collected(const unsigned long long *serials, int n)
{
  for (int k = 0; k < n; k++)
    for (int i = 0; i < n_collected; i++)
      if (collected[i].serial == serials[k]) {
        struct trainer *t = collected[i].t;
        memmove(&collected[i], &collected[i + 1], (size_t)(n_collected - i - 1) * sizeof *collected);
        n_collected--;
        close_trainer(t);
        break;
      }
  if (!n_collected) {
    free(collected);
    collected = NULL;
  }
}

static int trainer_tostring(lua_State *L)
{
  struct lua_trainer *lt = totrainer(L);
  if (!lt->t)
    lua_pushliteral(L, "trainer (closed)");
  else
    lua_pushfstring(L, "trainer %s (step %I, mesh tp %d × pp %d × dp %d, zero %d)", lt->path,
                    (lua_Integer)lt->t->step, lt->t->plan->mesh.tp, lt->t->plan->mesh.pp,
                    lt->t->plan->mesh.dp, lt->t->plan->zero);
  return 1;
}

/* Compiles lt->path with lt->sets for the world into *p, agreed over the world and checked to
 * be the same plan on every rank. 0, or nonzero with the message in err (p then empty). */
static int compile_agreed(struct lua_trainer *lt, struct plan *p, char *err, size_t n)
{
  struct comm_group *w = comm_world();
  struct plan_compile_options opt = { w ? w->size : 1, 0, 0, 0, lt->n_sets, (const char *const *)lt->sets };
  plan_init(p);
  int rc = plan_compile(lt->path, &opt, p, err, n) ? TRAIN_PLAN_ERROR : TRAIN_OK;
  rc = comm_agree_err(w, rc, err, n, COMM_AGREE_NAME_RANK_UNLESS_PLAN);
  if (!rc && w && comm_check_plan_hash(plan_hash(p), err, n))
    rc = TRAIN_PLAN_ERROR;
  if (rc)
    plan_free(p);
  return rc;
}

/* tycho.open(path [, overrides]) */
static int tycho_open(lua_State *L)
{
  const char *path = luaL_checkstring(L, 1);
  if (!lua_isnoneornil(L, 2))
    luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  struct lua_trainer *lt = lua_newuserdatauv(L, sizeof *lt, 0);
  memset(lt, 0, sizeof *lt); /* closed: __gc has nothing to free yet */
  luaL_setmetatable(L, TRAINER_META);
  if (strlen(path) >= sizeof lt->path)
    return luaL_error(L, "tycho.open: the plan path is longer than %d bytes", (int)sizeof lt->path - 1);
  snprintf(lt->path, sizeof lt->path, "%s", path);
  append_overrides(L, lt, 2);

  char err[ERR_MAX];
  struct plan p;
  if (compile_agreed(lt, &p, err, sizeof err))
    return luaL_error(L, "%s", err);
  struct trainer *t = malloc(sizeof *t);
  int rc = t ? TRAIN_OK : TRAIN_RUNTIME_ERROR, opened = TRAIN_RUNTIME_ERROR;
  if (!t)
    snprintf(err, sizeof err, "out of memory for a trainer");
  rc = comm_agree_err(comm_world(), rc, err, sizeof err, COMM_AGREE_NAME_RANK_UNLESS_PLAN); /* opening builds groups: everyone or no one */
  if (!rc) /* data.text: rank 0 makes the token cache as tycho run does */
    rc = trainer_prepare_text(&p, comm_world(), stdout, err, sizeof err);
  if (!rc) {
    alloc_reset_peaks(); /* t:memory()'s measured peaks: from this open on */
    opened = rc = comm_world() ? trainer_open_on_world(t, &p, err, sizeof err)
                               : trainer_open(t, &p, NULL, err, sizeof err);
    rc = comm_agree_err(comm_world(), rc, err, sizeof err, COMM_AGREE_NAME_RANK_UNLESS_PLAN);
  }
  plan_free(&p);
  if (rc) {
    if (opened == TRAIN_OK)
      trainer_close(t);
    free(t);
    return luaL_error(L, "%s", err);
  }
  lt->t = t;
  lt->serial = next_serial++;
  return 1;
}

/* ---- stepping ------------------------------------------------------------------------------- */

/* Evaluation after a step: its line on rank 0. */
static void eval_and_print(lua_State *L, struct trainer *t)
{
  struct train_eval_stats ev;
  trainer_eval(t, &ev);
  if (trainer_failed(t)) {
    char err[ERR_MAX];
    snprintf(err, sizeof err, "evaluation after step %lld: %s", t->step, trainer_failed(t));
    trainer_clear_error(t);
    luaL_error(L, "%s", err);
  }
  char line[512];
  if (train_format_eval(line, sizeof line, &ev))
    print_rank0(L, line);
}

/* t:step([n]): n steps (default 1) with `tycho run`'s progress lines — every log.every steps,
 * the first and the last of the call; the total shown is the step this call ends at — and
 * evaluation after each step that is a multiple of train.eval_every and after the plan's last
 * step (train.steps). Before each step the stop hook may end the call ("interrupted at step N").
 * Returns the last loss (nil when no step ran). */
static int trainer_step_n(lua_State *L)
{
  struct lua_trainer *lt = tycho_check_trainer(L, 1);
  const lua_Integer n = luaL_optinteger(L, 2, 1);
  luaL_argcheck(L, n >= 0, 2, "the number of steps must be ≥ 0");
  struct trainer *t = lt->t;
  const long long first = t->step, end = first + (long long)n;
  const double start = now_seconds();
  double interval_seconds = 0.0;
  long long interval_tokens = 0;
  for (long long s = first; s < end; s++) {
    const int stop = stop_hook ? stop_hook(stop_ctx) : 0;
    if (stop > 1) /* interrupted before, in this chunk: the chunk ends here, on every rank */
      return luaL_error(L, "interrupted at step %I (the chunk stops: it was interrupted before)", (lua_Integer)t->step);
    if (stop) {
      char line[96];
      snprintf(line, sizeof line, "interrupted at step %lld", t->step);
      print_rank0(L, line);
      break;
    }
    const struct plan *p = t->plan; /* read each step: t:set may change it between calls */
    struct train_step_stats st;
    char err[ERR_MAX];
    const double t0 = now_seconds();
    if (trainer_step(t, &st, err, sizeof err)) { /* the same verdict on every rank */
      trainer_clear_error(t);
      return luaL_error(L, "%s", err);
    }
    const double t1 = now_seconds();
    lt->loss = st.loss;
    lt->has_loss = 1;
    interval_tokens += (long long)p->batch.global * p->batch.seq;
    interval_seconds += t1 - t0;
    if ((s + 1) % p->log.every == 0 || s + 1 == end || s == first) {
      const double elapsed = t1 - start;
      char line[512];
      train_format_progress(line, sizeof line, &st, end, (double)interval_tokens / interval_seconds, elapsed,
                            elapsed / (double)(s + 1 - first) * (double)(end - s - 1));
      print_rank0(L, line);
      interval_tokens = 0;
      interval_seconds = 0.0;
    }
    if ((p->train.eval_every > 0 && (s + 1) % p->train.eval_every == 0) || s + 1 == p->train.steps)
      eval_and_print(L, t);
  }
  if (lt->has_loss)
    lua_pushnumber(L, lt->loss);
  else
    lua_pushnil(L);
  return 1;
}

/* Numbers' __call: t.step is the step count, so t:step(n) calls a number with the trainer
 * first; that call steps. Any other call of a number is the error Lua would raise. */
static int number_call(lua_State *L)
{
  if (!luaL_testudata(L, 2, TRAINER_META))
    return luaL_error(L, "attempt to call a number value");
  lua_remove(L, 1);
  return trainer_step_n(L);
}

/* t:eval() → val_loss, accuracy (nil where the data has none): the plan's evaluation now. */
static int trainer_eval_now(lua_State *L)
{
  struct trainer *t = tycho_check_trainer(L, 1)->t;
  struct train_eval_stats ev;
  trainer_eval(t, &ev);
  if (trainer_failed(t)) {
    char err[ERR_MAX];
    snprintf(err, sizeof err, "evaluation: %s", trainer_failed(t));
    trainer_clear_error(t);
    return luaL_error(L, "%s", err);
  }
  if (ev.has_val_loss)
    lua_pushnumber(L, ev.val_loss);
  else
    lua_pushnil(L);
  if (ev.has_accuracy)
    lua_pushnumber(L, ev.accuracy);
  else
    lua_pushnil(L);
  return 2;
}

/* t:loss() → the last step's loss, or nil. */
static int trainer_loss(lua_State *L)
{
  struct lua_trainer *lt = tycho_check_trainer(L, 1);
  if (lt->has_loss)
    lua_pushnumber(L, lt->loss);
  else
    lua_pushnil(L);
  return 1;
}

/* ---- checkpoints ---------------------------------------------------------------------------- */

/* t:save([dir]) → the folder written, dir/step_NNNNNNNN (dir defaults to checkpoint.dir);
 * nothing older is removed. Collective: on part of the job (a REPL chunk's selector) it is
 * refused before anything is made, since rank 0 would create the folders first. */
static int trainer_save(lua_State *L)
{
  struct trainer *t = tycho_check_trainer(L, 1)->t;
  const char *dir = luaL_optstring(L, 2, t->plan->checkpoint.dir);
  if (!dir[0])
    return luaL_error(L, "t:save: no folder given and the plan has no checkpoint.dir");
  char err[ERR_MAX];
  if (comm_restricted_check(t->world, "t:save", err, sizeof err))
    return luaL_error(L, "%s", err);
  /* The folder's lock (DIR/.lock, as `tycho run` takes it) for the save: a run writing DIR is
   * named and nothing is written; a save inside the run that holds it (tycho run --listen) goes on. */
  struct run_lock lock = { .fd = -1 };
  char lock_path[4200];
  snprintf(lock_path, sizeof lock_path, "%s/.lock", dir);
  int rc = 0;
  if ((!t->world || t->world->rank == 0) && !run_lock_held(lock_path)) {
    char inside[4200];
    snprintf(inside, sizeof inside, "%s/x", dir);
    rc = path_make_parent_dirs(inside, err, sizeof err) ? -1
                                                          : run_lock_take(&lock, "t:save", dir, lock_path, err, sizeof err);
  }
  rc = comm_agree_err(t->world, rc ? -1 : 0, err, sizeof err, COMM_AGREE_NAME_RANK);
  if (!rc)
    rc = ckpt_save(t, dir, t->step, 0, err, sizeof err);
  run_lock_release(&lock);
  if (rc)
    return luaL_error(L, "%s", err);
  char folder[4200];
  snprintf(folder, sizeof folder, "%s/step_%08lld", dir, t->step);
  lua_pushstring(L, folder);
  return 1;
}

/* t:load([path]) → the step loaded: a checkpoint folder (with manifest.json), or the newest
 * checkpoint in a folder of them (default checkpoint.dir). Agreed over the world. */
static int trainer_load(lua_State *L)
{
  struct lua_trainer *lt = tycho_check_trainer(L, 1);
  struct trainer *t = lt->t;
  const char *given = luaL_optstring(L, 2, t->plan->checkpoint.dir);
  if (!given[0])
    return luaL_error(L, "t:load: no folder given and the plan has no checkpoint.dir");
  char err[ERR_MAX] = "", path[4096], manifest[4200];
  snprintf(manifest, sizeof manifest, "%s/manifest.json", given);
  int rc = TRAIN_OK;
  if (access(manifest, R_OK) == 0) {
    snprintf(path, sizeof path, "%s", given);
  } else {
    long long step;
    int found = ckpt_find_latest(given, path, sizeof path, &step, err, sizeof err);
    if (found > 0)
      snprintf(err, sizeof err, "t:load: no checkpoint in %s (neither a step_N folder nor a folder of them)", given);
    rc = found ? TRAIN_RUNTIME_ERROR : TRAIN_OK;
  }
  if (!rc && ckpt_load(t, path, err, sizeof err))
    rc = TRAIN_RUNTIME_ERROR;
  if (comm_agree_err(t->world, rc, err, sizeof err, COMM_AGREE_NAME_RANK_UNLESS_PLAN))
    return luaL_error(L, "%s", err);
  lt->has_loss = 0;
  lua_pushinteger(L, (lua_Integer)t->step);
  return 1;
}

/* ---- re-planning ---------------------------------------------------------------------------- */

/* t:replan(overrides): the plan file compiled again with open's overrides, every replan's and
 * t:set's since (so the live plan is where it starts) and these, and the live trainer moved onto
 * it (trainer_replan): parameters, optimizer state, step and data position kept, in memory.
 * Collective. */
static int trainer_replan_lua(lua_State *L)
{
  struct lua_trainer *lt = tycho_check_trainer(L, 1);
  if (lt->borrowed)
    return luaL_error(L, "t:replan: t is the running job's trainer (tycho run --listen): its layout is the job's; "
                      "replan a checkpoint of it with tycho run or tycho repl instead");
  if (!lua_isnoneornil(L, 2))
    luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  const int before = lt->n_sets;
  append_overrides(L, lt, 2);
  char err[ERR_MAX];
  struct plan p;
  int rc = compile_agreed(lt, &p, err, sizeof err);
  if (!rc) {
    rc = trainer_replan(lt->t, &p, err, sizeof err);
    plan_free(&p);
  }
  if (rc) {
    for (int i = before; i < lt->n_sets; i++) free(lt->sets[i]);
    lt->n_sets = before; /* a failed replan leaves the overrides as they were */
    if (!lt->t->plan) { /* it could not go back to the old layout either: t is closed */
      free(lt->t);
      lt->t = NULL;
    }
    return luaL_error(L, "%s", err);
  }
  alloc_reset_peaks(); /* t:memory()'s measured peaks: the new layout's, from here on */
  return 0;
}

/* ---- fields --------------------------------------------------------------------------------- */

static int trainer_close_method(lua_State *L)
{
  return trainer_close_now(L);
}

/* The trainer's fields (first, in trainer_index's order) and methods, each with its line of help:
 * the metatable's `methods`, `__fields` and `__help` are made from this one list (tycho_help.c). */
#define N_TRAINER_FIELDS 9
static const struct tycho_entry trainer_entries[] = {
  { "step", NULL, "t.step", "optimizer steps done (the next step to run, 0-based)" },
  { "rank", NULL, "t.rank", "this process's rank in the world" },
  { "world", NULL, "t.world", "the world's size" },
  { "tp", NULL, "t.tp", "this rank's tensor-parallel coordinate" },
  { "dp", NULL, "t.dp", "this rank's data-parallel coordinate" },
  { "pp", NULL, "t.pp", "this rank's pipeline coordinate" },
  { "mesh", NULL, "t.mesh", "the plan's mesh: { tp, dp, pp, ep, zero }" },
  { "path", NULL, "t.path", "the plan file" },
  { "closed", NULL, "t.closed", "true once the trainer is closed" },
  { "step", trainer_step_n, "t:step([n])", "run n steps (default 1), return the last loss; Ctrl-C stops at a step boundary" },
  { "eval", trainer_eval_now, "t:eval()", "the plan's evaluation now: val_loss, accuracy" },
  { "loss", trainer_loss, "t:loss()", "the last step's loss, or nil" },
  { "save", trainer_save, "t:save([dir])", "a checkpoint of this step in dir/step_N (default checkpoint.dir)" },
  { "load", trainer_load, "t:load([path])", "load a checkpoint (a step folder, or the newest in a folder)" },
  { "set", tycho_trainer_set, "t:set{...}", "change live plan fields between steps, e.g. t:set{ optimizer = { lr = 1e-4 } }" },
  { "replan", trainer_replan_lua, "t:replan{...}", "compile the plan again with these overrides and move the trainer onto it" },
  { "param", tycho_trainer_param, "t:param(name)", "a view of this rank's part of a parameter (embed, layers.0.q, ...)" },
  { "grad", tycho_trainer_grad, "t:grad(name)", "the same for its gradient" },
  { "moment", tycho_trainer_moment, "t:moment(name, 1|2)", "the same for AdamW's exp_avg (1) or exp_avg_sq (2)" },
  { "memory", tycho_trainer_memory, "t:memory()", "this rank's memory by category: predicted, measured, in_use" },
  { "comm", tycho_trainer_comm, "t:comm([n])", "the last n collectives of this rank and per-group counters" },
  { "plan", tycho_trainer_plan, "t:plan()", "the compiled plan as a table (tycho check --json's plan)" },
  { "schedule", tycho_trainer_schedule, "t:schedule([width])", "one step of the schedule as a per-rank timeline" },
  { "generate", tycho_trainer_generate, "t:generate(ids [, opts])",
    "continue a prompt from these weights (tycho generate): the new ids; opts max_tokens, temperature, top_k, top_p, seed, eos" },
  { "help", tycho_help, "t:help()", "this list" },
  { "close", trainer_close_method, "t:close()", "close the trainer and free its groups (collective)" },
  { NULL, NULL, NULL, NULL },
};

/* Fields first (trainer_entries[0..N_TRAINER_FIELDS)), then the methods. */
static int trainer_index(lua_State *L)
{
  struct lua_trainer *lt = totrainer(L);
  const char *key = lua_tostring(L, 2);
  for (int i = 0; key && i < N_TRAINER_FIELDS; i++) {
    if (strcmp(key, trainer_entries[i].name) != 0)
      continue;
    if (i == 8) { /* closed: answered for a closed trainer too */
      lua_pushboolean(L, lt->t == NULL);
      return 1;
    }
    struct trainer *t = tycho_check_trainer(L, 1)->t;
    struct comm_group *w = comm_world();
    switch (i) {
    case 0: lua_pushinteger(L, (lua_Integer)t->step); break;
    case 1: lua_pushinteger(L, w ? w->rank : 0); break;
    case 2: lua_pushinteger(L, w ? w->size : 1); break;
    case 3: lua_pushinteger(L, t->model.tp.rank); break;
    case 4: lua_pushinteger(L, t->dp.rank); break;
    case 5: lua_pushinteger(L, t->exec.rank); break;
    case 6:
      lua_createtable(L, 0, 4);
      lua_pushinteger(L, t->plan->mesh.tp);
      lua_setfield(L, -2, "tp");
      lua_pushinteger(L, t->plan->mesh.dp);
      lua_setfield(L, -2, "dp");
      lua_pushinteger(L, t->plan->mesh.pp);
      lua_setfield(L, -2, "pp");
      lua_pushinteger(L, t->plan->model.moe.experts > 0 ? plan_ep(t->plan) : 1);
      lua_setfield(L, -2, "ep");
      lua_pushinteger(L, t->plan->zero);
      lua_setfield(L, -2, "zero");
      break;
    default: lua_pushstring(L, lt->path); break;
    }
    return 1;
  }
  lua_getfield(L, lua_upvalueindex(1), key ? key : "");
  return 1;
}

static const luaL_Reg trainer_meta[] = {
  { "__index", NULL }, /* trainer_index, with the methods as its upvalue */
  { "__gc", trainer_gc },
  { "__close", trainer_close_now },
  { "__tostring", trainer_tostring },
  { NULL, NULL },
};

static void create_trainer_meta(lua_State *L)
{
  luaL_newmetatable(L, TRAINER_META);
  luaL_setfuncs(L, trainer_meta, 0);
  tycho_entries_register(L, -1, trainer_entries, "the trainer t (t = tycho.open(PLAN), or the plan given to tycho repl)");
  lua_pushcclosure(L, trainer_index, 1); /* the methods */
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
}

/* Numbers callable with a trainer first (number_call), added to the number type's metatable. */
static void make_numbers_callable(lua_State *L)
{
  lua_pushinteger(L, 0);
  if (!lua_getmetatable(L, -1))
    lua_newtable(L);
  lua_pushcfunction(L, number_call);
  lua_setfield(L, -2, "__call");
  lua_setmetatable(L, -2);
  lua_pop(L, 1);
}

/* The module's entries: the functions this file adds (open, help) and, for help(), those the plan
 * module (lua/tycho_module.h) has put there already. */
static const struct tycho_entry module_entries[] = {
  { "open", tycho_open, "tycho.open(path [, overrides])", "compile a plan for the job and open a trainer on it (collective)" },
  { "help", tycho_help, "help([x])", "this list; help(t), help(tycho), help(x) for a tensor, help(\"t:step\") for one entry" },
  { "plan", NULL, "tycho.plan{...}", "mark a table as a plan (what a plan file returns)" },
  { "extend", NULL, "tycho.extend(base, changes)", "a plan made from another, every field keeping its file and line" },
  { "models", NULL, "tycho.models.from_hf(path)", "the model table of a Hugging Face config.json" },
  { "version", NULL, "tycho.version", "this build's version" },
  { NULL, NULL, NULL, NULL },
};

int luaopen_tycho_runtime(lua_State *L)
{
  if (!lua_istable(L, -1)) {
    lua_newtable(L);
    lua_pushstring(L, TYCHO_VERSION);
    lua_setfield(L, -2, "version");
  }
  create_trainer_meta(L);
  tycho_tensor_register(L);
  make_numbers_callable(L);
  for (int i = 0; module_entries[i].name; i++)
    if (module_entries[i].fn) {
      lua_pushcfunction(L, module_entries[i].fn);
      lua_setfield(L, -2, module_entries[i].name);
    }
  tycho_help_register_module(L, module_entries);
  return 1;
}


void tycho_runtime_bind_borrowed(lua_State *L, struct trainer *t, const char *name)
{
  struct lua_trainer *lt = lua_newuserdatauv(L, sizeof *lt, 0);
  memset(lt, 0, sizeof *lt);
  luaL_setmetatable(L, TRAINER_META);
  lt->t = t;
  lt->borrowed = 1;
  lt->serial = next_serial++;
  snprintf(lt->path, sizeof lt->path, "%s", t->plan->file);
  lua_setglobal(L, name);
}
