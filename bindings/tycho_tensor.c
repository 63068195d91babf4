/* Tensor objects of the trainer binding (docs/repl.md, "The trainer in Lua"): t:param(name),
 * t:grad(name) and t:moment(name, 1|2) give a view of what this rank holds of a parameter, its
 * gradient or an AdamW moment; :gather() gives the whole tensor as a host copy.
 *
 * What a rank holds. A parameter is split over the tp group by its layout (model.h: tp_dim,
 * start, local — the rank's block of the stored tensor, vocabulary padding rows included), held
 * by the pipeline rank of its stage only, and under ZeRO kept in shards of the flat layout over
 * the dp group (dp.h): the rank owns a slice of every bucket, so of one tensor it holds a range
 * of its block's row-major elements (perhaps none). Which memory is sharded depends on the kind
 * and the stage: parameters under zero 3; gradients, as the update reads them (before clipping,
 * which AdamW applies as it reads), under zero ≥ 1 (zero 1 keeps the whole summed gradient but
 * updates from the rank's share only);
 * moments under zero ≥ 1. Otherwise the rank holds its whole block.
 *
 * A view reads the trainer's memory each time it is asked (through host views, hostview.h: the
 * runtime never dereferences tensor memory), so after t:step it shows the new values; it keeps
 * its trainer alive and fails once the trainer is closed. x[i] is element i (1-based) of what
 * the rank holds, in the order it is stored: the block row-major, or the shard's range of it
 * (layout.zero.first says where that range starts). :gather() is collective over the world: a
 * sum over the dp group assembles a shard's block (the ranges are disjoint, so it is exact), an
 * all-gather over the tp group the whole stored tensor, a broadcast over the pp group brings it
 * from its stage to every rank; the padding rows are dropped. That traffic is the model groups'
 * and is counted and recorded like any other (t:comm). */
#define _POSIX_C_SOURCE 200809L
#include <lauxlib.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "runtime/model/alloc.h"
#include "runtime/model/hostview.h"
#include "runtime/train/train.h"
#include "runtime/train/train_progress.h"
#include "tycho_runtime_internal.h"
#include "util/err.h"

#define STATS_META "tycho.stats"

enum tensor_kind { KIND_PARAM, KIND_GRAD, KIND_EXP_AVG, KIND_EXP_AVG_SQ, KIND_HOST };
static const char *const kind_names[] = { "param", "grad", "exp_avg", "exp_avg_sq", "host" };

/* A tensor object: a view of a trainer's tensor (its uservalue 1 is the trainer), or a host copy
 * made by :gather() holding its elements. */
struct lua_tensor {
  enum tensor_kind kind;
  char name[MODEL_NAME_MAX];
  int n_dims;
  int64_t shape[2];          /* host copies: the Hugging Face shape */
  size_t n_elems;            /* host copies: shape[0] · shape[1] */
  real data[];               /* host copies: (n_elems) */
};

/* What this rank holds of a view's tensor, resolved afresh at each use. */
struct view {
  struct trainer *t;
  const struct model_param *p;
  int index;                 /* in the parameter table */
  const real *base;          /* backend memory of the first element held; NULL when none */
  size_t count;              /* elements held here */
  size_t first;              /* index of base[0] among the block's row-major elements */
  int sharded;               /* a ZeRO shard's range of the block */
};

#define totensor(L, i) ((struct lua_tensor *)luaL_checkudata(L, i, TENSOR_META))

/* This rank's range of parameter i inside its shard of the flat layout: the bucket's slice
 * [s0, s0 + share) of the rank, intersected with the parameter. *at: the range's offset from s0. */
static void shard_range(const struct dp *d, int i, const struct model_param *p, size_t *first, size_t *count,
                        size_t *at, const struct dp_bucket **bucket)
{
  const struct dp_bucket *k = &d->layout.buckets[d->layout.param_bucket[i]];
  const size_t s0 = k->start + (size_t)dp_bucket_rank(d, d->layout.param_bucket[i]) * k->share, s1 = s0 + k->share;
  const size_t lo = p->offset > s0 ? p->offset : s0;
  const size_t hi = p->offset + p->n_elems < s1 ? p->offset + p->n_elems : s1;
  *bucket = k;
  *first = lo < hi ? lo - p->offset : 0;
  *count = lo < hi ? hi - lo : 0;
  *at = lo < hi ? lo - s0 : 0;
}

