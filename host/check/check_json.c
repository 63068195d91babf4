/* `tycho check --json`: the compiled plan as programs read it, one complete JSON document
 * (docs/check-json.md), from the same figures as the text (check.c, check_internal.h). */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh/mesh.h"
#include "plan/plan_json.h"
#include "check/check_ep.h"
#include "check/check_internal.h"
#include "comm/comm.h"
#include "check/cost.h"
#include "layout/tp_layout.h"
#include "layout/bill.h"
#include "kernels.h" /* attention_cp_rank_tokens */
#include "layout/supported.h"
#include "sched/sched.h"

static void write_tp_comms_json(struct json *j, const struct plan *p)
{
  int n;
  struct tp_comm *list = check_tp_comms(p, &n);
  /* the activations' element (a bf16 model's conversions move bf16); each entry's bytes are its own */
  const int eb = (int)traffic_wire_element_bytes(p);
  json_begin_object(j);
  json_key(j, "micro_batch"); json_int(j, p->batch.micro);
  json_key(j, "seq"); json_int(j, p->batch.seq);
  if (p->mesh.cp > 1) { /* the tokens of each sequence the list is for: cp rank 0's two chunks */
    json_key(j, "cp_rank_tokens"); json_int(j, attention_cp_rank_tokens(p->batch.seq, p->mesh.cp, 0));
  }
  json_key(j, "bytes_per_element"); json_int(j, eb);
  long long calls[2] = { 0, 0 }, bytes[2] = { 0, 0 };
  for (int i = 0; i < n; i++) {
    calls[list[i].backward]++;
    bytes[list[i].backward] += list[i].n_elems * (long long)traffic_tp_element_bytes(p, &list[i]);
  }
  static const char *const dir[2] = { "forward", "backward" };
  for (int d = 0; d < 2; d++) {
    json_key(j, dir[d]);
    json_begin_object(j);
    json_key(j, "calls"); json_int(j, calls[d]);
    json_key(j, "bytes"); json_int(j, bytes[d]);
    json_end_object(j);
  }
  json_key(j, "collectives");
  json_begin_array(j);
  for (int i = 0; i < n; i++) {
    json_begin_object(j);
    json_key(j, "layer");
    if (list[i].layer < 0)
      json_string(j, "embed");
    else if (list[i].layer >= p->model.n_layers)
      json_string(j, "head");
    else
      json_int(j, list[i].layer);
    json_key(j, "what"); json_string(j, list[i].what);
    json_key(j, "direction"); json_string(j, dir[list[i].backward]);
    json_key(j, "op"); json_string(j, check_comm_op_names[list[i].comm]);
    json_key(j, "elements"); json_int(j, list[i].n_elems);
    json_key(j, "element_bytes"); json_int(j, (long long)traffic_tp_element_bytes(p, &list[i]));
    json_key(j, "bytes"); json_int(j, list[i].n_elems * (long long)traffic_tp_element_bytes(p, &list[i]));
    json_end_object(j);
  }
  json_end_array(j);
  json_end_object(j);
  free(list);
}


static void write_states_json(struct json *j, const struct bill *b)
{
  json_key(j, "model_states");
  json_begin_object(j);
  for (int k = 0; k < 3; k++) {
    json_key(j, alloc_category_name(check_state_order[k]));
    json_int(j, (long long)b->held[check_state_order[k]]);
  }
  json_key(j, "total"); json_int(j, (long long)check_model_states_total(b));
  json_end_object(j);
  json_key(j, "transient");
  json_begin_object(j);
  for (int k = 0; k < 3; k++) {
    json_key(j, alloc_category_name(check_transient_order[k]));
    json_int(j, (long long)check_transient_bytes(b, check_transient_order[k]));
  }
  json_key(j, "total"); json_int(j, (long long)check_transient_total(b));
  json_end_object(j);
}

/* Under a pipeline rank's row of peaks, the same columns split: its model states, its transient
 * buffers (blank where a category has none of that kind). */

static void write_traffic_json(struct json *j, const struct plan *p)
{
  struct bill_shared sh;
  bill_shared_open(&sh, p);
  json_begin_array(j);
  for (int r = 0; r < p->mesh.pp; r++) {
    struct traffic t;
    char err[256];
    json_begin_object(j);
    json_key(j, "pp_rank"); json_int(j, r);
    if (traffic_predict_shared(p, &sh, r, &t, err, sizeof err)) {
      json_key(j, "error"); json_string(j, err);
      json_end_object(j);
      continue;
    }
    for (int g = 0; g < TRAFFIC_N_GROUPS; g++) {
      json_key(j, traffic_group_name(g));
      json_begin_object(j);
      for (int op = 0; op < TRAFFIC_N_OPS; op++) {
        if (!t.calls[g][op])
          continue;
        json_key(j, check_comm_names[op]);
        json_begin_object(j);
        json_key(j, "calls"); json_int(j, (long long)t.calls[g][op]);
        json_key(j, "bytes"); json_int(j, (long long)t.bytes[g][op]);
        json_end_object(j);
      }
      json_end_object(j);
    }
    json_end_object(j);
  }
  json_end_array(j);
  bill_shared_close(&sh);
}


