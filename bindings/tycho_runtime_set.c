/* The trainer's live settings in Lua (tycho_runtime.h; docs/repl.md): t:set writes the plan
 * fields the runtime reads afresh at every step, checked against the compiler's ranges, all or
 * nothing over the job. */
#define _POSIX_C_SOURCE 200809L
#include <lauxlib.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "runtime/train.h"
#include "runtime/train_progress.h"
#include "tycho_runtime_internal.h"

enum live_type { LIVE_DOUBLE, LIVE_INT, LIVE_LONG, LIVE_DECAY, LIVE_PATH };

/* The plan fields the runtime reads afresh at every step (optimizer_lr, the update, the
 * clipping, t:step's cadences, evaluation, t:save's default folder), with the compiler's ranges.
 * The optimizer's betas, eps and weight decay are copied into the optimizer at open; t:set
 * writes both. Everything else shapes memory, groups, data or the model: t:replan. */
static const struct live_field {
  const char *path;
  enum live_type type;
  size_t offset;
  double min, max;
  int min_open, max_open;
} live_fields[] = {
  { "checkpoint.dir", LIVE_PATH, offsetof(struct plan, checkpoint.dir), 0, 0, 0, 0 },
  { "log.every", LIVE_INT, offsetof(struct plan, log.every), 1, 1 << 30, 0, 0 },
  { "lr_schedule.decay", LIVE_DECAY, offsetof(struct plan, lr_schedule.decay), 0, 0, 0, 0 },
  { "lr_schedule.decay_steps", LIVE_LONG, offsetof(struct plan, lr_schedule.decay_steps), 1, 0x1p53, 0, 0 },
  { "lr_schedule.min_lr", LIVE_DOUBLE, offsetof(struct plan, lr_schedule.min_lr), 0, INFINITY, 0, 0 },
  { "lr_schedule.warmup", LIVE_INT, offsetof(struct plan, lr_schedule.warmup), 0, 1 << 30, 0, 0 },
  { "optimizer.beta1", LIVE_DOUBLE, offsetof(struct plan, optimizer.beta1), 0, 1, 0, 1 },
  { "optimizer.beta2", LIVE_DOUBLE, offsetof(struct plan, optimizer.beta2), 0, 1, 0, 1 },
  { "optimizer.eps", LIVE_DOUBLE, offsetof(struct plan, optimizer.eps), 0, INFINITY, 1, 0 },
  { "optimizer.grad_clip", LIVE_DOUBLE, offsetof(struct plan, optimizer.grad_clip), 0, INFINITY, 0, 0 },
  { "optimizer.lr", LIVE_DOUBLE, offsetof(struct plan, optimizer.lr), 0, INFINITY, 1, 0 },
  { "optimizer.weight_decay", LIVE_DOUBLE, offsetof(struct plan, optimizer.weight_decay), 0, INFINITY, 0, 0 },
  { "train.eval_batches", LIVE_INT, offsetof(struct plan, train.eval_batches), 0, 1 << 30, 0, 0 },
  { "train.eval_every", LIVE_INT, offsetof(struct plan, train.eval_every), 0, 1 << 30, 0, 0 },
  { "train.steps", LIVE_LONG, offsetof(struct plan, train.steps), 1, 0x1p53, 0, 0 },
};
#define N_LIVE ((int)(sizeof live_fields / sizeof live_fields[0]))

static const struct live_field *live_find(const char *path)
{
  for (int i = 0; i < N_LIVE; i++)
    if (strcmp(live_fields[i].path, path) == 0)
      return &live_fields[i];
  return NULL;
}

/* The value at idx as Lua source, for messages. */
static const char *describe_value(lua_State *L, int idx, char *buf, size_t n)
{
  if (lua_type(L, idx) == LUA_TSTRING)
    snprintf(buf, n, "\"%s\"", lua_tostring(L, idx));
  else if (lua_type(L, idx) == LUA_TNUMBER || lua_type(L, idx) == LUA_TBOOLEAN)
    snprintf(buf, n, "%s", luaL_tolstring(L, idx, NULL)), lua_pop(L, 1);
  else
    snprintf(buf, n, "a %s", luaL_typename(L, idx));
  return buf;
}

/* The refusal of a field that is not live: where to go instead. */
static int refuse_field(lua_State *L, const char *path, int value)
{
  char v[128], section[128];
  describe_value(L, value, v, sizeof v);
  const char *dot = strchr(path, '.');
  snprintf(section, sizeof section, "%.*s", dot ? (int)(dot - path) : (int)strlen(path), path);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 0; i < N_LIVE; i++) {
    luaL_addstring(&b, i ? ", " : "");
    luaL_addstring(&b, live_fields[i].path);
  }
  luaL_pushresult(&b);
  if (dot)
    return luaL_error(L, "t:set: %s = %s cannot change between steps (the fields t:set changes: %s); "
                      "re-plan instead: t:replan{ %s = { %s = %s } }", path, v, lua_tostring(L, -1), section,
                      dot + 1, v[0] == 'a' && v[1] == ' ' ? "..." : v);
  return luaL_error(L, "t:set: %s = %s cannot change between steps (the fields t:set changes: %s); "
                    "re-plan instead: t:replan{ %s = %s }", path, v, lua_tostring(L, -1), path,
                    v[0] == 'a' && v[1] == ' ' ? "..." : v);
}