static void resolve(lua_State *L, int idx, const struct lua_tensor *x, struct view *v)
{
  lua_getiuservalue(L, idx, 1);
  struct trainer *t = tycho_check_trainer(L, -1)->t;
  lua_pop(L, 1); /* still referenced by the tensor's uservalue */
  memset(v, 0, sizeof *v);
  v->t = t;
  const struct model *m = &t->model;
  for (int i = 0; i < m->n_params && !v->p; i++)
    if (strcmp(m->params[i].name, x->name) == 0) {
      v->p = &m->params[i];
      v->index = i;
    }
  if (!v->p)
    luaL_error(L, "%s: not a parameter of this trainer's model", x->name);
  const struct model_param *p = v->p;
  const struct dp *d = &t->dp;
  const int zero = d->zero;
  v->sharded = x->kind == KIND_PARAM ? dp_master_sharded(d) : zero >= 1;
  if (!v->sharded) {
    v->first = 0;
    v->count = p->here ? p->n_elems : 0;
    v->base = x->kind == KIND_PARAM ? p->data : x->kind == KIND_GRAD ? p->grad
              : (x->kind == KIND_EXP_AVG ? t->opt.m : t->opt.v) + p->offset;
    if (!v->count)
      v->base = NULL;
    return;
  }
  size_t at;
  const struct dp_bucket *k;
  shard_range(d, v->index, p, &v->first, &v->count, &at, &k);
  const real *share; /* this rank's slice of the bucket */
  if (x->kind == KIND_PARAM)
    share = d->shard_params + k->shard_offset;
  else if (x->kind == KIND_GRAD)
    share = zero >= 2 ? d->shard_grads + k->shard_offset
                      : m->grad_memory + k->start + (size_t)dp_bucket_rank(d, d->layout.param_bucket[v->index]) * k->share;
  else
    share = (x->kind == KIND_EXP_AVG ? t->opt.m : t->opt.v) + k->shard_offset;
  v->base = v->count ? share + at : NULL;
}

/* The view's elements in host memory (a copy: the caller frees it); NULL with count 0. A Lua
 * error when out of memory. */
static real *read_all(lua_State *L, const struct view *v)
{
  if (!v->count)
    return NULL;
  const struct model *m = &v->t->model;
  const size_t n_bytes = v->count * sizeof(real);
  real *copy = malloc(n_bytes);
  char why[FAULT_MSG_MAX] = "out of memory";
  const void *view = copy ? hostview_read(m->k, m->kctx, v->base, n_bytes, why, sizeof why) : NULL;
  if (!view) {
    free(copy);
    luaL_error(L, "reading %I elements of a tensor: %s", (lua_Integer)v->count, why);
  }
  memcpy(copy, view, n_bytes);
  hostview_close(m->k, m->kctx, (void *)v->base, (void *)view, n_bytes, 0);
  return copy;
}

/* The elements of x held here: a copy to free (*owned) for a view, the data itself for a host
 * tensor. */
static const real *elements(lua_State *L, int idx, struct lua_tensor *x, size_t *count, real **owned)
{
  *owned = NULL;
  if (x->kind == KIND_HOST) {
    *count = x->n_elems;
    return x->data;
  }
  struct view v;
  resolve(L, idx, x, &v);
  *count = v.count;
  *owned = read_all(L, &v);
  return *owned;
}

/* ---- making tensors ------------------------------------------------------------------------- */

/* The Hugging Face name of a short form (embed, norm, head, layers.N.q|k|v|o|gate|up|down|
 * attn_norm|mlp_norm), or of a name without "model."; the name itself when it is one. */
