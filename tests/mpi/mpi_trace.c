/* log.trace: `tycho run`'s trainer (train_run) writes a Chrome trace-event file, and it says what
 * the run did. Every rank trains PLAN (with the --set overrides, log.trace pointing at TRACE)
 * through train_run; then rank 0 reads the file with the strict JSON parser and checks:
 *   - every event has a name, a phase, a process and a thread; every slice a start and a
 *     duration ≥ 0; one process per rank, named "rank R";
 *   - only the first log.trace_steps steps are there (the run trains more);
 *   - per rank and step, the compute spans ("forward", "backward" with their stage and
 *     micro-batch; a split backward's "backward B" and "backward W", each with its share of
 *     the FLOPs) come in the order of that pipeline rank's instruction list (host/sched: the
 *     list the simulator checks and `tycho check` prints), each with the FLOPs of
 *     plan_stage_micro_batch_flops, and end before the step's one "optimizer" span begins;
 *   - each step's "evaluation" span (train.eval_every = 1) follows its optimizer;
 *   - the pipeline messages of a step's training (send and recv on "pp" before its optimizer)
 *     are as many as the list's SEND and RECV instructions; every collective carries its group, bytes and a sequence number
 *     that grows along each (rank, group) track.
 * usage: mpi_trace PLAN TRACE [--set path=value]... */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mesh/mesh.h"
#include "mpi_check.h"
#include "plan/compile.h"
#include "runtime/train/train.h"
#include "sched/sched.h"
#include "util/json.h"

#define MAX_SETS 16
#define MAX_RANKS 16

static const char *plan_path, *trace_path;
static const char *sets[MAX_SETS + 2];
static int n_sets, rank, world;
static char err[4096];
static struct plan plan;

static void test_run_writes_the_trace(void)
{
  struct comm_group *groups[PLAN_N_AXES];
  CHECK_MSG(comm_build_mesh_groups(&plan.mesh, groups, err, sizeof err) == 0, "%s", err);
  FILE *out = rank == 0 ? stdout : NULL;
  CHECK_MSG(train_run(&plan, groups, out, err, sizeof err) == TRAIN_OK, "%s", err);
}

/* A number member of object `id` as a double; -1e300 when absent. */
static double number(const struct json_doc *j, int id, const char *key)
{
  int m = json_member(j, id, key);
  double v = -1e300;
  if (m >= 0 && j->nodes[m].type == JSON_NUMBER)
    json_double(j, m, &v);
  return v;
}

static const char *string(const struct json_doc *j, int id, const char *key)
{
  int m = json_member(j, id, key);
  return m >= 0 && j->nodes[m].type == JSON_STRING ? j->nodes[m].str : NULL;
}

struct span { const char *name; double ts, end; long long step; int stage, mb; double flops; };

static int by_start(const void *a, const void *b)
{
  double d = ((const struct span *)a)->ts - ((const struct span *)b)->ts;
  return d < 0 ? -1 : d > 0;
}

/* The spans of rank r, step s, in order of their start. */
static int spans_of(const struct span *all, int n, long long s, struct span *out)
{
  int k = 0;
  for (int i = 0; i < n; i++)
    if (all[i].step == s)
      out[k++] = all[i];
  qsort(out, (size_t)k, sizeof *out, by_start);
  return k;
}

