/* The compiled plan's plumbing: lifetime, field locations for messages, names of the
 * enumerations, derived seeds and the parameter count. */
#define _POSIX_C_SOURCE 200809L
#include "plan.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fields.h"
#include "philox.h"
#include "util/hash.h"

void plan_init(struct plan *p)
{
  memset(p, 0, sizeof *p);
}

void plan_free(struct plan *p)
{
  free(p->stages);
  free(p->layers);
  free(p->locs);
  memset(p, 0, sizeof *p);
}

int plan_copy(struct plan *dst, const struct plan *src)
{
  *dst = *src;
  dst->stages = NULL;
  dst->layers = NULL;
  dst->locs = NULL;
  const size_t n_layers = src->layers ? (size_t)src->model.n_layers : 0;
  const size_t n_stages = src->stages ? (size_t)src->n_stages : 0, n_locs = src->locs ? (size_t)src->n_locs : 0;
  if ((n_stages && !(dst->stages = malloc(n_stages * sizeof *dst->stages))) ||
      (n_layers && !(dst->layers = malloc(n_layers * sizeof *dst->layers))) ||
      (n_locs && !(dst->locs = malloc(n_locs * sizeof *dst->locs)))) {
    plan_free(dst);
    return -1;
  }
  if (n_stages)
    memcpy(dst->stages, src->stages, n_stages * sizeof *dst->stages);
  if (n_layers)
    memcpy(dst->layers, src->layers, n_layers * sizeof *dst->layers);
  if (n_locs)
    memcpy(dst->locs, src->locs, n_locs * sizeof *dst->locs);
  dst->cap_locs = dst->n_locs = (int)n_locs;
  return 0;
}

int plan_set_loc(struct plan *p, const char *path, const char *where)
{
  for (int i = 0; i < p->n_locs; i++)
    if (strcmp(p->locs[i].path, path) == 0) {
      snprintf(p->locs[i].where, sizeof p->locs[i].where, "%s", where);
      return 0;
    }
  if (p->n_locs == p->cap_locs) {
    int cap = p->cap_locs ? 2 * p->cap_locs : 64;
    struct plan_loc *locs = realloc(p->locs, (size_t)cap * sizeof *locs);
    if (!locs)
      return -1;
    p->locs = locs;
    p->cap_locs = cap;
  }
  struct plan_loc *l = &p->locs[p->n_locs++];
  snprintf(l->path, sizeof l->path, "%s", path);
  snprintf(l->where, sizeof l->where, "%s", where);
  return 0;
}

const char *plan_where(const struct plan *p, const char *path)
{
  char prefix[96];
  snprintf(prefix, sizeof prefix, "%s", path);
  for (;;) {
    for (int i = 0; i < p->n_locs; i++)
      if (strcmp(p->locs[i].path, prefix) == 0)
        return p->locs[i].where;
    char *dot = strrchr(prefix, '.');
    if (!dot)
      break;
    *dot = 0;
  }
  for (int i = 0; i < p->n_locs; i++)
    if (strcmp(p->locs[i].path, "") == 0)
      return p->locs[i].where;
  return p->file[0] ? p->file : "plan";
}

const char *plan_module_name(enum plan_module m)
{
  static const char *const names[] = { "embed", "q", "k", "v", "o", "gate", "up", "down", "head" };
  return (unsigned)m < PLAN_N_MODULES ? names[m] : "?";
}

const char *plan_split_name(enum plan_split s)
{
  static const char *const names[] = { "replicate", "column", "row", "vocab" };
  return (unsigned)s < 4 ? names[s] : "?";
}

const char *plan_schedule_name(enum plan_schedule s)
{
  static const char *const names[] = { "gpipe", "1f1b", "interleaved", "zb-h1" };
  return (unsigned)s < 4 ? names[s] : "?";
}

const char *plan_zero_every_name(enum plan_zero_every e)
{
  static const char *const names[] = { "micro_batch", "step" };
  return (unsigned)e < 2 ? names[e] : "?";
}

