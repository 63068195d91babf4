/* `tycho check`'s expert-parallel parts (check_ep.h). The figures come from plan_ep_exchange
 * (host/plan/plan.h), the one count of what the runtime's all-to-alls send, with the element size
 * the comm layer moves (traffic_element_bytes), so the text, the JSON, the step's traffic and the
 * cost model say the same numbers. */
#include "check/check_ep.h"

#include <stdlib.h>
#include <string.h>

#include "mesh/mesh.h"
#include "layout/bill.h"

int check_ep_members(const struct plan_mesh *m, int rank, int *members)
{
  const int ep = m->ep > 1 ? m->ep : 1;
  int c[PLAN_N_AXES];
  mesh_coords(m, rank, c);
  const int first = c[PLAN_AXIS_DP] / ep * ep;
  for (int i = 0; i < ep; i++) {
    c[PLAN_AXIS_DP] = first + i;
    members[i] = mesh_rank(m, c);
  }
  return ep;
}

int check_edp_members(const struct plan_mesh *m, int rank, int *members)
{
  const int ep = m->ep > 1 ? m->ep : 1, n = m->dp / ep;
  int c[PLAN_N_AXES];
  mesh_coords(m, rank, c);
  const int first = c[PLAN_AXIS_DP] % ep;
  for (int i = 0; i < n; i++) {
    c[PLAN_AXIS_DP] = first + i * ep;
    members[i] = mesh_rank(m, c);
  }
  return n;
}

void check_ep_group_indices(const struct plan_mesh *m, int ep, int *index)
{
  /* a group's lowest rank is its member of dp coordinate q·ep (ranks grow with the dp coordinate) */
  int next = 0, c[PLAN_N_AXES];
  for (int r = 0; r < m->world; r++) {
    mesh_coords(m, r, c);
    if (c[PLAN_AXIS_DP] % ep == 0)
      index[r] = next++;
  }
  for (int r = 0; r < m->world; r++) {
    mesh_coords(m, r, c);
    const int lowest_dp = c[PLAN_AXIS_DP] / ep * ep;
    c[PLAN_AXIS_DP] = lowest_dp;
    index[r] = index[mesh_rank(m, c)];
  }
}

/* "{0..7}", "{0, 2, 4, 6}" or "{0, 8, ..., 56}", as check.c writes the other groups. */
static const char *members_text(const int *members, int n, char *buf, size_t size)
{
  if (n > 2 && members[n - 1] - members[0] == n - 1) {
    snprintf(buf, size, "{%d..%d}", members[0], members[n - 1]);
    return buf;
  }
  if (n > 8) {
    snprintf(buf, size, "{%d, %d, ..., %d}", members[0], members[1], members[n - 1]);
    return buf;
  }
  size_t used = (size_t)snprintf(buf, size, "{");
  for (int i = 0; i < n && used < size; i++)
    used += (size_t)snprintf(buf + used, size - used, "%s%d", i ? ", " : "", members[i]);
  if (used < size)
    snprintf(buf + used, size - used, "}");
  return buf;
}

void check_ep_print_groups(FILE *f, const struct plan *p)
{
  const struct plan_mesh *me = &p->mesh;
  const int ep = plan_ep(p);
  if (ep == 1)
    return;
  int *members = malloc(sizeof(int) * (size_t)ep);
  if (!members)
    return;
  char buf[160];
  check_ep_members(me, 0, members);
  fprintf(f, "           ep groups: %d of %d ranks, e.g. %s: ep consecutive dp ranks of each dp group (ep rank "
          "= dp %% %d); each holds %d of the %d experts of every sparse layer\n", me->world / ep, ep,
          members_text(members, ep, buf, sizeof buf), ep, p->model.moe.experts / ep, p->model.moe.experts);
  free(members);
  const int n = me->dp / ep;
  if (!(members = malloc(sizeof(int) * (size_t)n)))
    return;
  check_edp_members(me, 0, members);
  fprintf(f, "           edp groups: %d of %d rank%s, e.g. %s: the dp ranks holding the same experts (dp %% %d equal); "
          "the experts' gradients reduce there%s\n", me->world / n, n, n == 1 ? "" : "s",
          members_text(members, n, buf, sizeof buf), ep, p->zero > 0 ? " and ZeRO shards their state there" : "");
  free(members);
}

/* The sparse layers as "layers 0-31" or "layers 1, 3". */
static const char *sparse_layers_text(const struct plan *p, char *buf, size_t size)
{
  const int L = p->model.n_layers;
  size_t used = (size_t)snprintf(buf, size, "layer%s ", p->model.moe.n_layers == 1 ? "" : "s");
  int first = 1;
  for (int l = 0; l < L && used + 24 < size;) {
    if (!p->layers[l].moe) {
      l++;
      continue;
    }
    int e = l;
    while (e + 1 < L && p->layers[e + 1].moe) e++;
    if (e > l)
      used += (size_t)snprintf(buf + used, size - used, "%s%d-%d", first ? "" : ", ", l, e);
    else
      used += (size_t)snprintf(buf + used, size - used, "%s%d", first ? "" : ", ", l);
    first = 0;
    l = e + 1;
  }
  return buf;
}

static const char *const exact_capacity = "exact";
static const char *const exact_dropless = "exact in total; per-peer split follows the routing";
/* dropless: which of the four row exchanges send what the rank received (the routing's share) */
static const char *const received_note = "the rows this rank received: their mean over the group";