static void write_memory_json(struct json *j, const struct plan *p, const struct bill *b)
{
  json_begin_object(j);
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++) {
    if (!check_bill_shows(p, k))
      continue;
    json_key(j, alloc_category_name(check_bill_order[k]));
    json_int(j, (long long)b->bytes[check_bill_order[k]]);
  }
  json_key(j, "total"); json_int(j, (long long)b->total);
  /* a plan on a device of its own: the part of each peak in host memory (bill.host), flat keys
   * (host_<category>), and the totals of each side; the device's part of a category is the
   * category's peak less its host_ */
  if (!plan_on_cpu(p)) {
    for (int k = 0; k < ALLOC_N_CATEGORIES; k++) {
      if (!check_bill_shows(p, k))
        continue;
      char key[48];
      snprintf(key, sizeof key, "host_%s", alloc_category_name(check_bill_order[k]));
      json_key(j, key);
      json_int(j, (long long)b->host[check_bill_order[k]]);
    }
    json_key(j, "host_total"); json_int(j, (long long)b->host_total);
    json_key(j, "device_total"); json_int(j, (long long)check_device_total(b));
  }
  json_end_object(j);
}

static void write_cost_json(struct json *j, const struct plan *p, const struct cluster *c)
{
  struct cost k;
  char err[512];
  json_begin_object(j);
  json_key(j, "cluster"); json_string(j, c->name);
  json_key(j, "cluster_file"); json_string(j, c->file);
  if (cost_predict(p, c, &k, err, sizeof err)) {
    json_key(j, "error"); json_string(j, err);
    json_end_object(j);
    return;
  }
  json_key(j, "step_seconds"); json_number(j, k.step);
  json_key(j, "tokens_per_second"); json_number(j, k.tokens_per_s);
  json_key(j, "mfu"); json_number(j, k.mfu);
  json_key(j, "compute_seconds"); json_number(j, k.compute);
  json_key(j, "bubble_seconds"); json_number(j, k.bubble);
  json_key(j, "pointwise_seconds"); json_number(j, k.pointwise);
  json_key(j, "optimizer_seconds"); json_number(j, k.optimizer);
  json_key(j, "ranks_per_device"); json_number(j, k.share);
  static const char *const names[5] = { "tp", "dp", "pp", "ep", "cp" };
  const struct cost_group *g[5] = { &k.tp, &k.dp, &k.pp, &k.ep, &k.cp };
  for (int i = 0; i < 5; i++) {
    json_key(j, names[i]);
    json_begin_object(j);
    json_key(j, "intra_node"); json_bool(j, g[i]->intra);
    json_key(j, "seconds"); json_number(j, g[i]->total);
    json_key(j, "exposed_seconds"); json_number(j, g[i]->exposed);
    json_key(j, "bytes_per_rank"); json_number(j, g[i]->bytes);
    json_end_object(j);
  }
  json_key(j, "model_flops"); json_number(j, k.model_flops);
  json_end_object(j);
}


