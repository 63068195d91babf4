/* `tycho check`: the compiled plan as people read it (a compact summary that stays short for
 * thousands of ranks) and as programs read it (one complete JSON document, docs/check-json.md).
 * Later stages (layout, schedule, cost) add their sections here. This file holds the text and the
 * figures both forms show (check_internal.h); check_json.c writes the JSON document. */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mesh/mesh.h"
#include "util/err.h"
#include "plan/plan_json.h"
#include "check/check_ep.h"
#include "check/check_internal.h"
#include "check/check_zb.h"
#include "comm/comm.h"
#include "data/text_cache.h"
#include "check/cost.h"
#include "layout/tp_layout.h"
#include "layout/bill.h"
#include "kernels.h" /* attention_cp_rank_tokens */
#include "layout/supported.h"
#include "sched/sched.h"
#include "util/devices.h"

static const char *group_text(const struct plan_mesh *m, enum plan_axis a, int rank, char *buf, size_t n)
{
  int members[64];
  int size = mesh_axis_size(m, a);
  int shown = size < 64 ? size : 64;
  int coord[PLAN_N_AXES];
  mesh_coords(m, rank, coord);
  for (int i = 0; i < shown; i++) {
    coord[a] = i;
    members[i] = mesh_rank(m, coord);
  }
  size_t used = 0;
  buf[0] = 0;
  int contiguous = size > 2 && members[shown - 1] - members[0] == shown - 1;
  if (contiguous || size > 8) {
    int stride = mesh_axis_stride(m, a);
    snprintf(buf, n, "{%d, %d, ..., %d}", members[0], members[0] + stride,
             members[0] + stride * (size - 1));
    if (contiguous)
      snprintf(buf, n, "{%d..%d}", members[0], members[0] + size - 1);
    return buf;
  }
  used += (size_t)snprintf(buf, n, "{");
  for (int i = 0; i < shown && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, "%s%d", i ? ", " : "", members[i]);
  if (used < n)
    snprintf(buf + used, n - used, "}");
  return buf;
}

static const char *stage_list(const struct plan *p, int rank, char *buf, size_t n)
{
  int coord[PLAN_N_AXES];
  mesh_coords(&p->mesh, rank, coord);
  size_t used = 0;
  buf[0] = 0;
  for (int s = 0; s < p->n_stages && used < n; s++)
    if (p->stages[s].pp_rank == coord[PLAN_AXIS_PP])
      used += (size_t)snprintf(buf + used, n - used, "%s%d", used ? "," : "", s);
  return buf;
}

static void print_rank_row(FILE *f, const struct plan *p, int rank)
{
  int c[PLAN_N_AXES];
  char stages[256];
  mesh_coords(&p->mesh, rank, c);
  if (p->mesh.cp > 1)
    fprintf(f, "  %8d %5d %5d %5d %5d   %s\n", rank, c[PLAN_AXIS_TP], c[PLAN_AXIS_CP], c[PLAN_AXIS_DP],
            c[PLAN_AXIS_PP], stage_list(p, rank, stages, sizeof stages));
  else
    fprintf(f, "  %8d %5d %5d %5d   %s\n", rank, c[PLAN_AXIS_TP], c[PLAN_AXIS_DP], c[PLAN_AXIS_PP],
            stage_list(p, rank, stages, sizeof stages));
}

/* Long per-rank and per-stage tables show their first and last rows only (the rank table's rule,
 * which the others follow), so the text stays short and is computed for the rows it shows. */
enum { ROWS_ALL = 16, ROWS_HEAD = 8, ROWS_TAIL = 4 };

static int row_shown(int i, int n)
{
  return n <= ROWS_ALL || i < ROWS_HEAD || i >= n - ROWS_TAIL;
}

static void print_layer_runs(FILE *f, const struct plan *p, int what /* 0 split, 1 recompute */,
                             const char *label)
{
  int L = p->model.n_layers;
  for (int l = 0; l < L;) {
    int e = l + 1;
    while (e < L && (what ? p->layers[e].recompute == p->layers[l].recompute
                          : memcmp(p->layers[e].split, p->layers[l].split, sizeof p->layers[l].split) == 0))
      e++;
    char range[48];
    if (e - 1 > l)
      snprintf(range, sizeof range, "layers %d-%d", l, e - 1);
    else
      snprintf(range, sizeof range, "layer %d", l);
    fprintf(f, "%-11s%-15s", l == 0 ? label : "", range);
    if (what) {
      char rc[96];
      fprintf(f, "%s\n", plan_recompute_text(p->layers[l].recompute, rc, sizeof rc));
    } else {
      for (int m = PLAN_LAYER_MOD_FIRST; m <= PLAN_LAYER_MOD_LAST; m++)
        fprintf(f, "%s%s %s", m == PLAN_LAYER_MOD_FIRST ? "" : ", ", plan_module_name(m),
                plan_split_name(p->layers[l].split[m]));
      fputc('\n', f);
    }
    l = e;
  }
}

/* One step of the pipeline schedule as a per-rank timeline, simulated with the plan's costs. */
static void print_schedule(FILE *f, const struct plan *p)
{
  struct sched s;
  struct sched_sim sim;
  char err[512];
  if (sched_from_plan(p, &s, err, sizeof err) != 0) {
    fprintf(f, "           (no schedule: %s)\n", err);
    sched_free(&s);
    return;
  }
  if (sched_simulate(&s, &sim, err, sizeof err) != 0) {
    fprintf(f, "           (schedule does not simulate: %s)\n", err);
  } else {
    if (p->mesh.pp > 1)
      sched_print_timeline(f, &s, &sim, 0);
    sched_sim_free(&sim);
  }
  sched_free(&s);
}