static int resolve_name(const struct model *m, const char *given, char *out, size_t n)
{
  if (model_find(m, given))
    return snprintf(out, n, "%s", given), 0;
  if (strlen(given) + 7 <= n) {
    snprintf(out, n, "model.%s", given);
    if (model_find(m, out))
      return 0;
  }
  if (strcmp(given, "embed") == 0 || (strcmp(given, "head") == 0 && m->config.tie_embeddings))
    return snprintf(out, n, "model.embed_tokens.weight"), 0;
  if (strcmp(given, "head") == 0)
    return snprintf(out, n, "lm_head.weight"), 0;
  if (strcmp(given, "norm") == 0)
    return snprintf(out, n, "model.norm.weight"), 0;
  int layer, used = 0;
  if (sscanf(given, "layers.%d.%n", &layer, &used) == 1 && used > 0) {
    static const char *const shorts[][2] = {
      { "q", "self_attn.q_proj.weight" }, { "k", "self_attn.k_proj.weight" },
      { "v", "self_attn.v_proj.weight" }, { "o", "self_attn.o_proj.weight" },
      { "gate", "mlp.gate_proj.weight" }, { "up", "mlp.up_proj.weight" }, { "down", "mlp.down_proj.weight" },
      { "attn_norm", "input_layernorm.weight" }, { "mlp_norm", "post_attention_layernorm.weight" },
    };
    for (size_t i = 0; i < sizeof shorts / sizeof shorts[0]; i++)
      if (strcmp(given + used, shorts[i][0]) == 0) {
        snprintf(out, n, "model.layers.%d.%s", layer, shorts[i][1]);
        return model_find(m, out) ? 0 : -1;
      }
  }
  return -1;
}

static int push_view(lua_State *L, enum tensor_kind kind, const char *given)
{
  struct trainer *t = tycho_check_trainer(L, 1)->t;
  char name[MODEL_NAME_MAX];
  if (resolve_name(&t->model, given, name, sizeof name))
    return luaL_error(L, "no parameter \"%s\": give a Hugging Face name (model.layers.0.self_attn.q_proj.weight) "
                      "or a short form: embed, norm, head, layers.N.q|k|v|o|gate|up|down|attn_norm|mlp_norm "
                      "(N from 0 to %d)", given, t->model.config.n_layers - 1);
  struct lua_tensor *x = lua_newuserdatauv(L, sizeof *x, 1);
  memset(x, 0, sizeof *x);
  x->kind = kind;
  snprintf(x->name, sizeof x->name, "%s", name);
  lua_pushvalue(L, 1);
  lua_setiuservalue(L, -2, 1);
  luaL_setmetatable(L, TENSOR_META);
  return 1;
}

int tycho_trainer_param(lua_State *L)
{
  return push_view(L, KIND_PARAM, luaL_checkstring(L, 2));
}

int tycho_trainer_grad(lua_State *L)
{
  return push_view(L, KIND_GRAD, luaL_checkstring(L, 2));
}

int tycho_trainer_moment(lua_State *L)
{
  const char *name = luaL_checkstring(L, 2);
  const lua_Integer which = luaL_optinteger(L, 3, 1);
  luaL_argcheck(L, which == 1 || which == 2, 3, "1 (AdamW's exp_avg) or 2 (exp_avg_sq)");
  return push_view(L, which == 1 ? KIND_EXP_AVG : KIND_EXP_AVG_SQ, name);
}

/* ---- reading -------------------------------------------------------------------------------- */

/* x:norm(): the L2 norm of the elements held here, summed in double. */
static int tensor_norm(lua_State *L)
{
  struct lua_tensor *x = totensor(L, 1);
  size_t n;
  real *owned;
  const real *e = elements(L, 1, x, &n, &owned);
  double sum = 0.0;
  for (size_t i = 0; i < n; i++) sum += (double)e[i] * (double)e[i];
  free(owned);
  lua_pushnumber(L, sqrt(sum));
  return 1;
}

static int stats_tostring(lua_State *L)
{
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "count");
  if (lua_tointeger(L, -1) == 0) {
    lua_pushliteral(L, "count 0");
    return 1;
  }
  double v[4];
  static const char *const keys[] = { "min", "max", "mean", "std" };
  for (int i = 0; i < 4; i++) {
    lua_getfield(L, 1, keys[i]);
    v[i] = lua_tonumber(L, -1);
    lua_pop(L, 1);
  }
  char text[256];
  snprintf(text, sizeof text, "min %.6g max %.6g mean %.6g std %.6g count %lld", v[0], v[1], v[2], v[3],
           (long long)lua_tointeger(L, -1));
  lua_pushstring(L, text);
  return 1;
}

