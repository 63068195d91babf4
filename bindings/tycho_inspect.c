/* The trainer's inspection methods (docs/repl.md, "The trainer in Lua"): t:memory() — this
 * rank's memory bill, predicted (bill_predict) and measured (the allocator's bill); t:comm(n) —
 * the flight recorder's last records and the trainer's groups' counters (comm.h); t:plan() — the
 * compiled plan as a Lua table, read from its JSON (plan_json, the form `tycho check --json`
 * writes); t:schedule() — the timeline `tycho check` draws for the plan's schedule. All local:
 * no collective. */
#define _POSIX_C_SOURCE 200809L
#include <lauxlib.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "plan/plan_json.h"
#include "runtime/model/alloc.h"
#include "layout/bill.h"
#include "runtime/train/train.h"
#include "sched/sched.h"
#include "tycho_runtime_internal.h"
#include "util/json.h"
#include "util/strbuf.h"

/* ---- t:memory() ----------------------------------------------------------------------------- */

static void push_categories(lua_State *L, const double *bytes)
{
  lua_createtable(L, 0, ALLOC_N_CATEGORIES + 1);
  double total = 0.0;
  for (int c = 0; c < ALLOC_N_CATEGORIES; c++) {
    lua_pushinteger(L, (lua_Integer)bytes[c]);
    lua_setfield(L, -2, alloc_category_name((enum alloc_category)c));
    total += bytes[c];
  }
  lua_pushinteger(L, (lua_Integer)total);
  lua_setfield(L, -2, "total");
}

/* t:memory() → { predicted = {params = bytes, grads, optimizer, activations, comm, workspace,
 * total}, measured = {...}, in_use = {...}, device = name }: predicted is the plan's bill for this
 * rank's pipeline stage, measured the allocator's peak per category on the model's device since
 * the newest tycho.open (it resets the peaks), in_use what is allocated now; each total is the
 * sum of its categories. The allocator's bill is the process's: every trainer open at once adds
 * to it. */
int tycho_trainer_memory(lua_State *L)
{
  struct trainer *t = tycho_check_trainer(L, 1)->t;
  struct bill b;
  char err[1024];
  if (bill_predict(t->plan, t->exec.rank, &b, err, sizeof err))
    return luaL_error(L, "t:memory: %s", err);
  const struct alloc_bill *have = alloc_device_bill(t->model.device);
  if (!have)
    return luaL_error(L, "t:memory: the model's device %d has no bill", t->model.device);
  double peak[ALLOC_N_CATEGORIES], now[ALLOC_N_CATEGORIES];
  for (int c = 0; c < ALLOC_N_CATEGORIES; c++) {
    peak[c] = (double)have->peak_bytes[c];
    now[c] = (double)have->n_bytes[c];
  }
  lua_createtable(L, 0, 4);
  push_categories(L, b.bytes);
  lua_setfield(L, -2, "predicted");
  push_categories(L, peak);
  lua_setfield(L, -2, "measured");
  push_categories(L, now);
  lua_setfield(L, -2, "in_use");
  lua_pushstring(L, alloc_device_name(t->model.device) ? alloc_device_name(t->model.device) : "?");
  lua_setfield(L, -2, "device");
  return 1;
}

/* ---- t:comm(n) ------------------------------------------------------------------------------ */

static void set_int(lua_State *L, const char *key, long long v)
{
  lua_pushinteger(L, (lua_Integer)v);
  lua_setfield(L, -2, key);
}

static void set_num(lua_State *L, const char *key, double v)
{
  lua_pushnumber(L, v);
  lua_setfield(L, -2, key);
}

/* "all-reduce" → "all_reduce", a key Lua can write as a field. */
static const char *op_key(enum comm_op op, char *buf, size_t n)
{
  snprintf(buf, n, "%s", comm_op_name(op));
  for (char *c = buf; *c; c++)
    if (*c == '-')
      *c = '_';
  return buf;
}

/* counters[name] = { all_reduce = {calls = , bytes = }, ... } for the ops g has issued. */
static void push_group_counters(lua_State *L, const struct comm_group *g, const char *name)
{
  if (!g)
    return;
  lua_createtable(L, 0, COMM_N_OPS);
  for (int op = 0; op < COMM_N_OPS; op++) {
    const struct comm_counter c = comm_counter_get(g, (enum comm_op)op);
    if (!c.calls)
      continue;
    char key[32];
    lua_createtable(L, 0, 2);
    set_int(L, "calls", (long long)c.calls);
    set_int(L, "bytes", (long long)c.n_bytes);
    lua_setfield(L, -2, op_key((enum comm_op)op, key, sizeof key));
  }
  set_int(L, "size", g->size);
  set_int(L, "rank", g->rank);
  lua_setfield(L, -2, name);
}

/* t:comm([n]) → { records = { {seq, op, group, peer, bytes, step, mb, status, t_issue, t_start,
 * t_end}, ... } (this rank's last n collectives, oldest first, default 10; peer and mb nil where
 * none, t_end nil while in flight), counters = { tp = {...}, dp = {...}, pp = {...}, embed = {...},
 * world = {...} } (calls and bytes per op of the trainer's groups and the world since they were
 * made; only ops issued; size and rank of the group) }. Without the comm layer both are empty. */