const char *const check_comm_op_names[] = { "all-reduce", "all-gather", "reduce-scatter" };

const char *check_format_bytes(double v, char *buf, size_t n)
{
  static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB" };
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

/* The tokens of a sequence one rank's tp group holds: all of them, or under mesh.cp cp rank 0's
 * two chunks (the most any cp rank holds). */
static int tp_group_tokens(const struct plan *p)
{
  return p->mesh.cp > 1 ? attention_cp_rank_tokens(p->batch.seq, p->mesh.cp, 0) : p->batch.seq;
}

/* The collectives of one micro-batch (tp_comm_list), or NULL with *n = 0 (tp = 1, no memory). */
struct tp_comm *check_tp_comms(const struct plan *p, int *n)
{
  *n = tp_comm_list(p, p->batch.micro, tp_group_tokens(p), NULL, 0);
  struct tp_comm *list = *n ? malloc((size_t)*n * sizeof *list) : NULL;
  if (!list) {
    *n = 0;
    return NULL;
  }
  tp_comm_list(p, p->batch.micro, tp_group_tokens(p), list, *n);
  return list;
}

/* Whether units a and b (layers; −1 the embedding, L the head) have the same entries. */
static int same_layer_comms(const struct tp_comm *list, int n, int a, int b)
{
  int i = 0, j = 0;
  for (;;) {
    while (i < n && list[i].layer != a) i++;
    while (j < n && list[j].layer != b) j++;
    if (i == n || j == n)
      return i == n && j == n;
    if (list[i].backward != list[j].backward || list[i].op != list[j].op ||
        list[i].n_elems != list[j].n_elems || strcmp(list[i].what, list[j].what) != 0)
      return 0;
    i++;
    j++;
  }
}

static void print_unit_comms(FILE *f, const struct plan *p, const struct tp_comm *list, int n, int layer,
                             const char *label)
{
  int first = 1;
  for (int dir = 0; dir < 2; dir++)
    for (int i = 0; i < n; i++) {
      if (list[i].layer != layer || list[i].backward != dir)
        continue;
      char size[32];
      fprintf(f, "           %-17s %s  %-15s %10s  %s\n", first ? label : "", dir ? "bwd" : "fwd",
              check_comm_op_names[list[i].comm],
              check_format_bytes((double)list[i].n_elems * traffic_tp_element_bytes(p, &list[i]), size, sizeof size),
              list[i].what);
      first = 0;
    }
  if (first)
    fprintf(f, "           %-17s (none)\n", label);
}

/* Per module, the collectives the layout algebra inserts on each tp group, per micro-batch. */
static void print_tp_comms(FILE *f, const struct plan *p)
{
  int n;
  struct tp_comm *list = check_tp_comms(p, &n);
  if (!list)
    return;
  /* the activations' element: a bf16 model's conversions move bf16 (the loss's statistics and the
   * gains' sums stay in the runtime's reals, each line its own bytes) */
  const int eb = (int)traffic_wire_element_bytes(p);
  const int L = p->model.n_layers;
  double bytes[2] = { 0, 0 };
  int calls[2] = { 0, 0 };
  for (int i = 0; i < n; i++) {
    calls[list[i].backward]++;
    bytes[list[i].backward] += (double)list[i].n_elems * traffic_tp_element_bytes(p, &list[i]);
  }
  char fb[32], bb[32];
  fprintf(f, "tp comm    per micro-batch of %d × %d tokens%s on each tp group (activations in %d-byte elements): "
          "forward %d collectives, %s; backward %d, %s\n", p->batch.micro, tp_group_tokens(p),
          p->mesh.cp > 1 ? " (cp rank 0's of each sequence)" : "", eb,
          calls[0], check_format_bytes(bytes[0], fb, sizeof fb), calls[1], check_format_bytes(bytes[1], bb, sizeof bb));
  print_unit_comms(f, p, list, n, -1, "embedding");
  for (int l = 0; l < L;) {
    int e = l + 1;
    while (e < L && same_layer_comms(list, n, l, e)) e++;
    char range[48];
    if (e - 1 > l)
      snprintf(range, sizeof range, "layers %d-%d, each", l, e - 1);
    else
      snprintf(range, sizeof range, "layer %d", l);
    print_unit_comms(f, p, list, n, l, range);
    l = e;
  }
  print_unit_comms(f, p, list, n, L, "head");
  free(list);
}

/* ---- the runtime the figures describe ---- */

/* The one statement of which runtime the byte figures of `check` describe (tp comm, memory,
 * traffic, checkpoint size; the text's "device" line and the JSON's "runtime_note"): this
 * build's CPU runtime for a plan on it (plan_on_cpu), else the GPU runtime's: the same layout in
 * fp32 elements (the bill's rule). */
const char *check_runtime_note(const struct plan *p, char *buf, size_t n)
{
  if (plan_on_cpu(p)) {
    snprintf(buf, n, "the byte figures are this build's CPU runtime's (" REAL_NAME " kernels): what it "
             "allocates and what its comm layer moves");
    return buf;
  }
  snprintf(buf, n, "%sthe byte figures are the GPU runtime's: the CPU runtime's layout in fp32 elements%s; "
           "host memory billed apart", devices_cuda_built() ? "" : "no CUDA backend in this build: ",
           p->precision.compute == PLAN_BF16 ? " (bf16 mode: bf16 copies of the weights and the linears' inputs, "
           "fp32 gradients, and the fp32 master weights with AdamW m and v as optimizer state)" : "");
  return buf;
}

/* The name of dtype d's elements in the plan's runtime: on the CPU, fp32 is its real (REAL_NAME). */
static const char *runtime_dtype_name(const struct plan *p, enum plan_dtype d)
{
  return plan_on_cpu(p) && d == PLAN_FP32 ? REAL_NAME : plan_dtype_name(d);
}

/* ---- the memory bill and the cost on a cluster ---- */

const enum alloc_category check_bill_order[ALLOC_N_CATEGORIES] = {
  ALLOC_PARAMS, ALLOC_GRADS, ALLOC_OPTIMIZER, ALLOC_ACTIVATIONS, ALLOC_COMM, ALLOC_WORKSPACE, ALLOC_CHECKPOINT
};

/* The categories a plan's bill shows: "checkpoint" (the async snapshot) only with checkpoint.async. */
int check_bill_shows(const struct plan *p, int k)
{
  return check_bill_order[k] != ALLOC_CHECKPOINT || (p->checkpoint.async && p->checkpoint.dir[0]);
}

/* The bill of each pipeline rank (every tp and dp rank of a stage has its stage's), or NULL
 * with the reason in err; with `all` 0 only the rows the text shows (row_shown), the others
 * left zero. */
struct bill *check_bills_of(const struct plan *p, int all, char *err, size_t n)
{
  struct bill *b = calloc((size_t)p->mesh.pp, sizeof *b);
  if (!b) {
    snprintf(err, n, "out of memory");
    return NULL;
  }
  struct bill_shared sh; /* the schedule, built once for every rank */
  bill_shared_open(&sh, p);
  for (int r = 0; r < p->mesh.pp; r++)
    if ((all || row_shown(r, p->mesh.pp)) && bill_predict_shared(p, &sh, r, &b[r], err, n)) {
      bill_shared_close(&sh);
      free(b);
      return NULL;
    }
  bill_shared_close(&sh);
  return b;
}

/* The two accountings of a rank's bill (bill.held): the model states, as the ZeRO paper counts
 * them (params, grads, optimizer kept between steps), and the transient buffers a step allocates
 * and frees above them (params, grads, comm at their peaks). */
const enum alloc_category check_state_order[3] = { ALLOC_PARAMS, ALLOC_GRADS, ALLOC_OPTIMIZER };
const enum alloc_category check_transient_order[3] = { ALLOC_PARAMS, ALLOC_GRADS, ALLOC_COMM };

double check_model_states_total(const struct bill *b)
{
  double t = 0;
  for (int k = 0; k < 3; k++) t += b->held[check_state_order[k]];
  return t;
}

double check_transient_bytes(const struct bill *b, enum alloc_category c) { return b->bytes[c] - b->held[c]; }

double check_device_total(const struct bill *b) { return b->total - b->host_total; }

double check_transient_total(const struct bill *b)
{
  double t = 0;
  for (int k = 0; k < 3; k++) t += check_transient_bytes(b, check_transient_order[k]);
  return t;
}

static void print_states_rows(FILE *f, const struct plan *p, const struct bill *b)
{
  char v[32];
  for (int row = 0; row < 2; row++) {
    const enum alloc_category *order = row ? check_transient_order : check_state_order;
    fprintf(f, "          %-12s", row ? "transient" : "model states");
    for (int k = 0; k < ALLOC_N_CATEGORIES; k++) {
      if (!check_bill_shows(p, k))
        continue;
      int here = order[0] == check_bill_order[k] || order[1] == check_bill_order[k] || order[2] == check_bill_order[k];
      double bytes = row ? check_transient_bytes(b, check_bill_order[k]) : b->held[check_bill_order[k]];
      fprintf(f, " %11s", here ? check_format_bytes(bytes, v, sizeof v) : "");
    }
    fprintf(f, " %11s\n", check_format_bytes(row ? check_transient_total(b) : check_model_states_total(b), v, sizeof v));
  }
}

/* A plan on a device of its own: the peaks split into the device's and the host's (bill.host;
 * blank where a category has no host memory). */
static void print_device_host_rows(FILE *f, const struct plan *p, const struct bill *b)
{
  char v[32];
  for (int row = 0; row < 2; row++) {
    fprintf(f, "          %-12s", row ? "on host" : "on device");
    for (int k = 0; k < ALLOC_N_CATEGORIES; k++) {
      if (!check_bill_shows(p, k))
        continue;
      const enum alloc_category c = check_bill_order[k];
      const double bytes = row ? b->host[c] : b->bytes[c] - b->host[c];
      fprintf(f, " %11s", row && !bytes ? "" : check_format_bytes(bytes, v, sizeof v));
    }
    fprintf(f, " %11s\n", check_format_bytes(row ? b->host_total : check_device_total(b), v, sizeof v));
  }
}

static void print_memory(FILE *f, const struct plan *p, const struct cluster *c)
{
  char err[512];
  struct bill *b = check_bills_of(p, c != NULL, err, sizeof err); /* a cluster's verdict needs every rank */
  if (!b) {
    fprintf(f, "memory     (no bill: %s)\n", err);
    return;
  }
  if (p->precision.compute == PLAN_BF16) /* the bf16 mode, the CPU's and the GPU's (host/runtime/README.md) */
    fprintf(f, "memory     per rank, the peak of each category as the runtime allocates it (params bf16 "
            "copies of the weights, grads %s, optimizer the fp32 master and AdamW m and v%s; the linears' "
            "inputs in %s%s; attention keeps O(T) per head: its output and each row's log-sum-exp)\n",
            plan_dtype_name(p->precision.grads), p->zero >= 1 ? ", sharded over dp" : "",
            p->mesh.tp > 1 ? "fp32 at tensor parallelism (moved between ranks in bf16), each rounded to bf16 in "
                             "the workspace for its product"
            : p->model.moe.experts > 0 ? "bf16 (a sparse layer's router's in fp32, rounded for its product)" : "bf16",
            p->model.moe.experts > 0 ? "; a sparse layer's expert rows (inputs, gate, up, SwiGLU's output, "
                                       "outputs) in bf16" : "");
  else /* the CPU's fp32 elements are its reals (float64 in the proof build) */
    fprintf(f, "memory     per rank, the peak of each category as the runtime allocates it (params %s, "
            "grads %s, optimizer AdamW m and v%s; attention keeps O(T) per head: its output and "
            "each row's log-sum-exp)\n",
            runtime_dtype_name(p, p->precision.compute), runtime_dtype_name(p, p->precision.grads),
            p->precision.compute == PLAN_FP32 ? "" : " + fp32 master");
  fprintf(f, "   pp rank  stages    ");
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++)
    if (check_bill_shows(p, k))
      fprintf(f, " %11s", alloc_category_name(check_bill_order[k]));
  fprintf(f, "       total%s\n", c ? "   on the device" : "");
  double worst = 1.0;
  for (int r = 0; r < p->mesh.pp; r++) {
    char stages[64], v[32];
    if (c) {
      double head = 1.0 - check_device_total(&b[r]) / c->device_memory;
      worst = head < worst ? head : worst;
    }
    if (!row_shown(r, p->mesh.pp)) {
      if (r == ROWS_HEAD)
        fprintf(f, "  %8s   (%d more pp ranks; --json lists every one)\n", "...", p->mesh.pp - ROWS_HEAD - ROWS_TAIL);
      continue;
    }
    int co[PLAN_N_AXES] = { 0 }; /* a rank of this pipeline rank, for its stage list */
    co[PLAN_AXIS_PP] = r;
    fprintf(f, "  %8d  %-9s ", r, stage_list(p, mesh_rank(&p->mesh, co), stages, sizeof stages));
    for (int k = 0; k < ALLOC_N_CATEGORIES; k++)
      if (check_bill_shows(p, k))
        fprintf(f, " %11s", check_format_bytes(b[r].bytes[check_bill_order[k]], v, sizeof v));
    fprintf(f, " %11s", check_format_bytes(b[r].total, v, sizeof v));
    if (c) {
      double head = 1.0 - check_device_total(&b[r]) / c->device_memory;
      if (head >= 0)
        fprintf(f, "   fits, %.0f%% headroom", 100.0 * head);
      else
        fprintf(f, "   DOES NOT FIT (%s over)", check_format_bytes(-head * c->device_memory, v, sizeof v));
    }
    fputc('\n', f);
    print_states_rows(f, p, &b[r]);
    if (!plan_on_cpu(p))
      print_device_host_rows(f, p, &b[r]);
  }
  check_zb_print(f, p, b, row_shown); /* a zero-bubble schedule's W-held memory, apart */
  fprintf(f, "           model states: the ZeRO paper's accounting, what a rank keeps between steps (shards "
          "under ZeRO);\n"
          "           transient: buffers a step allocates and frees on top of them, at their peaks (gathered "
          "ZeRO-3\n             units, gradient buckets in flight and the tied embedding's, reduce-scatter "
          "outputs).\n           A params or grads peak is its model states + transient; activations, workspace "
          "and the\n             pipeline's slot buffers (comm) stay allocated between steps%s\n",
          p->mesh.cp > 1 ? "; so do the cp ring's buffers (its\n             transfers' as comm, its blocks' as workspace)" : "");
  if (!plan_on_cpu(p))
    fprintf(f, "           on host: the part of each peak in host memory (the batch's token ids and targets, the "
            "async\n             checkpoint's snapshot); on device: the rest, what the device's memory must hold\n");
  if (c) {
    char dm[32];
    fprintf(f, "           device memory %s (%s): %s\n", check_format_bytes(c->device_memory, dm, sizeof dm), c->name,
            worst >= 0.10 ? "every rank fits with at least 10% headroom"
            : worst >= 0 ? "every rank fits, some with less than 10% headroom"
                         : "some ranks do not fit: more tp or pp, recompute, a higher zero stage, a smaller micro-batch");
  }
  free(b);
}