const char *plan_dtype_name(enum plan_dtype d)
{
  static const char *const names[] = { "fp32", "bf16", "fp16" };
  return (unsigned)d < 3 ? names[d] : "?";
}

const char *plan_decay_name(enum plan_decay d)
{
  static const char *const names[] = { "constant", "cosine", "linear" };
  return (unsigned)d < 3 ? names[d] : "?";
}

const char *plan_axis_name(enum plan_axis a)
{
  static const char *const names[] = { "tp", "dp", "pp", "cp" };
  return (unsigned)a < PLAN_N_AXES ? names[a] : "?";
}

const char *plan_mesh_order_text(const struct plan_mesh *m, char *buf, size_t n)
{
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < PLAN_N_AXES && used < n; i++)
    if (m->order[i] != PLAN_AXIS_CP || m->cp > 1)
      used += (size_t)snprintf(buf + used, n - used, "%s%s", used ? ", " : "", plan_axis_name(m->order[i]));
  return buf;
}

const char *plan_seed_name(enum plan_seed s)
{
  static const char *const names[] = { "model", "data", "dropout" };
  return (unsigned)s < PLAN_N_SEEDS ? names[s] : "?";
}

const char *plan_device_name(enum plan_device d)
{
  static const char *const names[] = { "auto", "cpu", "cuda" };
  return (unsigned)d < 3 ? names[d] : "?";
}

const char *plan_comm_name(enum plan_comm c)
{
  static const char *const names[] = { "auto", "staged", "mpi", "nccl" };
  return (unsigned)c < 4 ? names[c] : "?";
}

int plan_on_cpu(const struct plan *p)
{
  return p->device != PLAN_DEVICE_CUDA; /* auto as written; the trainer resolves it at open */
}

/* The fields a resume compares are the plan-field table's EQUAL and PARENT rows (fields.h),
 * named by their resume_index. */
static const struct plan_field *resume_row(int i)
{
  for (int k = 0; i >= 0 && i < PLAN_N_RESUME_NAMES && k < plan_n_fields; k++)
    if (plan_fields[k].resume_index == i &&
        (plan_fields[k].resume == PLAN_RESUME_EQUAL || plan_fields[k].resume == PLAN_RESUME_PARENT))
      return &plan_fields[k];
  return NULL;
}

const char *plan_resume_field_name(int i)
{
  const struct plan_field *f = resume_row(i);
  return f ? f->path : NULL;
}

int plan_resume_field(const struct plan *p, int i, char *buf, size_t n)
{
  const struct plan_field *f = resume_row(i);
  if (!f) {
    snprintf(buf, n, "?");
    return -1;
  }
  plan_field_text(f, p, buf, n);
  if (f->derived_at < 0 || !*(const int *)((const char *)p + f->derived_at))
    return -1;
  const struct plan_field *parent = plan_field_find(f->follows);
  return parent ? parent->resume_index : -1;
}

const char *plan_recompute_part_name(int bit_index)
{
  static const char *const names[] = { "attn_norm", "attn_core", "attn", "mlp_norm", "mlp_act", "mlp" };
  return bit_index >= 0 && bit_index < PLAN_RC_N_PARTS ? names[bit_index] : "?";
}

const char *plan_recompute_text(uint8_t mask, char *buf, size_t n)
{
  if (mask == 0) {
    snprintf(buf, n, "none");
  } else if (mask == PLAN_RC_FULL) {
    snprintf(buf, n, "full");
  } else {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < PLAN_RC_N_PARTS; i++)
      if (mask & (1 << i)) {
        int w = snprintf(buf + used, n - used, "%s%s", used ? "," : "", plan_recompute_part_name(i));
        if (w < 0 || (size_t)w >= n - used)
          break;
        used += (size_t)w;
      }
  }
  return buf;
}

long long plan_derive_seed(long long global, const char *purpose)
{
  uint64_t h = hash_fnv1a64(purpose);
  uint64_t g = (uint64_t)global;
  uint32_t key[2] = { (uint32_t)g, (uint32_t)(g >> 32) };
  uint32_t ctr[4] = { (uint32_t)h, (uint32_t)(h >> 32), 0x5eed5eedu, 0 };
  uint32_t out[4];
  philox4x32_10(ctr, key, out);
  uint64_t v = ((uint64_t)out[1] << 32) | out[0];
  return (long long)(v & ((1ull << 53) - 1));
}