/* x:stats() → { min, max, mean, std, count } of the elements held here (std: the population's,
 * Σ(x − mean)² / count), printing as one line. Empty: count 0 alone. */
static int tensor_stats(lua_State *L)
{
  struct lua_tensor *x = totensor(L, 1);
  size_t n;
  real *owned;
  const real *e = elements(L, 1, x, &n, &owned);
  double lo = INFINITY, hi = -INFINITY, sum = 0.0, dev = 0.0;
  for (size_t i = 0; i < n; i++) {
    const double a = e[i];
    lo = a < lo ? a : lo;
    hi = a > hi ? a : hi;
    sum += a;
  }
  const double mean = n ? sum / (double)n : 0.0;
  for (size_t i = 0; i < n; i++) dev += ((double)e[i] - mean) * ((double)e[i] - mean);
  free(owned);
  lua_createtable(L, 0, 5);
  if (n) {
    lua_pushnumber(L, lo);
    lua_setfield(L, -2, "min");
    lua_pushnumber(L, hi);
    lua_setfield(L, -2, "max");
    lua_pushnumber(L, mean);
    lua_setfield(L, -2, "mean");
    lua_pushnumber(L, sqrt(dev / (double)n));
    lua_setfield(L, -2, "std");
  }
  lua_pushinteger(L, (lua_Integer)n);
  lua_setfield(L, -2, "count");
  luaL_setmetatable(L, STATS_META);
  return 1;
}

/* x:table() → the elements held here as a Lua list. */
static int tensor_table(lua_State *L)
{
  struct lua_tensor *x = totensor(L, 1);
  size_t n;
  real *owned;
  const real *e = elements(L, 1, x, &n, &owned);
  if (n > (size_t)INT32_MAX) {
    free(owned);
    return luaL_error(L, "%s: %I elements are too many for a Lua list", x->name, (lua_Integer)n);
  }
  lua_createtable(L, (int)n, 0); /* may raise: copy first, so nothing leaks then */
  for (size_t i = 0; i < n; i++) {
    lua_pushnumber(L, (lua_Number)e[i]);
    lua_rawseti(L, -2, (lua_Integer)i + 1);
  }
  free(owned);
  return 1;
}

static int element(lua_State *L, struct lua_tensor *x, lua_Integer i)
{
  if (x->kind == KIND_HOST) {
    if (i < 1 || (size_t)i > x->n_elems)
      return luaL_error(L, "%s: index %I out of range 1..%I", x->name, i, (lua_Integer)x->n_elems);
    lua_pushnumber(L, (lua_Number)x->data[i - 1]);
    return 1;
  }
  struct view v;
  resolve(L, 1, x, &v);
  if (i < 1 || (size_t)i > v.count)
    return luaL_error(L, "%s: index %I out of range 1..%I (the elements this rank holds)", x->name, i,
                      (lua_Integer)v.count);
  const struct model *m = &v.t->model;
  const real *at = v.base + (i - 1);
  char why[FAULT_MSG_MAX];
  const real *h = hostview_read(m->k, m->kctx, at, sizeof(real), why, sizeof why);
  if (!h)
    return luaL_error(L, "reading an element of %s: %s", x->name, why);
  const real value = *h;
  hostview_close(m->k, m->kctx, (void *)at, (void *)h, sizeof(real), 0);
  lua_pushnumber(L, (lua_Number)value);
  return 1;
}

/* ---- gathering ------------------------------------------------------------------------------ */

/* The pipeline rank whose stage holds parameter p. */
static int holder_pp_rank(const struct plan *pl, const struct model_param *p)
{
  if (p->layer >= 0)
    return pl->stages[pl->layers[p->layer].stage].pp_rank;
  for (int s = 0; s < pl->n_stages; s++)
    if (p->kind == MODEL_EMBED ? pl->stages[s].has_embed : pl->stages[s].has_head)
      return pl->stages[s].pp_rank;
  return 0;
}