const char *const check_comm_names[TRAFFIC_N_OPS] = { "all-reduce", "all-gather", "reduce-scatter",
                                                      "broadcast", "send", "recv", "all-to-all" };

/* Per pipeline rank and group, the collectives and messages of one training step. */
static void print_traffic(FILE *f, const struct plan *p)
{
  int any = 0;
  struct bill_shared sh;
  bill_shared_open(&sh, p);
  for (int r = 0; r < p->mesh.pp; r++) {
    struct traffic t;
    char err[256];
    if (!row_shown(r, p->mesh.pp)) {
      if (r == ROWS_HEAD && any)
        fprintf(f, "           ... (%d more pp ranks; --json lists every one)\n", p->mesh.pp - ROWS_HEAD - ROWS_TAIL);
      continue;
    }
    if (traffic_predict_shared(p, &sh, r, &t, err, sizeof err)) {
      fprintf(f, "traffic    (no prediction: %s)\n", err);
      bill_shared_close(&sh);
      return;
    }
    for (int g = 0; g < TRAFFIC_N_GROUPS; g++) {
      int used = 0;
      for (int op = 0; op < TRAFFIC_N_OPS; op++) used |= t.calls[g][op] != 0;
      if (!used)
        continue;
      if (!any)
        fprintf(f, "traffic    per training step and rank, as the comm layer counts it:\n");
      any = 1;
      fprintf(f, "           pp rank %d, %-5s", r, traffic_group_name(g));
      int first = 1;
      for (int op = 0; op < TRAFFIC_N_OPS; op++) {
        if (!t.calls[g][op])
          continue;
        char v[32];
        fprintf(f, "%s%llu %s %s", first ? " " : "; ", t.calls[g][op], check_comm_names[op],
                check_format_bytes((double)t.bytes[g][op], v, sizeof v));
        first = 0;
      }
      fputc('\n', f);
    }
  }
  bill_shared_close(&sh);
}