static void check_rank(const struct json_doc *j, int events, int r, const struct sched *sc)
{
  int coord[PLAN_N_AXES];
  mesh_coords(&plan.mesh, r, coord);
  const struct sched_list *list = &sc->ranks[coord[PLAN_AXIS_PP]];
  const int steps = plan.log.trace_steps;
  struct span *spans = calloc((size_t)j->n_nodes, sizeof *spans), *step_spans = calloc((size_t)j->n_nodes, sizeof *spans);
  int n = 0, n_msgs = 0, sends[64] = { 0 }, recvs[64] = { 0 };
  struct { double ts; long long step; int send; } *msgs = calloc((size_t)j->n_nodes, sizeof *msgs);
  char groups[8][COMM_NAME_MAX] = { { 0 } };
  double last_seq[8];
  int n_groups = 0, seq_ok = 1;
  for (int e = j->nodes[events].first; e >= 0; e = j->nodes[e].next) {
    if ((int)number(j, e, "pid") != r || strcmp(string(j, e, "ph"), "X"))
      continue;
    const char *cat = string(j, e, "cat"), *name = string(j, e, "name");
    int args = json_member(j, e, "args");
    CHECK_MSG(args >= 0, "rank %d: a %s slice without args", r, name);
    if (args < 0)
      continue;
    long long step = (long long)number(j, args, "step");
    CHECK_MSG(step >= 0 && step < steps, "rank %d: %s of step %lld in a trace of the first %d steps", r, name,
              step, steps);
    if (step < 0 || step >= 64)
      continue;
    if (!strcmp(cat, "caller")) {
      double stage = number(j, args, "stage"), mb = number(j, args, "mb"), flops = number(j, args, "flops");
      spans[n++] = (struct span){ name, number(j, e, "ts"), number(j, e, "ts") + number(j, e, "dur"), step,
                                  stage < -1e299 ? -1 : (int)stage, mb < -1e299 ? -1 : (int)mb, flops };
      continue;
    }
    const char *group = string(j, args, "group");
    double seq = number(j, args, "seq"), bytes = number(j, args, "n_bytes");
    CHECK_MSG(group && seq >= 0 && bytes >= 0, "rank %d: %s without group, seq or bytes", r, name);
    if (!group)
      continue;
    if (!strcmp(group, "pp") && (!strcmp(name, "send") || !strcmp(name, "recv"))) {
      msgs[n_msgs].ts = number(j, e, "ts");
      msgs[n_msgs].step = step;
      msgs[n_msgs++].send = !strcmp(name, "send");
    } else { /* collectives: seq grows along each group's track (records are in issue order) */
      int g = 0;
      while (g < n_groups && strcmp(groups[g], group)) g++;
      if (g == n_groups && n_groups < 8) {
        snprintf(groups[n_groups], COMM_NAME_MAX, "%s", group);
        last_seq[n_groups++] = -1;
      }
      if (g < n_groups) {
        seq_ok &= seq > last_seq[g];
        last_seq[g] = seq;
      }
    }
  }
  CHECK_MSG(seq_ok, "rank %d: a collective's seq does not grow along its group", r);
  for (long long s = 0; s < steps; s++) {
    int k = spans_of(spans, n, s, step_spans), at = 0, want_send = 0, want_recv = 0, ok = 1, n_split = 0;
    for (int i = 0; i < list->n; i++) {
      const struct sched_instr *in = &list->instr[i];
      want_send += in->op == SCHED_SEND_ACT || in->op == SCHED_SEND_GRAD;
      want_recv += in->op == SCHED_RECV_ACT || in->op == SCHED_RECV_GRAD;
      if (in->op != SCHED_FWD && in->op != SCHED_BWD && in->op != SCHED_BWD_B && in->op != SCHED_BWD_W)
        continue;
      const int bwd = in->op != SCHED_FWD;
      /* a split backward's halves: "backward B" with the backward's FLOPs less the weight
       * gradient's share (the schedule's w_share), "backward W" with that share */
      const char *want_name = !bwd ? "forward" : in->op == SCHED_BWD_B ? "backward B"
                              : in->op == SCHED_BWD_W ? "backward W" : "backward";
      const struct span *sp = at < k ? &step_spans[at++] : NULL;
      const int match = sp && !strcmp(sp->name, want_name) && sp->stage == in->stage && sp->mb == in->mb;
      CHECK_MSG(match, "rank %d, step %lld: span %d is %s(stage %d, mb %d); the schedule says %s(stage %d, mb %d)",
                r, s, at - 1, sp ? sp->name : "nothing", sp ? sp->stage : -1, sp ? sp->mb : -1,
                want_name, in->stage, in->mb);
      double want = plan_stage_micro_batch_flops(&plan, in->stage, bwd);
      if (in->op == SCHED_BWD_B || in->op == SCHED_BWD_W) {
        const double share = sc->costs.w_share[in->stage];
        want *= in->op == SCHED_BWD_W ? share : 1 - share;
        n_split += in->op == SCHED_BWD_W;
      }
      CHECK_MSG(!sp || sp->flops == want, "rank %d: %s(stage %d) with %.17g FLOPs, expected %.17g", r,
                sp ? sp->name : "", in->stage, sp ? sp->flops : 0, want);
      ok &= match;
    }
    /* the step's training messages: those that start before its optimizer (evaluation, which
     * runs stage after stage, sends its own after it) */
    const double opt_ts = k >= 2 ? step_spans[k - 2].ts : 1e300;
    for (int i = 0; i < n_msgs; i++)
      if (msgs[i].step == s && msgs[i].ts < opt_ts) {
        sends[s] += msgs[i].send;
        recvs[s] += !msgs[i].send;
      }
    CHECK_MSG(at + 2 == k && k >= 2 && !strcmp(step_spans[k - 2].name, "optimizer") &&
              !strcmp(step_spans[k - 1].name, "evaluation"), "rank %d, step %lld: %d spans after the "
              "schedule's compute, expected the optimizer and the evaluation", r, s, k - at);
    if (at + 2 == k && at > 0)
      CHECK_MSG(step_spans[at - 1].end <= step_spans[at].ts, "rank %d, step %lld: the optimizer starts "
                "before the last backward ends", r, s);
    CHECK_MSG(sends[s] == want_send && recvs[s] == want_recv, "rank %d, step %lld: %d sends and %d receives "
              "on pp, the schedule has %d and %d", r, s, sends[s], recvs[s], want_send, want_recv);
    if (r == 0 && s == 0 && ok)
      printf("rank 0, step 0: %d compute spans in the schedule's order (%d split backwards: B and W apart), "
             "then optimizer and evaluation; %d sends, %d receives on pp\n", at, n_split, sends[s], recvs[s]);
  }
  free(spans);
  free(step_spans);
  free(msgs);
}