static struct lua_tensor *new_host_tensor(lua_State *L, const char *name, int n_dims, const int64_t shape[2])
{
  const size_t n = (size_t)shape[0] * (size_t)(n_dims == 2 ? shape[1] : 1);
  struct lua_tensor *y = lua_newuserdatauv(L, sizeof *y + n * sizeof(real), 1);
  memset(y, 0, sizeof *y);
  y->kind = KIND_HOST;
  snprintf(y->name, sizeof y->name, "%s", name);
  y->n_dims = n_dims;
  y->shape[0] = shape[0];
  y->shape[1] = n_dims == 2 ? shape[1] : 0;
  y->n_elems = n;
  memset(y->data, 0, n * sizeof(real));
  luaL_setmetatable(L, TENSOR_META);
  return y;
}

/* x:gather() → the whole tensor (Hugging Face shape, no padding) as a host copy, on every rank.
 * Collective over the world; a host copy gives itself. */
static int tensor_gather(lua_State *L)
{
  struct lua_tensor *x = totensor(L, 1);
  if (x->kind == KIND_HOST) {
    lua_settop(L, 1);
    return 1;
  }
  struct view v;
  resolve(L, 1, x, &v);
  struct trainer *t = v.t;
  const struct model_param *p = v.p;
  const struct model *m = &t->model;
  struct lua_tensor *y = new_host_tensor(L, p->name, p->n_dims, p->shape); /* Lua's memory: no leak on error */
  const int here = p->here && p->n_elems > 0;
  const int tp_split = p->tp_dim >= 0 && m->tp.size > 1;
  const size_t n_block = here ? p->n_elems : 0;
  char err[1024] = "";
  int rc = 0;
  /* this rank's block (its range of it when sharded; zeros elsewhere), then the stored tensor */
  real *block = here ? calloc(n_block ? n_block : 1, sizeof *block) : NULL;
  real *parts = here && tp_split ? malloc((size_t)m->tp.size * n_block * sizeof *parts) : NULL;
  real *stored = here && tp_split ? calloc((size_t)p->rows * (size_t)p->shape[1], sizeof *stored) : NULL;
  if (here && (!block || (tp_split && (!parts || !stored))))
    rc = errf(err, sizeof err, "out of memory gathering %s", p->name);
  if (!rc && v.count) {
    const size_t n_bytes = v.count * sizeof(real);
    char why[FAULT_MSG_MAX];
    const void *h = hostview_read(m->k, m->kctx, v.base, n_bytes, why, sizeof why);
    if (h) {
      memcpy(block + v.first, h, n_bytes);
      hostview_close(m->k, m->kctx, (void *)v.base, (void *)h, n_bytes, 0);
    } else {
      rc = errf(err, sizeof err, "reading %s: %s", p->name, why);
    }
  }
  rc = comm_agree_err(t->world, rc, err, sizeof err, COMM_AGREE_NAME_RANK_UNLESS_PLAN); /* nobody enters a collective alone */
  const int b = t->dp.layout.param_bucket[v.index], expert = t->dp.layout.buckets[b].expert;
  struct comm_group *dp = dp_bucket_group(&t->dp, b), *tp = m->tp.group, *pp = t->exec.group;
  if (!rc && here && v.sharded && dp && dp->size > 1 &&
      comm_all_reduce(dp, block, block, n_block, COMM_REAL, COMM_SUM, NULL))
    rc = errf(err, sizeof err, "gathering %s over %s: %s", p->name, expert ? "edp" : "dp", comm_error());
  if (!rc && here && tp_split) {
    if (comm_all_gather(tp, block, parts, n_block, COMM_REAL, NULL))
      rc = errf(err, sizeof err, "gathering %s over tp: %s", p->name, comm_error());
    for (int r = 0; !rc && r < m->tp.size; r++)
      model_param_put_block(p, m->tp.size, r, parts + (size_t)r * n_block, stored);
  }
  if (!rc && here) /* the padding rows are the last ones */
    memcpy(y->data, tp_split ? stored : block, y->n_elems * sizeof(real));
  /* an expert: from the ep rank holding it to the rest of its ep group (every ep group alike) */
  if (!rc && p->expert >= 0 && m->ep.size > 1 &&
      comm_broadcast(m->ep.group, y->data, y->n_elems, COMM_REAL,
                     p->expert / (m->config.moe.experts / m->ep.size), NULL))
    rc = errf(err, sizeof err, "gathering %s over ep: %s", p->name, comm_error());
  if (!rc && pp && pp->size > 1 &&
      comm_broadcast(pp, y->data, y->n_elems, COMM_REAL, holder_pp_rank(t->plan, p), NULL))
    rc = errf(err, sizeof err, "gathering %s over pp: %s", p->name, comm_error());
  free(block);
  free(parts);
  free(stored);
  if (comm_agree_err(t->world, rc, err, sizeof err, COMM_AGREE_NAME_RANK_UNLESS_PLAN))
    return luaL_error(L, "%s", err);
  return 1;
}