static void print_cost(FILE *f, const struct plan *p, const struct cluster *c)
{
  struct cost k;
  char err[512];
  if (cost_predict(p, c, &k, err, sizeof err)) {
    fprintf(f, "time       (no prediction: %s)\n", err);
    return;
  }
  const int over = c->attention_flops > 0 || c->pointwise_s > 0 || c->optimizer_s > 0;
  if (c->peak_flops >= 1e12)
    fprintf(f, "time       on %s: %.3f s per step, %.0f tokens/s, MFU %.1f%% of %.0f TFLOPS dense bf16 per GPU\n",
            c->name, k.step, k.tokens_per_s, 100.0 * k.mfu, c->peak_flops / 1e12);
  else /* a calibrated CPU cluster: a device is a core (plan/cluster.h) */
    fprintf(f, "time       on %s: %.4f s per step, %.0f tokens/s, MFU %.1f%% of %.1f GFLOP/s per device\n",
            c->name, k.step, k.tokens_per_s, 100.0 * k.mfu, c->peak_flops / 1e9);
  fprintf(f, "           compute %.3f s (busiest pipeline rank, recompute included, at %.0f%% of peak)\n",
          k.compute, 100.0 * c->compute_efficiency);
  fprintf(f, "           tp comm %.3f s exposed (%s link, not overlapped)\n", k.tp.exposed,
          k.tp.intra ? "intra-node" : "inter-node");
  if (plan_ep(p) > 1)
    fprintf(f, "           ep comm %.3f s exposed (all-to-all on the %s link, not overlapped)\n", k.ep.exposed,
            k.ep.intra ? "intra-node" : "inter-node");
  if (p->mesh.cp > 1)
    fprintf(f, "           cp ring %.3f s exposed of %.3f s of transfers (%s link, overlapped with the attention's "
            "blocks)\n", k.cp.exposed, k.cp.total, k.cp.intra ? "intra-node" : "inter-node");
  fprintf(f, "           pipeline bubble %.3f s (stage sends on the %s link inside it)\n", k.bubble,
          k.pp.intra ? "intra-node" : "inter-node");
  fprintf(f, "           dp comm %.3f s exposed of %.3f s (%s link)\n", k.dp.exposed, k.dp.total,
          k.dp.intra ? "intra-node" : "inter-node");
  if (over)
    fprintf(f, "           of compute, pointwise work %.4f s; optimizer %.4f s after it (the cluster's overheads)\n",
            k.pointwise, k.optimizer);
  if (k.share > 1)
    fprintf(f, "           %.2f ranks per device (%d ranks on %d nodes of %d): compute and optimizer %.2fx slower\n",
            k.share, p->mesh.world, c->nodes, c->gpus_per_node, k.share);
  fprintf(f, "           assumptions: compute = the plan's FLOP model (matmuls and the causal attention core) "
          "at %.0f%% of peak;\n", 100.0 * c->compute_efficiency);
  fprintf(f, "             ring collectives at %.0f%% of link bandwidth plus per-step latency, a group on "
          "the intra-node link when it fits in %d GPUs under mesh.order;\n", 100.0 * c->comm_efficiency,
          c->gpus_per_node);
  if (plan_ep(p) > 1)
    fprintf(f, "             each all-to-all (n−1)/n × its bytes / bandwidth + (n−1) × latency (nccl-tests' bus "
            "bandwidth), the ep group intra-node when its span (dp's stride × ep) fits in a node;\n");
  if (p->mesh.cp > 1)
    fprintf(f, "             the cp ring: each hop's k, v pair (backward: and the dk, dv accumulator) travels while "
            "the attention's block on the pair held runs, exposed where longer;\n");
  if (c->no_overlap)
    fprintf(f, "             no collective hides behind compute (the cluster's overlap = false);\n");
  else
    fprintf(f, "             tp collectives block, the dp reduction hides behind the last micro-batch's "
            "backward, ZeRO-3 gathers behind compute;\n");
  if (over)
    fprintf(f, "             attention core at %.1f GFLOP/s, pointwise %.3g ns per token, layer and element, "
            "optimizer %.3g ns per parameter updated (host/check/cost.h)\n", c->attention_flops / 1e9,
            c->pointwise_s * 1e9, c->optimizer_s * 1e9);
  else
    fprintf(f, "             optimizer step, embedding lookup and kernel launch costs left out "
            "(host/check/cost.h)\n");
}