void check_ep_print_exchange(FILE *f, const struct plan *p)
{
  const struct plan_ep_exchange x = plan_ep_exchange(p);
  if (x.row_calls == 0)
    return;
  const struct plan_model *m = &p->model;
  const int ep = plan_ep(p), eb = (int)traffic_wire_element_bytes(p);
  const int cap = plan_moe_capacity(m, p->batch.seq);
  const double row_bytes = (double)x.row_elems * eb;
  char layers[256], v[32], what[192];
  fprintf(f, "all-to-all per sparse layer and micro-batch of %d × %d tokens on each ep group of %d ranks, from each "
          "rank (%d-byte elements, its own block included):\n", p->batch.micro, p->batch.seq, ep, eb);
  if (x.padded)
    snprintf(what, sizeof what, "%d experts × %d sequences × capacity %d rows × dim %d, padded", m->moe.experts,
             p->batch.micro, cap, m->dim);
  else
    snprintf(what, sizeof what, "%d × %d tokens × top %d rows × dim %d, wherever they go", p->batch.micro,
             p->batch.seq, m->moe.top_k, m->dim);
  static const char *const names[4][2] = { { "fwd", "dispatch" }, { "fwd", "combine" },
                                           { "bwd", "combine's dual" }, { "bwd", "dispatch's dual" } };
  sparse_layers_text(p, layers, sizeof layers);
  strncat(layers, ", each", sizeof layers - strlen(layers) - 1);
  int first = 1;
  if (x.count_calls) {
    fprintf(f, "           %-17s fwd  %-16s %10s  one int32 per expert of each ep peer\n", layers, "count exchange",
            check_format_bytes((double)x.count_bytes, v, sizeof v));
    first = 0;
  }
  for (int i = 0; i < x.row_calls; i++) {
    fprintf(f, "           %-17s %s  %-16s %10s%s%s\n", first ? layers : "", names[i][0], names[i][1],
            check_format_bytes(row_bytes, v, sizeof v), i == 0 || (!x.padded && i != 2) ? "  " : "",
            i == 0 ? what : !x.padded && i != 2 ? received_note : "");
    first = 0;
  }
  fprintf(f, "           %d all-to-all calls, %s per sparse layer and micro-batch: %s\n", x.row_calls + x.count_calls,
          check_format_bytes(x.row_calls * row_bytes + (double)x.count_bytes, v, sizeof v),
          x.padded ? exact_capacity : exact_dropless);
}

void check_ep_write_exchange_json(struct json *j, const struct plan *p)
{
  const struct plan_ep_exchange x = plan_ep_exchange(p);
  if (x.row_calls == 0) {
    json_null(j);
    return;
  }
  const long long eb = (long long)traffic_wire_element_bytes(p);
  const long long per_layer = x.row_calls * x.row_elems * eb + x.count_bytes;
  json_begin_object(j);
  json_key(j, "ep"); json_int(j, plan_ep(p));
  json_key(j, "micro_batch"); json_int(j, p->batch.micro);
  json_key(j, "seq"); json_int(j, p->batch.seq);
  json_key(j, "bytes_per_element"); json_int(j, eb);
  json_key(j, "capacity"); json_int(j, plan_moe_capacity(&p->model, p->batch.seq));
  json_key(j, "exact"); json_string(j, x.padded ? exact_capacity : exact_dropless);
  json_key(j, "count_exchange");
  json_begin_object(j);
  json_key(j, "calls"); json_int(j, x.count_calls);
  json_key(j, "bytes"); json_int(j, x.count_bytes);
  json_end_object(j);
  json_key(j, "rows");
  json_begin_object(j);
  json_key(j, "calls"); json_int(j, x.row_calls);
  json_key(j, "elements_each"); json_int(j, x.row_elems);
  json_key(j, "bytes_each"); json_int(j, x.row_elems * eb);
  json_end_object(j);
  json_key(j, "layers");
  json_begin_array(j);
  for (int l = 0; l < p->model.n_layers; l++) {
    if (!p->layers[l].moe)
      continue;
    json_begin_object(j);
    json_key(j, "layer"); json_int(j, l);
    json_key(j, "stage"); json_int(j, p->layers[l].stage);
    json_key(j, "calls"); json_int(j, x.row_calls + x.count_calls);
    json_key(j, "bytes"); json_int(j, per_layer);
    json_end_object(j);
  }
  json_end_array(j);
  json_end_object(j);
}

/* Every group once, at its lowest rank (dp coordinate `lowest` says which are), members by
 * members_of (n of them). 0, or -1 out of memory. */
static int write_groups_json(struct json *j, const struct plan_mesh *me, int n, int (*lowest)(int dp, int ep),
                             int (*members_of)(const struct plan_mesh *, int, int *))
{
  const int ep = me->ep > 1 ? me->ep : 1;
  int *members = malloc(sizeof(int) * (size_t)n), c[PLAN_N_AXES];
  if (!members)
    return -1;
  json_begin_array(j);
  for (int r = 0; r < me->world; r++) {
    mesh_coords(me, r, c);
    if (!lowest(c[PLAN_AXIS_DP], ep))
      continue;
    members_of(me, r, members);
    json_begin_array(j);
    for (int i = 0; i < n; i++) json_int(j, members[i]);
    json_end_array(j);
  }
  json_end_array(j);
  free(members);
  return 0;
}

static int lowest_of_ep(int dp, int ep) { return dp % ep == 0; }  /* q·ep */
static int lowest_of_edp(int dp, int ep) { return dp < ep; }      /* 0 .. ep − 1 */

int check_edp_write_groups_json(struct json *j, const struct plan *p)
{
  return write_groups_json(j, &p->mesh, p->mesh.dp / plan_ep(p), lowest_of_edp, check_edp_members);
}

int check_ep_write_groups_json(struct json *j, const struct plan *p)
{
  return write_groups_json(j, &p->mesh, plan_ep(p), lowest_of_ep, check_ep_members);
}