/* ---- fields --------------------------------------------------------------------------------- */

static void push_dims(lua_State *L, int n_dims, int64_t a, int64_t b)
{
  lua_createtable(L, n_dims, 0);
  lua_pushinteger(L, (lua_Integer)a);
  lua_rawseti(L, -2, 1);
  if (n_dims == 2) {
    lua_pushinteger(L, (lua_Integer)b);
    lua_rawseti(L, -2, 2);
  }
}

/* x.layout: where this rank's elements sit in the whole tensor (see the top of the file). */
static void push_layout(lua_State *L, const struct view *v)
{
  const struct model_param *p = v->p;
  const struct trainer *t = v->t;
  const struct model *m = &t->model;
  const int tp_split = p->tp_dim >= 0 && m->tp.size > 1;
  char text[512];
  size_t used = 0;
  lua_createtable(L, 0, 6);
  lua_pushboolean(L, p->here);
  lua_setfield(L, -2, "here");
  const int b = t->dp.layout.param_bucket[v->index], expert = t->dp.layout.buckets[b].expert;
  if (!p->here && p->expert >= 0 && m->ep.size > 1 && m->layer_here[p->layer]) {
    used += (size_t)snprintf(text + used, sizeof text - used, "another expert-parallel rank's expert (ep rank %d "
                             "of %d holds it)", p->expert / (m->config.moe.experts / m->ep.size), m->ep.size);
  } else if (!p->here) {
    used += (size_t)snprintf(text + used, sizeof text - used, "not on this pipeline rank (pp rank %d holds it)",
                             holder_pp_rank(t->plan, p));
  } else if (tp_split) {
    const int d = p->tp_dim;
    const int64_t of = d == 0 ? p->rows : p->shape[1];
    lua_createtable(L, 0, 7);
    lua_pushliteral(L, "tp");
    lua_setfield(L, -2, "group");
    lua_pushinteger(L, m->tp.rank);
    lua_setfield(L, -2, "rank");
    lua_pushinteger(L, m->tp.size);
    lua_setfield(L, -2, "size");
    lua_pushinteger(L, d + 1);
    lua_setfield(L, -2, "dim");
    lua_pushinteger(L, (lua_Integer)p->start[d] + 1);
    lua_setfield(L, -2, "start");
    lua_pushinteger(L, (lua_Integer)p->local[d]);
    lua_setfield(L, -2, "length");
    lua_pushinteger(L, (lua_Integer)of);
    lua_setfield(L, -2, "of");
    lua_setfield(L, -2, "tp");
    used += (size_t)snprintf(text + used, sizeof text - used, "%s %lld-%lld of %lld (tp rank %d of %d)",
                             d == 0 ? "rows" : "columns", (long long)p->start[d] + 1,
                             (long long)(p->start[d] + p->local[d]), (long long)of, m->tp.rank, m->tp.size);
  } else {
    used += (size_t)snprintf(text + used, sizeof text - used, "the whole tensor");
  }
  if (p->here && p->rows != p->shape[0] && used < sizeof text)
    used += (size_t)snprintf(text + used, sizeof text - used, " (%lld rows stored: the vocabulary padded)",
                             (long long)p->rows);
  if (p->here && v->sharded) {
    lua_createtable(L, 0, 7);
    lua_pushstring(L, expert ? "edp" : "dp");
    lua_setfield(L, -2, "group");
    lua_pushinteger(L, dp_bucket_rank(&t->dp, b));
    lua_setfield(L, -2, "rank");
    lua_pushinteger(L, dp_bucket_size(&t->dp, b));
    lua_setfield(L, -2, "size");
    lua_pushinteger(L, t->dp.zero);
    lua_setfield(L, -2, "stage");
    lua_pushinteger(L, (lua_Integer)v->first + 1);
    lua_setfield(L, -2, "first");
    lua_pushinteger(L, (lua_Integer)v->count);
    lua_setfield(L, -2, "count");
    lua_pushinteger(L, (lua_Integer)p->n_elems);
    lua_setfield(L, -2, "of");
    lua_setfield(L, -2, "zero");
    if (used < sizeof text) {
      if (v->count)
        used += (size_t)snprintf(text + used, sizeof text - used, "; elements %zu-%zu of its %zu (row-major): "
                                 "the ZeRO-%d shard of %s rank %d of %d", v->first + 1, v->first + v->count,
                                 p->n_elems, t->dp.zero, expert ? "edp" : "dp", dp_bucket_rank(&t->dp, b),
                                 dp_bucket_size(&t->dp, b));
      else
        used += (size_t)snprintf(text + used, sizeof text - used, "; none of its %zu elements: they are in "
                                 "other %s ranks' ZeRO-%d shards", p->n_elems, expert ? "edp" : "dp", t->dp.zero);
    }
  }
  /* the groups over which this rank's elements are copies of the same ones */
  lua_createtable(L, 2, 0);
  int n_rep = 0;
  if (p->here && p->tp_dim < 0 && m->tp.size > 1) {
    lua_pushliteral(L, "tp");
    lua_rawseti(L, -2, ++n_rep);
    if (used < sizeof text)
      used += (size_t)snprintf(text + used, sizeof text - used, "; replicated over tp (%d ranks)", m->tp.size);
  }
  if (p->here && !v->sharded && dp_bucket_size(&t->dp, b) > 1) {
    lua_pushstring(L, expert ? "edp" : "dp");
    lua_rawseti(L, -2, ++n_rep);
    if (used < sizeof text)
      used += (size_t)snprintf(text + used, sizeof text - used, "%s %s (%d ranks)", n_rep == 2 ? "," : "; replicated over",
                               expert ? "edp" : "dp", dp_bucket_size(&t->dp, b));
  }
  lua_setfield(L, -2, "replicated");
  lua_pushstring(L, text);
  lua_setfield(L, -2, "text");
}