/* data.text: what `tycho run` will tokenize and where the tokens go (data/text_cache.h). A file
 * that cannot be read is said here; the run refuses it. */
static void print_text_data(FILE *f, const struct plan *p)
{
  fprintf(f, "data       text, %d file%s:", p->data.n_text, p->data.n_text == 1 ? "" : "s");
  for (int k = 0; k < p->data.n_text && k < 4; k++)
    fprintf(f, " %s%s", p->data.text[k], k + 1 < p->data.n_text ? "," : "");
  if (p->data.n_text > 4)
    fprintf(f, " ... (%d more)", p->data.n_text - 4);
  struct text_cache_info info;
  char why[2048];
  if (text_cache_locate(p, &info, why, sizeof why))
    fprintf(f, "; tokenizer %s; cannot be tokenized: %s\n", p->data.tokenizer, why);
  else
    fprintf(f, "; %llu bytes; tokenizer %s; cache %s (%s); the last %g of the tokens for validation%s\n",
            (unsigned long long)info.text_bytes, info.tokenizer, info.path,
            info.cached ? "already made" : "made by rank 0 at run start", p->data.val_fraction,
            p->data.shuffle ? ", shuffled per epoch" : ", in order");
}

static const char *thousands(long long v, char *buf, size_t n)
{
  char digits[32];
  snprintf(digits, sizeof digits, "%lld", v < 0 ? -v : v);
  size_t len = strlen(digits), used = 0;
  if (v < 0 && used + 1 < n)
    buf[used++] = '-';
  for (size_t i = 0; i < len && used + 2 < n; i++) {
    if (i && (len - i) % 3 == 0)
      buf[used++] = ',';
    buf[used++] = digits[i];
  }
  buf[used] = 0;
  return buf;
}