struct plan_layer_flops plan_layer_flops(const struct plan *p)
{
  const struct plan_model *m = &p->model;
  double C = m->dim, HS = m->head_dim, F = m->ffn_dim, T = p->batch.seq;
  struct plan_layer_flops lf;
  lf.attn_proj = 2.0 * C * (m->n_heads + 2.0 * m->n_kv_heads) * HS + 2.0 * m->n_heads * HS * C;
  lf.attn_core = 2.0 * T * m->n_heads * HS;
  lf.mlp = 6.0 * C * F;
  return lf;
}

/* A sparse layer's MLP: the router (C → experts) and the top_k experts each token goes to. */
static double sparse_mlp_flops(const struct plan_model *m)
{
  return 2.0 * m->dim * m->moe.experts + m->moe.top_k * 6.0 * m->dim * m->moe.ffn_dim;
}

static int layer_is_sparse(const struct plan *p, int l)
{
  return p->model.moe.experts > 0 && p->layers && l >= 0 && l < p->model.n_layers && p->layers[l].moe;
}

struct plan_layer_flops plan_layer_flops_of(const struct plan *p, int l)
{
  struct plan_layer_flops lf = plan_layer_flops(p);
  if (layer_is_sparse(p, l))
    lf.mlp = sparse_mlp_flops(&p->model);
  return lf;
}

double plan_model_flops(const struct plan *p)
{
  const struct plan_layer_flops lf = plan_layer_flops(p);
  const int L = p->model.n_layers, sparse = p->model.moe.experts > 0 ? p->model.moe.n_layers : 0;
  const double dense = lf.attn_proj + lf.attn_core + lf.mlp;
  if (!sparse)
    return L * dense + plan_head_flops(p);
  return (L - sparse) * dense + sparse * (lf.attn_proj + lf.attn_core + sparse_mlp_flops(&p->model)) +
         plan_head_flops(p);
}

double plan_recompute_flops(const struct plan_layer_flops *lf, uint8_t mask)
{
  double f = 0;
  if (mask & PLAN_RC_ATTN)
    f += lf->attn_proj + lf->attn_core;
  else if (mask & PLAN_RC_ATTN_CORE)
    f += lf->attn_core;
  if (mask & PLAN_RC_MLP)
    f += lf->mlp;
  return f;
}

struct plan_stage_flops plan_stage_flops(const struct plan *p, int s)
{
  const struct plan_stage *st = &p->stages[s];
  const struct plan_layer_flops dense = plan_layer_flops(p);
  int n_sparse = 0;
  struct plan_stage_flops f = { 0.0, 0.0 };
  for (int l = st->first_layer; st->first_layer >= 0 && l < st->first_layer + st->n_layers; l++) {
    const struct plan_layer_flops lf = plan_layer_flops_of(p, l);
    n_sparse += layer_is_sparse(p, l);
    f.recompute += plan_recompute_flops(&lf, p->layers ? p->layers[l].recompute : 0);
  }
  /* a sparse MLP is whole on every tp rank (plan_validate): the tp group computes it tp times */
  const double sparse_layer = dense.attn_proj + dense.attn_core +
                              (n_sparse ? sparse_mlp_flops(&p->model) * p->mesh.tp : 0.0);
  f.forward = (st->n_layers - n_sparse) * (dense.attn_proj + dense.attn_core + dense.mlp) + n_sparse * sparse_layer;
  if (st->has_head)
    f.forward += plan_head_flops(p);
  return f;
}

double plan_stage_micro_batch_flops(const struct plan *p, int s, int backward)
{
  const struct plan_stage_flops f = plan_stage_flops(p, s);
  const double tokens = (double)p->batch.micro * p->batch.seq / p->mesh.tp;
  return tokens * (backward ? 2.0 * f.forward + f.recompute : f.forward);
}