static int tensor_len(lua_State *L)
{
  struct lua_tensor *x = totensor(L, 1);
  if (x->kind == KIND_HOST) {
    lua_pushinteger(L, (lua_Integer)x->n_elems);
    return 1;
  }
  struct view v;
  resolve(L, 1, x, &v);
  lua_pushinteger(L, (lua_Integer)v.count);
  return 1;
}

static int tensor_tostring(lua_State *L)
{
  struct lua_tensor *x = totensor(L, 1);
  char dims[64];
  if (x->kind == KIND_HOST) {
    snprintf(dims, sizeof dims, x->n_dims == 2 ? "%lld × %lld" : "%lld", (long long)x->shape[0], (long long)x->shape[1]);
    lua_pushfstring(L, "tensor %s (%s), a gathered host copy", x->name, dims);
    return 1;
  }
  lua_getiuservalue(L, 1, 1);
  struct lua_trainer *lt = luaL_testudata(L, -1, TRAINER_META);
  lua_pop(L, 1);
  if (!lt || !lt->t) {
    lua_pushfstring(L, "tensor %s %s (trainer closed)", kind_names[x->kind], x->name);
    return 1;
  }
  struct view v;
  resolve(L, 1, x, &v);
  push_layout(L, &v);
  lua_getfield(L, -1, "text");
  const struct model_param *p = v.p;
  snprintf(dims, sizeof dims, p->n_dims == 2 ? "%lld × %lld" : "%lld", (long long)p->shape[0], (long long)p->shape[1]);
  lua_pushfstring(L, "tensor %s %s (%s): %s", kind_names[x->kind], p->name, dims, lua_tostring(L, -1));
  return 1;
}

/* A tensor's fields (first, in tensor_index's order) and methods, each with its line of help: the
 * metatable's `methods`, `__fields` and `__help` are made from this one list (tycho_help.c). */
