/* Cluster files (cluster.h), read in the plan sandbox. */
#include "plan/cluster.h"

#include <lauxlib.h>
#include <lua.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lua/sandbox.h"
#include "lua/tycho_module.h"
#include "util/err.h"

struct creader {
  lua_State *L;
  const char *path;
  char *err;
  size_t n;
};

static int cfail(struct creader *r, int idx, const char *key, const char *field, const char *problem)
{
  char where[600];
  if (!sandbox_where(r->L, idx, key, 0, where, sizeof where))
    snprintf(where, sizeof where, "%s", r->path);
  snprintf(r->err, r->n, "%s: %s: %s", where, field, problem);
  return -1;
}

/* The known keys of the table at idx: anything else is refused. */
static int only_keys(struct creader *r, int idx, const char *prefix, const char *const *keys)
{
  lua_pushnil(r->L);
  while (lua_next(r->L, idx)) {
    lua_pop(r->L, 1);
    int known = 0;
    if (lua_type(r->L, -1) == LUA_TSTRING)
      for (int k = 0; keys[k] && !known; k++) known = strcmp(keys[k], lua_tostring(r->L, -1)) == 0;
    if (!known) {
      char field[128], list[256] = "";
      snprintf(field, sizeof field, "%s%s", prefix,
               lua_type(r->L, -1) == LUA_TSTRING ? lua_tostring(r->L, -1) : "(a non-string key)");
      for (int k = 0; keys[k]; k++)
        snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", keys[k]);
      char problem[400];
      snprintf(problem, sizeof problem, "not a cluster field; the fields here are %s", list);
      const char *key = lua_type(r->L, -1) == LUA_TSTRING ? lua_tostring(r->L, -1) : NULL;
      int rc = cfail(r, idx, key, field, problem);
      lua_pop(r->L, 1);
      return rc;
    }
  }
  return 0;
}

/* A positive number at idx.key. */
static int number(struct creader *r, int idx, const char *prefix, const char *key, double *out)
{
  char field[128];
  snprintf(field, sizeof field, "%s%s", prefix, key);
  lua_getfield(r->L, idx, key);
  int ok = lua_type(r->L, -1) == LUA_TNUMBER;
  double v = ok ? lua_tonumber(r->L, -1) : 0;
  lua_pop(r->L, 1);
  if (!ok)
    return cfail(r, idx, key, field, "missing or not a number");
  if (!(v > 0) || !isfinite(v))
    return cfail(r, idx, key, field, "must be a positive, finite number");
  *out = v;
  return 0;
}

static int subtable(struct creader *r, int idx, const char *key)
{
  lua_getfield(r->L, idx, key);
  if (lua_type(r->L, -1) == LUA_TTABLE)
    return lua_gettop(r->L);
  lua_pop(r->L, 1);
  return cfail(r, idx, key, key, "missing or not a table");
}

/* The link table at idx.key ("intra_node"); its fields named `outer` + key + "." in messages. With
 * ops, the optional per-op tables (all_reduce, all_gather, reduce_scatter) are read too. */
static int read_link(struct creader *r, int idx, const char *outer, const char *key, struct cluster_link *l,
                     int with_ops)
{
  int t = subtable(r, idx, key);
  if (t < 0)
    return -1;
  static const char *const keys[] = { "bandwidth_gbs", "latency_us", "all_reduce", "all_gather",
                                      "reduce_scatter", NULL };
  static const char *const plain[] = { "bandwidth_gbs", "latency_us", NULL };
  char prefix[128];
  snprintf(prefix, sizeof prefix, "%s%s.", outer, key);
  double bw = 0, lat = 0;
  int rc = only_keys(r, t, prefix, with_ops ? keys : plain) || number(r, t, prefix, "bandwidth_gbs", &bw) ||
           number(r, t, prefix, "latency_us", &lat);
  l->bandwidth = bw * 1e9;
  l->latency = lat * 1e-6;
  for (int op = 0; op < 3 && !rc && with_ops; op++) { /* optional per-op figures (cluster.h) */
    lua_getfield(r->L, t, keys[2 + op]);
    int has = !lua_isnil(r->L, -1);
    lua_pop(r->L, 1);
    struct cluster_link o;
    if (has && read_link(r, t, prefix, keys[2 + op], &o, 0))
      rc = -1;
    else if (has) {
      l->op_bandwidth[op] = o.bandwidth;
      l->op_latency[op] = o.latency;
    }
  }
  lua_pop(r->L, 1);
  return rc ? -1 : 0;
}

/* Everything from the cluster file's result to the filled struct cluster, run under a protected
 * call (cluster_load): the file's tables can have metatables whose __index raises, loops into the
 * instruction limit or runs out of memory, and a Lua error outside a protected call is a panic. */
struct cluster_job {
  struct creader *r;
  struct cluster *out;
  int rc;
};