double plan_dtype_bytes(enum plan_dtype d)
{
  return d == PLAN_FP32 ? 4.0 : 2.0;
}

double plan_head_flops(const struct plan *p)
{
  return 2.0 * p->model.dim * (double)p->model.vocab;
}

/* The model's parameters, with all of each sparse layer's experts (all_experts) or the top_k
 * that one token's forward multiplies by. */
static long long param_count(const struct plan *p, int all_experts)
{
  const struct plan_model *m = &p->model;
  long long C = m->dim, F = m->ffn_dim, HS = m->head_dim;
  long long Vp = m->vocab_padded ? m->vocab_padded : m->vocab;
  long long attn_norms = C * (m->n_heads * HS)        /* q */
                         + 2 * C * (m->n_kv_heads * HS) /* k, v */
                         + (m->n_heads * HS) * C        /* o */
                         + 2 * C;                       /* two RMSNorm gains */
  long long dense_mlp = 3 * C * F;                      /* gate, up, down */
  long long sparse = m->moe.experts > 0 ? m->moe.n_layers : 0;
  long long experts = all_experts ? m->moe.experts : m->moe.top_k;
  long long sparse_mlp = C * m->moe.experts                 /* the router */
                         + experts * 3 * C * m->moe.ffn_dim; /* each expert's w1, w3, w2 */
  long long total = attn_norms * m->n_layers + dense_mlp * (m->n_layers - sparse) + sparse_mlp * sparse +
                    Vp * C /* embedding */ + C /* final norm */;
  if (!m->tie_embeddings)
    total += Vp * C;
  return total;
}

long long plan_param_count(const struct plan *p)
{
  return param_count(p, 1);
}

long long plan_active_param_count(const struct plan *p)
{
  return param_count(p, 0);
}

int plan_moe_capacity(const struct plan_model *m, int T)
{
  if (m->moe.experts <= 0 || m->moe.capacity_factor <= 0)
    return 0;
  double c = ceil(m->moe.capacity_factor * T * m->moe.top_k / m->moe.experts - 1e-9);
  return c >= T ? T : c < 1 ? 1 : (int)c;
}

struct plan_ep_exchange plan_ep_exchange(const struct plan *p)
{
  struct plan_ep_exchange x;
  memset(&x, 0, sizeof x);
  const struct plan_model *m = &p->model;
  const int ep = plan_ep(p);
  if (ep <= 1 || m->moe.experts <= 0)
    return x;
  const long long micro = p->batch.micro, seq = p->batch.seq, C = m->dim;
  const int cap = plan_moe_capacity(m, p->batch.seq);
  x.row_calls = 4;
  x.padded = cap > 0;
  if (cap > 0) { /* to each of ep peers experts / ep experts × micro × cap rows */
    x.row_elems = (long long)m->moe.experts * micro * cap * C;
  } else {
    x.row_elems = micro * seq * m->moe.top_k * C;
    x.count_calls = 1;
    x.count_bytes = 4LL * m->moe.experts; /* the runtime's counts are int32, experts / ep per peer */
  }
  return x;
}

void plan_ep_step_traffic(const struct plan *p, int pp_rank, double elem_bytes, unsigned long long *calls,
                          unsigned long long *bytes)
{
  *calls = *bytes = 0;
  const struct plan_ep_exchange x = plan_ep_exchange(p);
  if (x.row_calls == 0)
    return;
  unsigned long long sparse = 0; /* sparse layers on this pipeline rank's stages */
  for (int s = 0; s < p->n_stages; s++) {
    const struct plan_stage *st = &p->stages[s];
    if (st->pp_rank != pp_rank || st->first_layer < 0)
      continue;
    for (int l = st->first_layer; l < st->first_layer + st->n_layers; l++) sparse += p->layers[l].moe;
  }
  const unsigned long long per = sparse * (unsigned long long)p->batch.microbatches;
  *calls = per * (unsigned long long)(x.row_calls + x.count_calls);
  *bytes = per * ((unsigned long long)x.row_calls * (unsigned long long)x.row_elems *
                  (unsigned long long)elem_bytes + (unsigned long long)x.count_bytes);
}