void check_print_text(const struct plan *p, const struct cluster *cluster, FILE *f)
{
  const struct plan_model *m = &p->model;
  const struct plan_mesh *me = &p->mesh;
  char a[64], b[64], buf[320];

  fprintf(f, "plan       %s (%s)\n", p->name, p->file);
  fprintf(f, "hash       %016llx\n", (unsigned long long)plan_hash(p));
  fprintf(f, "model      %s, %d layers, dim %d, %d heads (%d kv, head size %d), ffn %d, vocab %d, max_seq %d\n",
          m->family, m->n_layers, m->dim, m->n_heads, m->n_kv_heads, m->head_dim, m->ffn_dim, m->vocab, m->max_seq);
  double params = (double)plan_param_count(p);
  fprintf(f, "           %s parameters (%.2f %s)%s, dropout %g\n", thousands(plan_param_count(p), a, sizeof a),
          params >= 1e9 ? params / 1e9 : params / 1e6, params >= 1e9 ? "B" : "M",
          m->tie_embeddings ? ", tied embeddings" : "", m->dropout);
  if (m->moe.experts > 0) { /* docs/moe.md */
    char layers[160] = "";
    size_t u = 0;
    for (int l = 0; l < m->n_layers && u + 16 < sizeof layers; l++)
      if (p->layers[l].moe)
        u += (size_t)snprintf(layers + u, sizeof layers - u, "%s%d", u ? ", " : "", l);
    if (m->moe.n_layers == m->n_layers)
      snprintf(layers, sizeof layers, "all");
    const double active = (double)plan_active_param_count(p);
    fprintf(f, "moe        %d sparse layer%s (%s): %d experts of ffn %d, top %d; %s parameters active per token "
            "(%.2f %s)\n", m->moe.n_layers, m->moe.n_layers == 1 ? "" : "s", layers, m->moe.experts, m->moe.ffn_dim,
            m->moe.top_k, thousands(plan_active_param_count(p), a, sizeof a), active >= 1e9 ? active / 1e9 : active / 1e6,
            active >= 1e9 ? "B" : "M");
    const int cap = plan_moe_capacity(m, p->batch.seq);
    if (cap > 0)
      fprintf(f, "           capacity factor %g: at most %d of a sequence's %d tokens per expert (assignments "
              "beyond it drop)\n", m->moe.capacity_factor, cap, p->batch.seq);
    else
      fprintf(f, "           dropless (capacity_factor 0): every assignment is kept, micro × seq × top_k rows "
              "per sparse layer however they spread over the experts\n");
    char edp_text[96];
    if (p->mesh.dp > plan_ep(p))
      snprintf(edp_text, sizeof edp_text, "reduced over the %d dp ranks holding the same experts", p->mesh.dp / plan_ep(p));
    else
      snprintf(edp_text, sizeof edp_text, "held by no other rank: ep = dp");
    if (plan_ep(p) > 1) /* docs/moe.md, "Expert parallelism" */
      fprintf(f, "           router losses: load balancing %g, z-loss %g; expert parallelism: ep %d, a rank holds and "
              "computes %d of the %d experts for its ep group's tokens (their parameters, gradients and AdamW "
              "state are its own, %s)\n", m->moe.aux_loss, m->moe.z_loss, plan_ep(p), m->moe.experts / plan_ep(p),
              m->moe.experts, edp_text);
    else
      fprintf(f, "           router losses: load balancing %g, z-loss %g; expert parallelism: none (every rank "
              "holds every expert, so no all-to-all)\n", m->moe.aux_loss, m->moe.z_loss);
    /* the experts' shard of the rank that holds the most of them (the bill's params below) */
    double most = 0, whole = 0;
    int at = 0;
    for (int r = 0; r < p->mesh.pp; r++) {
      double n_all, n_expert;
      char why[256];
      if (bill_rank_params(p, r, &n_all, &n_expert, why, sizeof why))
        break;
      if (n_expert > most) {
        most = n_expert;
        at = r;
      }
    }
    for (int l = 0; p->layers && l < m->n_layers; l++)
      whole += p->layers[l].moe ? 3.0 * m->moe.experts * m->dim * m->moe.ffn_dim : 0.0;
    char held[32], all[32];
    fprintf(f, "           expert parameters per rank: at most %s of the model's %s (pp rank %d: %d of the %d "
            "experts of each sparse layer on its stages)%s\n", thousands((long long)most, held, sizeof held),
            thousands((long long)whole, all, sizeof all), at, m->moe.experts / plan_ep(p), m->moe.experts,
            p->zero > 0 && p->mesh.dp > plan_ep(p) ? "; ZeRO shards them further over the edp group" : "");
  }

  char why[96];
  if (p->device == PLAN_DEVICE_AUTO && !trainer_auto_device(why, sizeof why)) /* plan_on_cpu */
    fprintf(f, "device     auto → cpu (%s)\n", why);
  else if (p->device == PLAN_DEVICE_AUTO) /* check describes auto as the CPU; run takes the GPU */
    fprintf(f, "device     auto → cpu here (%s: tycho run takes cuda; --set device=cuda for its figures)\n", why);
  else
    fprintf(f, "device     %s\n", plan_device_name(p->device));
  fprintf(f, "           %s\n", check_runtime_note(p, buf, sizeof buf));
  if (plan_on_cpu(p) && trainer_plan_supported(p, buf, sizeof buf))
    fprintf(f, "           tycho run refuses this plan on this build: %s\n", buf);
  if (p->comm == PLAN_COMM_AUTO) /* the trainer's rule (train.c): direct on host memory, else staged */
    fprintf(f, "comm       auto → %s\n", plan_on_cpu(p) ? "mpi (collectives on the buffers: host memory)"
                                                        : "staged (device buffers through host staging; no NCCL in this build)");
  else
    fprintf(f, "comm       %s\n", plan_comm_name(p->comm));
  char ep_text[64] = "";
  if (plan_ep(p) > 1)
    snprintf(ep_text, sizeof ep_text, ", ep %d inside dp", plan_ep(p));
  char order[64], cp_text[32] = "";
  if (me->cp > 1) /* context parallelism: the axis is named where it is there */
    snprintf(cp_text, sizeof cp_text, " × cp %d", me->cp);
  fprintf(f, "mesh       %d ranks = tp %d%s × pp %d × dp %d%s%s; order %s (fastest-varying first)\n",
          me->world, me->tp, cp_text, me->pp, me->dp, me->dp_auto ? " (dp \"auto\")" : "", ep_text,
          plan_mesh_order_text(me, order, sizeof order));
  if (me->world_assumed)
    fprintf(f, "           (no --world given: dp \"auto\" is taken as %d%s; pass --world N for a real job)\n",
            me->dp, plan_ep(p) > 1 ? ", mesh.ep" : "");
  fprintf(f, "           rank = ");
  for (int i = 0, first = 1; i < PLAN_N_AXES; i++) {
    enum plan_axis ax = me->order[i];
    int stride = mesh_axis_stride(me, ax);
    if (mesh_axis_size(me, ax) == 1)
      continue;
    fprintf(f, "%s%d·%s", first ? "" : " + ", stride, plan_axis_name(ax));
    first = 0;
  }
  if (me->world == 1)
    fprintf(f, "0");
  fputc('\n', f);
  for (int ax = 0; ax < PLAN_N_AXES; ax++)
    if (ax != PLAN_AXIS_CP || me->cp > 1)
      fprintf(f, "           %s groups: %d of %d rank%s, e.g. %s\n", plan_axis_name(ax),
              mesh_group_count(me, ax), mesh_axis_size(me, ax), mesh_axis_size(me, ax) == 1 ? "" : "s",
              group_text(me, ax, 0, buf, sizeof buf));
  check_ep_print_groups(f, p);
  if (me->cp > 1)
    fprintf(f, "  %8s %5s %5s %5s %5s   %s\n", "rank", "tp", "cp", "dp", "pp", "stages");
  else
    fprintf(f, "  %8s %5s %5s %5s   %s\n", "rank", "tp", "dp", "pp", "stages");
  if (me->world <= ROWS_ALL) {
    for (int r = 0; r < me->world; r++)
      print_rank_row(f, p, r);
  } else {
    for (int r = 0; r < ROWS_HEAD; r++)
      print_rank_row(f, p, r);
    fprintf(f, "  %8s   (%d more ranks; --json lists every rank)\n", "...", me->world - ROWS_HEAD - ROWS_TAIL);
    for (int r = me->world - ROWS_TAIL; r < me->world; r++)
      print_rank_row(f, p, r);
  }

  static const char *const stage_kinds[] = { "\"even\"", "\"balanced\"", "a list", "a function" };
  fprintf(f, "stages     %d = pp %d × virtual_stages %d, from %s\n", p->n_stages, me->pp, p->virtual_stages,
          stage_kinds[p->stages_kind]);
  fprintf(f, "  %8s %7s %5s   %s\n", "stage", "pp rank", "chunk", "holds");
  for (int s = 0; s < p->n_stages; s++) {
    const struct plan_stage *st = &p->stages[s];
    if (!row_shown(s, p->n_stages)) {
      if (s == ROWS_HEAD)
        fprintf(f, "  %8s   (%d more stages; --json lists every stage)\n", "...", p->n_stages - ROWS_HEAD - ROWS_TAIL);
      continue;
    }
    char layers[64] = "";
    if (st->n_layers == 1)
      snprintf(layers, sizeof layers, "layer %d", st->first_layer);
    else if (st->n_layers > 1)
      snprintf(layers, sizeof layers, "layers %d-%d", st->first_layer, st->first_layer + st->n_layers - 1);
    fprintf(f, "  %8d %7d %5d   %s%s%s%s%s\n", s, st->pp_rank, st->chunk, st->has_embed ? "embed" : "",
            st->has_embed && st->n_layers ? " + " : "", layers,
            st->has_head && (st->n_layers || st->has_embed) ? " + " : "", st->has_head ? "final norm + head" : "");
  }

  fprintf(f, "tp split   embed %s, head %s", plan_split_name(p->embed_split), plan_split_name(p->head_split));
  if (m->vocab_padded != m->vocab)
    fprintf(f, " (vocab %d padded to %d, a multiple of tp; padding rows never reach the loss)", m->vocab,
            m->vocab_padded);
  fprintf(f, "%s\n", p->tp_split_is_function ? "; per layer from a function" : "");
  print_layer_runs(f, p, 0, "");
  fprintf(f, "           sequence parallel %s\n", p->sequence_parallel ? "on" : "off");
  print_tp_comms(f, p);
  check_ep_print_exchange(f, p);
  if (p->recompute_is_function)
    fprintf(f, "recompute  per layer from a function\n");
  print_layer_runs(f, p, 1, p->recompute_is_function ? "" : "recompute");
  static const char *const zero_text[] = { "no sharding", "optimizer state sharded over dp",
                                           "optimizer state and gradients sharded over dp",
                                           "optimizer state, gradients and parameters sharded over dp" };
  fprintf(f, "zero       %d (%s)\n", p->zero, zero_text[p->zero]);
  if (p->zero >= 2) /* zero_every (docs/plans.md): what a step does across its micro-batches */
    fprintf(f, "           gradients reduce-scattered %s%s%s%s\n",
            p->zero_every.grads == PLAN_ZERO_EVERY_STEP ? "once a step, in each stage's last backward (whole "
                                                          "gradients held during the step)"
                                                        : "in every micro-batch's backward",
            p->zero == 3 ? "; parameters gathered " : "",
            p->zero == 3 ? (p->zero_every.params == PLAN_ZERO_EVERY_STEP ? "once a step and kept to each stage's "
                                                                           "last backward"
                                                                         : "for every forward and backward")
                         : "",
            p->zero_every.grads_set || p->zero_every.params_set ? "" : " (the default)");
  fprintf(f, "schedule   %s, %d micro-batch%s per step per rank\n", plan_schedule_name(p->schedule),
          p->batch.microbatches, p->batch.microbatches == 1 ? "" : "es");
  print_schedule(f, p);
  print_memory(f, p, cluster);
  print_traffic(f, p);
  if (cluster)
    print_cost(f, p, cluster);
  fprintf(f, "batch      global %d = micro %d × %d micro-batches × dp %d; seq %d; %s tokens per step\n",
          p->batch.global, p->batch.micro, p->batch.microbatches, me->dp, p->batch.seq,
          thousands((long long)p->batch.global * p->batch.seq, b, sizeof b));
  fprintf(f, "precision  compute %s, grads %s, master %s\n", plan_dtype_name(p->precision.compute),
          plan_dtype_name(p->precision.grads), plan_dtype_name(p->precision.master));
  fprintf(f, "optimizer  %s lr %g, betas (%g, %g), eps %g, weight_decay %g, grad_clip %g%s\n", p->optimizer.kind,
          p->optimizer.lr, p->optimizer.beta1, p->optimizer.beta2, p->optimizer.eps, p->optimizer.weight_decay,
          p->optimizer.grad_clip, p->optimizer.grad_clip == 0 ? " (off)" : "");
  fprintf(f, "lr         warmup %d steps, then %s", p->lr_schedule.warmup, plan_decay_name(p->lr_schedule.decay));
  if (p->lr_schedule.decay != PLAN_DECAY_CONSTANT)
    fprintf(f, " to %g at step %lld", p->lr_schedule.min_lr, p->lr_schedule.decay_steps);
  fputc('\n', f);
  fprintf(f, "seeds      global %lld", p->seeds.global);
  for (int s = 0; s < PLAN_N_SEEDS; s++)
    fprintf(f, "; %s %lld (%s)", plan_seed_name(s), p->seeds.value[s],
            p->seeds.derived[s] ? "derived from global" : "set");
  fputc('\n', f);
  if (p->data.synthetic[0])
    fprintf(f, "data       synthetic \"%s\"\n", p->data.synthetic);
  else if (p->data.n_text)
    print_text_data(f, p);
  else if (p->data.train[0] || p->data.val[0])
    fprintf(f, "data       train %s, val %s%s\n", p->data.train[0] ? p->data.train : "(none)",
            p->data.val[0] ? p->data.val : "(none)", p->data.shuffle ? ", shuffled per epoch" : ", in order");
  else
    fprintf(f, "data       (none given: tycho run needs data.train, data.text or data.synthetic)\n");
  fprintf(f, "train      %lld steps", p->train.steps);
  if (p->train.eval_every)
    fprintf(f, ", eval every %d steps (%d batches)", p->train.eval_every, p->train.eval_batches);
  fputc('\n', f);
  if (p->init.from[0])
    fprintf(f, "init       from %s\n", p->init.from);
  if (p->export_.path[0])
    fprintf(f, "export     %s%s\n", p->export_.path, p->export_.every ? " (and periodically)" : " at the end");
  if (p->checkpoint.dir[0]) /* the weights and AdamW's m and v, in the runtime's fp32 elements */
    fprintf(f, "checkpoint %s every %d steps, keep %d%s: %.2f GiB each (%s weights and AdamW "
            "moments, one shard file per rank)\n", p->checkpoint.dir, p->checkpoint.every,
            p->checkpoint.keep, p->checkpoint.async ? ", async" : "",
            3.0 * check_element_bytes(p, PLAN_FP32) * (double)plan_param_count(p) / 1073741824.0,
            plan_on_cpu(p) ? REAL_NAME : "fp32");
  fprintf(f, "log        progress every %d steps%s%s", p->log.every, p->log.metrics[0] ? ", metrics " : "",
          p->log.metrics);
  if (p->log.trace[0])
    fprintf(f, ", trace %s (the first %d steps)", p->log.trace, p->log.trace_steps);
  if (p->log.tensorboard[0])
    fprintf(f, ", tensorboard %s%s", p->log.tensorboard,
            strcmp(p->log.tensorboard_ranks, "all") == 0 ? " (every rank, in rank<N>/)" : "");
  fputc('\n', f);
}

int check_cp_refused(const struct plan *p, const char *command, char *err, size_t n)
{
  char why[1024];
  if (!plan_cp_refused(p, why, sizeof why))
    return 0;
  return errf(err, n, "tycho %s: %s", command, why);
}