static int read_protected(lua_State *L)
{
  struct cluster_job *job = lua_touserdata(L, 1);
  struct creader *r = job->r;
  struct cluster *out = job->out;
  luaL_checkstack(L, 32, "reading the cluster file");
  job->rc = -1;
  const int t = 2;
  if (!lua_istable(L, t)) {
    snprintf(r->err, r->n, "%s: the cluster file returned a %s; it must return a table { name = ..., "
             "gpus_per_node = ..., ... }", r->path, luaL_typename(L, t));
    return 0;
  }
  static const char *const keys[] = { "name", "gpus_per_node", "device_memory_gb", "peak_tflops",
                                      "intra_node", "inter_node", "efficiency", "nodes",
                                      "overlap", "overheads", NULL };
  if (only_keys(r, t, "", keys))
    return 0;
  lua_getfield(L, t, "name");
  if (lua_type(L, -1) != LUA_TSTRING) {
    lua_pop(L, 1);
    cfail(r, t, "name", "name", "missing or not a string");
    return 0;
  }
  snprintf(out->name, sizeof out->name, "%s", lua_tostring(L, -1));
  lua_pop(L, 1);
  double gpn, mem, peak;
  if (number(r, t, "", "gpus_per_node", &gpn) || number(r, t, "", "device_memory_gb", &mem) ||
      number(r, t, "", "peak_tflops", &peak) || read_link(r, t, "", "intra_node", &out->intra, 1) ||
      read_link(r, t, "", "inter_node", &out->inter, 1))
    return 0;
  if (gpn != (int)gpn) {
    cfail(r, t, "gpus_per_node", "gpus_per_node", "must be a whole number");
    return 0;
  }
  out->gpus_per_node = (int)gpn;
  out->device_memory = mem * 1e9;
  out->peak_flops = peak * 1e12;
  int e = subtable(r, t, "efficiency");
  if (e < 0)
    return 0;
  static const char *const ekeys[] = { "compute", "comm", NULL };
  if (only_keys(r, e, "efficiency.", ekeys) ||
      number(r, e, "efficiency.", "compute", &out->compute_efficiency) ||
      number(r, e, "efficiency.", "comm", &out->comm_efficiency))
    return 0;
  if (out->compute_efficiency > 1 || out->comm_efficiency > 1) {
    cfail(r, e, out->compute_efficiency > 1 ? "compute" : "comm", "efficiency", "a fraction must be at most 1");
    return 0;
  }
  lua_pop(L, 1);
  lua_getfield(L, t, "nodes");
  int has_nodes = !lua_isnil(L, -1);
  lua_pop(L, 1);
  if (has_nodes) {
    double nodes;
    if (number(r, t, "", "nodes", &nodes))
      return 0;
    if (nodes != (int)nodes) {
      cfail(r, t, "nodes", "nodes", "must be a whole number");
      return 0;
    }
    out->nodes = (int)nodes;
  }
  lua_getfield(L, t, "overlap");
  int overlap_type = lua_type(L, -1), overlap = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (overlap_type != LUA_TNIL && overlap_type != LUA_TBOOLEAN) {
    cfail(r, t, "overlap", "overlap", "must be true or false");
    return 0;
  }
  out->no_overlap = overlap_type == LUA_TBOOLEAN && !overlap;
  lua_getfield(L, t, "overheads");
  int has_over = !lua_isnil(L, -1);
  lua_pop(L, 1);
  if (has_over) {
    int o = subtable(r, t, "overheads");
    if (o < 0)
      return 0;
    static const char *const okeys[] = { "attention_tflops", "pointwise_ns", "optimizer_ns", NULL };
    if (only_keys(r, o, "overheads.", okeys))
      return 0;
    double *dst[3] = { &out->attention_flops, &out->pointwise_s, &out->optimizer_s };
    static const double scale[3] = { 1e12, 1e-9, 1e-9 };
    for (int k = 0; k < 3; k++) {
      lua_getfield(L, o, okeys[k]);
      int has = !lua_isnil(L, -1);
      lua_pop(L, 1);
      if (has && number(r, o, "overheads.", okeys[k], dst[k]))
        return 0;
      *dst[k] *= scale[k];
    }
  }
  job->rc = 0;
  return 0;
}

int cluster_load(const char *path, int unsafe, struct cluster *out, char *err, size_t err_size)
{
  memset(out, 0, sizeof *out);
  snprintf(out->file, sizeof out->file, "%s", path);
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash)
    *slash = 0;
  else
    snprintf(dir, sizeof dir, ".");
  static const struct sandbox_module modules[] = { { "tycho", luaopen_tycho } };
  struct sandbox_options so = { unsafe, 0, 0, dir, modules, 1 };
  struct sandbox sb;
  if (sandbox_open(&sb, &so, err, err_size))
    return -1;
  struct creader r = { sb.L, path, err, err_size };
  int rc = -1;
  if (sandbox_dofile(&sb, path, 0, err, err_size))
    goto done;
  struct cluster_job job = { &r, out, -1 };
  lua_pushcfunction(sb.L, read_protected);
  lua_pushlightuserdata(sb.L, &job);
  lua_pushvalue(sb.L, -3);
  char msg[1024];
  if (sandbox_pcall(&sb, 2, 0, msg, sizeof msg)) {
    snprintf(err, err_size, "%s: reading the cluster file: %s", path, msg);
    goto done;
  }
  rc = job.rc;
done:
  sandbox_close(&sb);
  if (rc) /* the file's content, or the file missing: an input error (util/err.h) */
    err_mark_input();
  return rc;
}