/* Writes the value at idx into field f of p, checked as the compiler checks it. */
static void live_write(lua_State *L, struct plan *p, const struct live_field *f, int idx)
{
  char *at = (char *)p + f->offset, v[128];
  describe_value(L, idx, v, sizeof v);
  if (f->type == LIVE_PATH) {
    if (lua_type(L, idx) != LUA_TSTRING || lua_rawlen(L, idx) >= PLAN_PATH_MAX)
      luaL_error(L, "t:set: %s = %s: must be a path (a string shorter than %d bytes)", f->path, v, PLAN_PATH_MAX);
    snprintf(at, PLAN_PATH_MAX, "%s", lua_tostring(L, idx));
    return;
  }
  if (f->type == LIVE_DECAY) {
    static const char *const decays[] = { "constant", "cosine", "linear" };
    for (int k = 0; k < 3 && lua_type(L, idx) == LUA_TSTRING; k++)
      if (strcmp(lua_tostring(L, idx), decays[k]) == 0) {
        *(enum plan_decay *)(void *)at = (enum plan_decay)k;
        return;
      }
    luaL_error(L, "t:set: %s = %s: must be \"constant\", \"cosine\" or \"linear\"", f->path, v);
  }
  const double x = lua_tonumber(L, idx);
  int bad = lua_type(L, idx) != LUA_TNUMBER || isnan(x) || (f->min_open ? x <= f->min : x < f->min) ||
            (f->max_open ? x >= f->max : x > f->max);
  char why[256];
  if (f->type != LIVE_DOUBLE) {
    bad |= x != floor(x);
    if (bad) {
      snprintf(why, sizeof why, "t:set: %s = %s: must be an integer in [%.0f, %.0f]", f->path, v, f->min, f->max);
      luaL_error(L, "%s", why);
    }
    if (f->type == LIVE_INT)
      *(int *)(void *)at = (int)x;
    else
      *(long long *)(void *)at = (long long)x;
    return;
  }
  if (bad) {
    if (isinf(f->max))
      snprintf(why, sizeof why, "t:set: %s = %s: must be a number %s %g", f->path, v, f->min_open ? ">" : "≥", f->min);
    else
      snprintf(why, sizeof why, "t:set: %s = %s: must be a number in %s%g, %g%s", f->path, v, f->min_open ? "(" : "[",
               f->min, f->max, f->max_open ? ")" : "]");
    luaL_error(L, "%s", why);
  }
  *(double *)(void *)at = x;
}

/* Pushes the (path, value) pairs of the table at idx into the list at out as {path, value}:
 * sections of fields ({ optimizer = { lr = 1e-4 } }) or dotted keys ({ ["optimizer.lr"] = 1e-4 }). */
static void collect_settings(lua_State *L, int idx, const char *prefix, int out)
{
  idx = lua_absindex(L, idx);
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    if (lua_type(L, -2) != LUA_TSTRING)
      luaL_error(L, "t:set: keys are field names, as in t:set{ optimizer = { lr = 1e-4 } }");
    char path[256];
    snprintf(path, sizeof path, "%s%s", prefix, lua_tostring(L, -2));
    if (lua_istable(L, -1) && !prefix[0]) {
      char sub[260];
      snprintf(sub, sizeof sub, "%s.", path);
      collect_settings(L, -1, sub, out);
    } else {
      lua_createtable(L, 2, 0);
      lua_pushstring(L, path);
      lua_rawseti(L, -2, 1);
      lua_pushvalue(L, -2);
      lua_rawseti(L, -2, 2);
      lua_rawseti(L, out, (lua_Integer)lua_rawlen(L, out) + 1);
    }
    lua_pop(L, 1);
  }
}

static int compare_settings(lua_State *L)
{
  lua_rawgeti(L, 1, 1);
  lua_rawgeti(L, 2, 1);
  lua_pushboolean(L, strcmp(lua_tostring(L, -2), lua_tostring(L, -1)) < 0);
  return 1;
}

/* The fields t:set restores when a change is refused (plain structs: no pointers). */
struct live_state {
  __typeof__(((struct plan *)0)->optimizer) optimizer;
  __typeof__(((struct plan *)0)->lr_schedule) lr_schedule;
  __typeof__(((struct plan *)0)->train) train;
  __typeof__(((struct plan *)0)->log) log;
  __typeof__(((struct plan *)0)->checkpoint) checkpoint;
};