void check_write_json(const struct plan *p, const struct cluster *cluster, struct strbuf *b)
{
  struct json j;
  json_init(&j, b);
  const struct plan_mesh *me = &p->mesh;
  char hash[32];
  snprintf(hash, sizeof hash, "%016llx", (unsigned long long)plan_hash(p));
  json_begin_object(&j);
  json_key(&j, "schema"); json_int(&j, 1);
  json_key(&j, "tycho_version"); json_string(&j, TYCHO_VERSION);
  json_key(&j, "plan_file"); json_string(&j, p->file);
  json_key(&j, "hash"); json_string(&j, hash);
  json_key(&j, "world"); json_int(&j, me->world);
  char note[320];
  json_key(&j, "runtime"); json_string(&j, plan_on_cpu(p) ? "cpu" : "cuda");
  json_key(&j, "runtime_note"); json_string(&j, check_runtime_note(p, note, sizeof note));
  json_key(&j, "plan");
  plan_json(p, &j);
  char refusal[1024];
  json_key(&j, "run_refusal");
  if (plan_on_cpu(p) && trainer_plan_supported(p, refusal, sizeof refusal))
    json_string(&j, refusal);
  else
    json_null(&j);

  struct sched sch;
  struct sched_sim sim;
  char err[512];
  json_key(&j, "schedule");
  if (sched_from_plan(p, &sch, err, sizeof err) == 0 && sched_simulate(&sch, &sim, err, sizeof err) == 0) {
    sched_json(&j, &sch, &sim);
    sched_sim_free(&sim);
  } else {
    json_begin_object(&j);
    json_key(&j, "error");
    json_string(&j, err);
    json_end_object(&j);
  }
  sched_free(&sch);

  json_key(&j, "tp_comm");
  write_tp_comms_json(&j, p);
  json_key(&j, "ep_all_to_all");
  check_ep_write_exchange_json(&j, p);
  json_key(&j, "traffic_per_step");
  write_traffic_json(&j, p);
  char berr[512];
  struct bill *bills = check_bills_of(p, 1, berr, sizeof berr);
  json_key(&j, "memory");
  json_begin_object(&j);
  if (!bills) {
    json_key(&j, "error"); json_string(&j, berr);
  } else {
    json_key(&j, "per_pp_rank");
    json_begin_array(&j);
    for (int r = 0; r < me->pp; r++) write_memory_json(&j, p, &bills[r]);
    json_end_array(&j);
    if (cluster) {
      double worst = 1.0;
      for (int r = 0; r < me->pp; r++) worst = fmin(worst, 1.0 - check_device_total(&bills[r]) / cluster->device_memory);
      json_key(&j, "device_memory"); json_number(&j, cluster->device_memory);
      json_key(&j, "fits"); json_bool(&j, worst >= 0);
      json_key(&j, "min_headroom"); json_number(&j, worst);
    }
  }
  json_end_object(&j);
  if (cluster) {
    json_key(&j, "cost");
    write_cost_json(&j, p, cluster);
  }

  json_key(&j, "groups");
  json_begin_object(&j);
  for (int ax = 0; ax < PLAN_N_AXES; ax++) {
    if (ax == PLAN_AXIS_CP && me->cp <= 1)
      continue; /* cp only where the plan has context parallelism */
    json_key(&j, plan_axis_name(ax));
    json_begin_array(&j);
    int size = mesh_axis_size(me, ax);
    int *members = malloc(sizeof(int) * (size_t)size);
    if (!members) {
      b->failed = 1;
      return;
    }
    for (int r = 0; r < me->world; r++) {
      int c[PLAN_N_AXES];
      mesh_coords(me, r, c);
      if (c[ax] != 0)
        continue; /* each group once, at its lowest rank */
      mesh_group_members(me, ax, r, members);
      json_begin_array(&j);
      for (int i = 0; i < size; i++)
        json_int(&j, members[i]);
      json_end_array(&j);
    }
    free(members);
    json_end_array(&j);
  }
  if (plan_ep(p) > 1) {
    json_key(&j, "ep");
    if (check_ep_write_groups_json(&j, p))
      b->failed = 1;
    json_key(&j, "edp");
    if (check_edp_write_groups_json(&j, p))
      b->failed = 1;
  }
  json_end_object(&j);
  int *ep_index = plan_ep(p) > 1 ? malloc(sizeof(int) * (size_t)me->world) : NULL;
  if (ep_index)
    check_ep_group_indices(me, plan_ep(p), ep_index);
  else if (plan_ep(p) > 1)
    b->failed = 1;

  /* the stages of each pipeline rank, in order (by_pp[at[r] .. at[r + 1])): a look-up per rank,
   * not a pass over every stage */
  int *at = calloc((size_t)me->pp + 2, sizeof *at);
  int *by_pp = malloc(sizeof(int) * (size_t)(p->n_stages > 0 ? p->n_stages : 1));
  if (!at || !by_pp) {
    free(at);
    free(by_pp);
    free(ep_index);
    free(bills);
    b->failed = 1;
    return;
  }
  for (int s = 0; s < p->n_stages; s++) at[p->stages[s].pp_rank + 2]++;
  for (int r = 0; r < me->pp; r++) at[r + 2] += at[r + 1];
  for (int s = 0; s < p->n_stages; s++) by_pp[at[p->stages[s].pp_rank + 1]++] = s;
  json_key(&j, "ranks");
  json_begin_array(&j);
  for (int r = 0; r < me->world; r++) {
    int c[PLAN_N_AXES];
    mesh_coords(me, r, c);
    json_begin_object(&j);
    json_key(&j, "rank"); json_int(&j, r);
    json_key(&j, "tp"); json_int(&j, c[PLAN_AXIS_TP]);
    json_key(&j, "dp"); json_int(&j, c[PLAN_AXIS_DP]);
    json_key(&j, "pp"); json_int(&j, c[PLAN_AXIS_PP]);
    if (me->cp > 1) {
      json_key(&j, "cp"); json_int(&j, c[PLAN_AXIS_CP]);
    }
    json_key(&j, "stages");
    json_begin_array(&j);
    for (int k = at[c[PLAN_AXIS_PP]]; k < at[c[PLAN_AXIS_PP] + 1]; k++)
      json_int(&j, by_pp[k]);
    json_end_array(&j);
    json_key(&j, "groups");
    json_begin_object(&j);
    for (int ax = 0; ax < PLAN_N_AXES; ax++) {
      if (ax == PLAN_AXIS_CP && me->cp <= 1)
        continue;
      json_key(&j, plan_axis_name(ax));
      json_int(&j, mesh_group_index(me, ax, r));
    }
    if (ep_index) {
      json_key(&j, "ep"); json_int(&j, ep_index[r]);
    }
    json_end_object(&j);
    if (bills) {
      json_key(&j, "memory");
      write_memory_json(&j, p, &bills[c[PLAN_AXIS_PP]]);
      write_states_json(&j, &bills[c[PLAN_AXIS_PP]]);
    }
    json_end_object(&j);
  }
  json_end_array(&j);
  json_end_object(&j);
  free(at);
  free(by_pp);
  free(ep_index);
  free(bills);
  sb_put(b, "\n", 1);
}