static void test_trace_says_what_ran(void)
{
  if (rank != 0)
    return;
  FILE *f = fopen(trace_path, "rb");
  CHECK_MSG(f != NULL, "no trace at %s", trace_path);
  if (!f)
    return;
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)size + 1);
  CHECK(text && fread(text, 1, (size_t)size, f) == (size_t)size);
  fclose(f);
  struct json_doc j;
  CHECK_MSG(json_parse(&j, text, (size_t)size, trace_path, 0, err, sizeof err) == 0, "%s", err);
  int events = json_member(&j, 0, "traceEvents");
  CHECK(events >= 0 && j.nodes[events].type == JSON_ARRAY);
  int named[MAX_RANKS] = { 0 }, bad = 0, slices = 0;
  for (int e = events >= 0 ? j.nodes[events].first : -1; e >= 0; e = j.nodes[e].next) {
    const char *ph = string(&j, e, "ph"), *name = string(&j, e, "name");
    double pid = number(&j, e, "pid"), tid = number(&j, e, "tid");
    bad += !ph || !name || pid < 0 || pid >= world || tid < 0;
    if (ph && !strcmp(ph, "X")) {
      slices++;
      bad += number(&j, e, "ts") < 0 || number(&j, e, "dur") < 0;
    }
    if (ph && !strcmp(ph, "M") && name && !strcmp(name, "process_name") && pid >= 0 && pid < MAX_RANKS) {
      int args = json_member(&j, e, "args");
      char want[32];
      snprintf(want, sizeof want, "rank %d", (int)pid);
      named[(int)pid] += args >= 0 && string(&j, args, "name") && !strcmp(string(&j, args, "name"), want);
    }
  }
  CHECK_MSG(bad == 0, "%d events lack a phase, name, process, thread, start or duration", bad);
  for (int r = 0; r < world && r < MAX_RANKS; r++)
    CHECK_MSG(named[r] == 1, "rank %d is named %d times", r, named[r]);
  struct sched sc;
  CHECK_MSG(sched_from_plan(&plan, &sc, err, sizeof err) == 0, "%s", err);
  for (int r = 0; r < world; r++)
    check_rank(&j, events, r, &sc);
  printf("%s: %ld bytes, %d slices over %d ranks, steps 1-%d of %lld\n", trace_path, size, slices, world,
         plan.log.trace_steps, plan.train.steps);
  sched_free(&sc);
  json_free(&j);
  free(text);
}

int main(int argc, char **argv)
{
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  rank = comm_world()->rank;
  world = comm_world()->size;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--set") && i + 1 < argc && n_sets < MAX_SETS)
      sets[n_sets++] = argv[++i];
    else if (!plan_path)
      plan_path = argv[i];
    else if (!trace_path)
      trace_path = argv[i];
    else
      comm_fatal("usage: mpi_trace PLAN TRACE [--set path=value]...");
  }
  if (!plan_path || !trace_path || world > MAX_RANKS)
    comm_fatal("usage: mpi_trace PLAN TRACE [--set path=value]... (at most %d ranks)", MAX_RANKS);
  static char trace_set[4200];
  snprintf(trace_set, sizeof trace_set, "log.trace=%s", trace_path);
  sets[n_sets++] = trace_set;
  struct plan_compile_options opt = { world, 0, 0, 0, n_sets, sets };
  plan_init(&plan);
  if (plan_compile(plan_path, &opt, &plan, err, sizeof err))
    comm_fatal("the plan does not compile: %s", err);
  if (plan.train.steps <= plan.log.trace_steps || plan.train.eval_every != 1 || plan.log.trace_steps > 64)
    comm_fatal("mpi_trace wants train.steps > log.trace_steps (at most 64) and train.eval_every = 1");
  static const struct test_case tests[] = { TEST(test_run_writes_the_trace), TEST(test_trace_says_what_ran) };
  int rc = mpi_test_run_all(tests, 2);
  plan_free(&plan);
  comm_finalize(err, sizeof err);
  return rc;
}