#define N_TENSOR_FIELDS 8
static const struct tycho_entry tensor_entries[] = {
  { "name", NULL, "x.name", "the Hugging Face name" },
  { "kind", NULL, "x.kind", "param, grad, exp_avg, exp_avg_sq, or host (a gathered copy)" },
  { "shape", NULL, "x.shape", "the global shape, {rows, cols} or {n}" },
  { "local_shape", NULL, "x.local_shape", "this rank's tp block as stored" },
  { "count", NULL, "x.count", "the elements this rank holds (also #x; x[i] is one, 1-based)" },
  { "layout", NULL, "x.layout", "how the tensor is split over tp and sharded by ZeRO; .text in words" },
  { "dtype", NULL, "x.dtype", "the element type" },
  { "device", NULL, "x.device", "the allocator's device" },
  { "norm", tensor_norm, "x:norm()", "the L2 norm of the elements this rank holds" },
  { "stats", tensor_stats, "x:stats()", "{ min, max, mean, std, count } of them" },
  { "table", tensor_table, "x:table()", "them as a Lua list" },
  { "gather", tensor_gather, "x:gather()", "the whole tensor on every rank, a host copy (collective)" },
  { "help", tycho_help, "x:help()", "this list" },
  { NULL, NULL, NULL, NULL },
};

/* x[i] (an integer: an element), then the fields name, kind, shape, local_shape, count, layout,
 * dtype, device, then the methods. */
static int tensor_index(lua_State *L)
{
  struct lua_tensor *x = totensor(L, 1);
  if (lua_isinteger(L, 2))
    return element(L, x, lua_tointeger(L, 2));
  const char *key = lua_tostring(L, 2);
  if (!key)
    return luaL_error(L, "a tensor is indexed by an integer (an element) or a field name");
  if (strcmp(key, "name") == 0) {
    lua_pushstring(L, x->name);
    return 1;
  }
  if (strcmp(key, "kind") == 0) {
    lua_pushstring(L, kind_names[x->kind]);
    return 1;
  }
  for (int i = 0; i < N_TENSOR_FIELDS - 2; i++) { /* shape .. device */
    if (strcmp(key, tensor_entries[i + 2].name) != 0)
      continue;
    if (x->kind == KIND_HOST) {
      switch (i) {
      case 0: case 1: push_dims(L, x->n_dims, x->shape[0], x->shape[1]); break;
      case 2: lua_pushinteger(L, (lua_Integer)x->n_elems); break;
      case 3:
        lua_createtable(L, 0, 2);
        lua_pushboolean(L, 1);
        lua_setfield(L, -2, "here");
        lua_pushliteral(L, "the whole tensor, a host copy (gathered)");
        lua_setfield(L, -2, "text");
        break;
      case 4: lua_pushstring(L, tensor_dtype_name(REAL_TENSOR_DTYPE)); break;
      default: lua_pushliteral(L, "host"); break;
      }
      return 1;
    }
    struct view v;
    resolve(L, 1, x, &v);
    const struct model_param *p = v.p;
    switch (i) {
    case 0: push_dims(L, p->n_dims, p->shape[0], p->shape[1]); break;
    case 1:
      if (p->n_dims == 2)
        push_dims(L, 2, p->local[0], p->local[1]);
      else
        push_dims(L, 1, p->here ? p->shape[0] : 0, 0);
      break;
    case 2: lua_pushinteger(L, (lua_Integer)v.count); break;
    case 3: push_layout(L, &v); break;
    case 4: lua_pushstring(L, tensor_dtype_name(p->dtype)); break;
    default: lua_pushstring(L, alloc_device_name(p->device) ? alloc_device_name(p->device) : "?"); break;
    }
    return 1;
  }
  lua_getfield(L, lua_upvalueindex(1), key);
  return 1;
}

static int tensor_newindex(lua_State *L)
{
  return luaL_error(L, "tensors are read-only");
}

void tycho_tensor_register(lua_State *L)
{
  luaL_newmetatable(L, TENSOR_META);
  tycho_entries_register(L, -1, tensor_entries, "a tensor x (x = t:param(name), t:grad(name), t:moment(name, k))");
  lua_pushcclosure(L, tensor_index, 1);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, tensor_newindex);
  lua_setfield(L, -2, "__newindex");
  lua_pushcfunction(L, tensor_len);
  lua_setfield(L, -2, "__len");
  lua_pushcfunction(L, tensor_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  luaL_newmetatable(L, STATS_META);
  lua_pushcfunction(L, stats_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
}