static void live_save(const struct plan *p, struct live_state *s)
{
  s->optimizer = p->optimizer;
  s->lr_schedule = p->lr_schedule;
  s->train = p->train;
  s->log = p->log;
  s->checkpoint = p->checkpoint;
}

static void live_restore(struct plan *p, const struct live_state *s)
{
  p->optimizer = s->optimizer;
  p->lr_schedule = s->lr_schedule;
  p->train = s->train;
  p->log = s->log;
  p->checkpoint = s->checkpoint;
}

/* Applies the pairs in the list at `list` to p (sorted by path, so every rank checks them in
 * the same order); a Lua error for a field that is not live or a value out of range. */
static int apply_settings(lua_State *L)
{
  struct plan *p = lua_touserdata(L, 1);
  const int list = 2;
  const lua_Integer n = (lua_Integer)lua_rawlen(L, list);
  for (lua_Integer i = 1; i <= n; i++) {
    lua_rawgeti(L, list, i);
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    const char *path = lua_tostring(L, -2);
    const struct live_field *f = live_find(path);
    for (int k = 0; !f && !strchr(path, '.') && k < N_LIVE; k++)
      if (strncmp(live_fields[k].path, path, strlen(path)) == 0 && live_fields[k].path[strlen(path)] == '.')
        luaL_error(L, "t:set: %s = %s: a section is a table of fields, as in t:set{ optimizer = { lr = 1e-4 } }",
                   path, luaL_tolstring(L, -1, NULL));
    if (!f)
      refuse_field(L, path, lua_gettop(L));
    live_write(L, p, f, lua_gettop(L));
    lua_pop(L, 3);
  }
  const struct plan *q = p;
  if (q->lr_schedule.decay != PLAN_DECAY_CONSTANT && q->lr_schedule.decay_steps < q->lr_schedule.warmup)
    return luaL_error(L, "t:set: lr_schedule.decay_steps = %I: shorter than lr_schedule.warmup = %d",
                      (lua_Integer)q->lr_schedule.decay_steps, q->lr_schedule.warmup);
  if (q->lr_schedule.min_lr > q->optimizer.lr)
    return luaL_error(L, "t:set: lr_schedule.min_lr = %f: larger than optimizer.lr = %f; lower "
                      "lr_schedule.min_lr in the same t:set", q->lr_schedule.min_lr, q->optimizer.lr);
  return 0;
}

/* t:set{ section = { field = value, ... }, ... }: changes live fields of the trainer's plan
 * between steps. All or nothing: a refused field or value, or ranks whose plans differ after the
 * change (the plan hash is compared over the world), leave every field as it was. Collective. */
int tycho_trainer_set(lua_State *L)
{
  struct trainer *t = tycho_check_trainer(L, 1)->t;
  luaL_checktype(L, 2, LUA_TTABLE);
  lua_settop(L, 2);
  lua_newtable(L);
  collect_settings(L, 2, "", 3);
  /* sort by path: table.sort may be absent, so a small insertion sort through compare_settings */
  const lua_Integer n = (lua_Integer)lua_rawlen(L, 3);
  for (lua_Integer i = 2; i <= n; i++)
    for (lua_Integer j = i; j > 1; j--) {
      lua_pushcfunction(L, compare_settings);
      lua_rawgeti(L, 3, j);
      lua_rawgeti(L, 3, j - 1);
      lua_call(L, 2, 1);
      const int less = lua_toboolean(L, -1);
      lua_pop(L, 1);
      if (!less)
        break;
      lua_rawgeti(L, 3, j);
      lua_rawgeti(L, 3, j - 1);
      lua_rawseti(L, 3, j);
      lua_rawseti(L, 3, j - 1);
    }
  struct plan *p = &t->own_plan;
  struct live_state before;
  live_save(p, &before);
  lua_pushcfunction(L, apply_settings);
  lua_pushlightuserdata(L, p);
  lua_pushvalue(L, 3);
  char err[ERR_MAX] = "";
  const int refused = lua_pcall(L, 2, 0, 0) ? TRAIN_PLAN_ERROR : TRAIN_OK;
  if (refused) {
    live_restore(p, &before);
    snprintf(err, sizeof err, "%s", lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  /* a rank that refused stops the others before the hash check, which needs them all */
  if (train_agree(t->world, refused, err, sizeof err)) {
    live_restore(p, &before);
    return luaL_error(L, "%s", err);
  }
  if (t->world && comm_check_plan_hash(plan_hash(p), err, sizeof err)) {
    live_restore(p, &before);
    return luaL_error(L, "t:set: the ranks' plans would differ (%s); nothing changed", err);
  }
  /* the optimizer's own copies (optimizer.c reads them in the update) */
  t->opt.lr = p->optimizer.lr;
  t->opt.beta1 = p->optimizer.beta1;
  t->opt.beta2 = p->optimizer.beta2;
  t->opt.eps = p->optimizer.eps;
  t->opt.weight_decay = p->optimizer.weight_decay;
  t->opt.grad_clip = p->optimizer.grad_clip;
  return 0;
}