int tycho_trainer_comm(lua_State *L)
{
  struct trainer *t = tycho_check_trainer(L, 1)->t;
  const lua_Integer want = luaL_optinteger(L, 2, 10);
  luaL_argcheck(L, want >= 0 && want <= 1 << 20, 2, "a number of records in [0, 2^20]");
  const int have_comm = comm_world() != NULL;
  /* the records in Lua's memory (a userdata kept on the stack): nothing to free on an error */
  struct comm_record *mine = lua_newuserdatauv(L, (size_t)(want ? want : 1) * sizeof *mine, 0);
  const int n = have_comm && want ? comm_records(mine, (int)want) : 0;
  lua_createtable(L, 0, 2);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n; i++) {
    const struct comm_record *r = &mine[i];
    lua_createtable(L, 0, 11);
    set_int(L, "seq", (long long)r->seq);
    lua_pushstring(L, comm_op_name(r->op));
    lua_setfield(L, -2, "op");
    lua_pushstring(L, r->group);
    lua_setfield(L, -2, "group");
    if (r->peer >= 0)
      set_int(L, "peer", r->peer);
    set_int(L, "bytes", (long long)r->n_bytes);
    set_int(L, "step", r->step);
    if (r->mb >= 0)
      set_int(L, "mb", r->mb);
    lua_pushstring(L, r->status ? "failed" : "ok");
    lua_setfield(L, -2, "status");
    set_num(L, "t_issue", r->t_issue);
    set_num(L, "t_start", r->t_start);
    if (r->t_end > 0)
      set_num(L, "t_end", r->t_end);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "records");
  lua_createtable(L, 0, 5);
  if (have_comm) {
    push_group_counters(L, t->model.tp.group, "tp");
    push_group_counters(L, t->dp.group, "dp");
    push_group_counters(L, t->exec.group, "pp");
    push_group_counters(L, t->exec.embed, "embed");
    push_group_counters(L, comm_world(), "world");
  }
  lua_setfield(L, -2, "counters");
  lua_remove(L, -2); /* the records' userdata */
  return 1;
}

/* ---- t:plan() ------------------------------------------------------------------------------- */

/* Pushes JSON node id as a Lua value: objects as tables of fields (null members left out),
 * arrays as lists, integers as integers. */
static void push_json(lua_State *L, const struct json_doc *d, int id)
{
  const struct json_node *nd = &d->nodes[id];
  switch (nd->type) {
  case JSON_NULL: lua_pushnil(L); break;
  case JSON_FALSE: lua_pushboolean(L, 0); break;
  case JSON_TRUE: lua_pushboolean(L, 1); break;
  case JSON_STRING: lua_pushstring(L, nd->str); break;
  case JSON_NUMBER: {
    char lit[64];
    snprintf(lit, sizeof lit, "%.*s", (int)(nd->len < 63 ? nd->len : 63), d->text + nd->pos);
    char *end;
    long long i = strtoll(lit, &end, 10);
    if (!*end && !strpbrk(lit, ".eE")) {
      lua_pushinteger(L, (lua_Integer)i);
    } else {
      double x;
      json_double(d, id, &x);
      lua_pushnumber(L, x);
    }
    break;
  }
  case JSON_ARRAY: {
    lua_createtable(L, nd->n_children, 0);
    int k = 1;
    for (int c = nd->first; c >= 0; c = d->nodes[c].next) {
      push_json(L, d, c);
      lua_rawseti(L, -2, k++);
    }
    break;
  }
  case JSON_OBJECT:
    lua_createtable(L, 0, nd->n_children);
    for (int c = nd->first; c >= 0; c = d->nodes[c].next) {
      push_json(L, d, c);
      lua_setfield(L, -2, d->nodes[c].key);
    }
    break;
  }
}

static int push_json_root(lua_State *L)
{
  push_json(L, lua_touserdata(L, 1), 0);
  return 1;
}

/* t:plan() → the trainer's compiled plan (its own copy: t:set's changes included) as a table,
 * the "plan" object of docs/check-json.md. */
int tycho_trainer_plan(lua_State *L)
{
  struct trainer *t = tycho_check_trainer(L, 1)->t;
  struct strbuf b;
  struct json j;
  sb_init(&b);
  json_init(&j, &b);
  plan_json(t->plan, &j);
  char err[512];
  struct json_doc d;
  memset(&d, 0, sizeof d);
  int rc = b.failed ? -1 : json_parse(&d, b.s, b.n, "plan", 0, err, sizeof err);
  if (b.failed)
    snprintf(err, sizeof err, "out of memory writing the plan's JSON");
  if (rc) {
    sb_free(&b);
    return luaL_error(L, "t:plan: %s", err);
  }
  /* pushed under a protected call, so that the document is freed even when Lua runs out of memory */
  lua_pushcfunction(L, push_json_root);
  lua_pushlightuserdata(L, &d);
  rc = lua_pcall(L, 1, 1, 0);
  json_free(&d);
  sb_free(&b);
  if (rc)
    return lua_error(L);
  return 1;
}

/* ---- t:schedule() --------------------------------------------------------------------------- */

/* t:schedule() → one step of the plan's schedule as the per-rank timeline `tycho check` draws
 * (sched_print_timeline over the schedule simulated with the plan's costs), one string. */
int tycho_trainer_schedule(lua_State *L)
{
  struct trainer *t = tycho_check_trainer(L, 1)->t;
  const lua_Integer width = luaL_optinteger(L, 2, 0);
  struct sched s;
  struct sched_sim sim;
  char err[512];
  if (sched_from_plan(t->plan, &s, err, sizeof err)) {
    sched_free(&s);
    return luaL_error(L, "t:schedule: %s", err);
  }
  if (sched_simulate(&s, &sim, err, sizeof err)) {
    sched_free(&s);
    return luaL_error(L, "t:schedule: the schedule does not simulate: %s", err);
  }
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  if (f) {
    sched_print_timeline(f, &s, &sim, (int)width);
    fclose(f);
  }
  sched_sim_free(&sim);
  sched_free(&s);
  if (!f || !text) {
    free(text);
    return luaL_error(L, "t:schedule: out of memory");
  }
  lua_pushlstring(L, text, n);
  free(text);
  return 1;
}
