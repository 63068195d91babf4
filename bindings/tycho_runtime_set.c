/* The trainer's live settings in Lua (tycho_runtime.h; docs/repl.md): t:set writes the plan
 * fields the runtime reads afresh at every step (the plan-field table's live rows), checked by the
 * compiler's own check with its message, all or nothing over the job. */
#define _POSIX_C_SOURCE 200809L
#include <lauxlib.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "plan/fields.h"
#include "runtime/train/train.h"
#include "runtime/train/train_progress.h"
#include "tycho_runtime_internal.h"

/* The live fields are the plan-field table's LIVE rows (fields.h): the fields the runtime reads
 * afresh at every step (optimizer_lr, the update, the clipping, t:step's cadences, evaluation,
 * t:save's default folder). The optimizer's betas, eps and weight decay are copied into the
 * optimizer at open; t:set writes both. Everything else shapes memory, groups, data or the
 * model: t:replan. */
static const struct plan_field *live_find(const char *path)
{
  const struct plan_field *f = plan_field_find(path);
  return f && (f->flags & PLAN_FIELD_LIVE) ? f : NULL;
}

static int compare_paths(const void *a, const void *b)
{
  return strcmp(*(const char *const *)a, *(const char *const *)b);
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
  const char *live[64];
  int n_live = 0;
  for (int i = 0; i < plan_n_fields && n_live < 64; i++)
    if (plan_fields[i].flags & PLAN_FIELD_LIVE)
      live[n_live++] = plan_fields[i].path;
  qsort(live, (size_t)n_live, sizeof live[0], compare_paths);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 0; i < n_live; i++) {
    luaL_addstring(&b, i ? ", " : "");
    luaL_addstring(&b, live[i]);
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

/* Writes the value at idx into field f of p, checked as the compiler checks it (the finite
 * check included, which the compiler makes once the plan is read), with its message. */
static void live_write(lua_State *L, struct plan *p, const struct plan_field *f, int idx)
{
  char msg[1536];
  if (plan_field_from_lua(L, idx, f, p, 1, msg, sizeof msg))
    luaL_error(L, "t:set: %s", msg);
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

/* The live fields of p as they were (t:set restores them when a change is refused). */
static void live_restore(struct plan *p, const struct plan *before)
{
  for (int i = 0; i < plan_n_fields; i++)
    if (plan_fields[i].flags & PLAN_FIELD_LIVE)
      memcpy((char *)p + plan_fields[i].offset, (const char *)before + plan_fields[i].offset, plan_fields[i].size);
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
    const struct plan_field *f = live_find(path);
    for (int k = 0; !f && !strchr(path, '.') && k < plan_n_fields; k++)
      if ((plan_fields[k].flags & PLAN_FIELD_LIVE) && strncmp(plan_fields[k].path, path, strlen(path)) == 0 &&
          plan_fields[k].path[strlen(path)] == '.')
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
  struct lua_trainer *lt = tycho_check_trainer(L, 1);
  struct trainer *t = lt->t;
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
  struct plan before = *p; /* for the live fields' bytes only: its pointers are never followed */
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
  if (comm_agree_err(t->world, refused, err, sizeof err, COMM_AGREE_NAME_RANK_UNLESS_PLAN)) {
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
  tycho_trainer_keep_settings(L, lt, 2); /* t:replan starts from the plan as it is now */
  return 0;
}
