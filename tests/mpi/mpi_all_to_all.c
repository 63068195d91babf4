/* The all-to-all with per-peer counts (comm_all_to_all_v) and its count exchange
 * (comm_all_to_all_counts), the two halves of expert parallelism's dispatch and combine:
 *   - uneven counts with zeros (a rank that sends nothing, a rank that receives nothing), small
 *     blocks and blocks past MPI's eager limit, blocking and non-blocking, in real and in bytes,
 *     on the world, on a group whose rank order is the world's reversed, and on pairs (a group
 *     of one on an odd world), against values every rank computes for every other;
 *   - the exchanged counts are the senders' counts, and size the exchange that follows;
 *   - several in flight with an all-reduce between them finish in issue order;
 *   - the counters hold the calls and the bytes sent (the exchange's 8 bytes a peer included),
 *     and summed over a group the bytes sent equal the bytes received;
 *   - the flight recorder and the trace file show each as "all-to-all" with this rank's bytes;
 *   - refusals (NULL counts, a rank's own pair that differs, overlapping or NULL buffers, a REPL
 *     chunk that leaves a member out) name the cause, and count and sequence nothing;
 *   - check mode names the first pair whose counts differ, and an all-to-all against its
 *     per-peer form, on every rank, before any data moves.
 * With "watchdog" instead of a trace path, rank 1 sleeps while the others wait in an
 * all-to-all: all_to_all_watchdog.sh checks the diagnosis.
 *
 * Usage: mpi_all_to_all TRACE_PATH | mpi_all_to_all watchdog */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm/comm.h"
#include "mpi_check.h"
#include "util/json.h"

#define MAX_RANKS 16
#define BIG 3001 /* elements per count unit in the large case: 3 units of fp32 are 36 KB, past eager */

static int rank, world;
static const char *trace_path;
static struct comm_group *reversed, *pairs; /* the world in reverse order; {0,1}, {2,3}, ... */

/* Elements group rank i sends to group rank j (scale units each). Group rank 1 sends nothing,
 * group rank 2 receives nothing, and (i + 2j + 1) % 4 adds zeros of its own (i = 3, j = 0). */
static size_t count(int i, int j, size_t scale)
{
  if (i == 1 || j == 2)
    return 0;
  return (size_t)((i + 2 * j + 1) % 4) * scale;
}

/* Element k of the block from world rank a to world rank b: exact in fp32 (below 2^24). */
static real value(int a, int b, size_t k) { return (real)((a * 8 + b) * 10000 + (int)(k % 10000)); }
static unsigned char byte_value(int a, int b, size_t k) { return (unsigned char)(a * 7 + b * 3 + (int)k); }

/* The send buffer, the expected recv buffer and both count arrays of group g at `scale`. */
struct exchange {
  size_t *to, *from, sent, received;
  void *send, *recv, *want;
};

static void exchange_make(struct exchange *x, const struct comm_group *g, size_t scale, enum comm_dtype dtype)
{
  const int P = g->size, me = g->rank;
  const size_t elem = comm_dtype_size(dtype);
  x->to = calloc((size_t)P, sizeof *x->to);
  x->from = calloc((size_t)P, sizeof *x->from);
  x->sent = x->received = 0;
  for (int j = 0; j < P; j++) {
    x->to[j] = count(me, j, scale);
    x->from[j] = count(j, me, scale);
    x->sent += x->to[j];
    x->received += x->from[j];
  }
  /* nothing to receive: NULL, which the layer accepts for zero elements */
  x->send = x->sent ? malloc(x->sent * elem) : NULL;
  x->recv = x->received ? malloc(x->received * elem) : NULL;
  x->want = x->received ? malloc(x->received * elem) : NULL;
  size_t at = 0;
  for (int j = 0; j < P; j++)
    for (size_t k = 0; k < x->to[j]; k++, at++)
      if (dtype == COMM_UINT8)
        ((unsigned char *)x->send)[at] = byte_value(rank, g->ranks[j], k);
      else
        ((real *)x->send)[at] = value(rank, g->ranks[j], k);
  at = 0;
  for (int j = 0; j < P; j++)
    for (size_t k = 0; k < x->from[j]; k++, at++)
      if (dtype == COMM_UINT8)
        ((unsigned char *)x->want)[at] = byte_value(g->ranks[j], rank, k);
      else
        ((real *)x->want)[at] = value(g->ranks[j], rank, k);
  if (x->recv)
    memset(x->recv, 0xff, x->received * elem);
}

static int exchange_ok(const struct exchange *x, enum comm_dtype dtype, const struct comm_group *g, const char *what)
{
  size_t n_bytes = x->received * comm_dtype_size(dtype);
  if (!n_bytes || !memcmp(x->recv, x->want, n_bytes))
    return 1;
  for (size_t b = 0; b < n_bytes; b++)
    if (((unsigned char *)x->recv)[b] != ((unsigned char *)x->want)[b]) {
      fprintf(stderr, "rank %d: %s on %s: byte %zu of %zu differs\n", rank, what, g->name, b, n_bytes);
      break;
    }
  return 0;
}

static void exchange_free(struct exchange *x)
{
  free(x->to);
  free(x->from);
  free(x->send);
  free(x->recv);
  free(x->want);
}

static struct comm_group *group_at(int k) { return k == 0 ? comm_world() : k == 1 ? reversed : pairs; }

static void test_uneven_counts_with_zeros_arrive_in_peer_order(void)
{
  const enum comm_dtype dtypes[2] = { COMM_REAL, COMM_UINT8 };
  const size_t scales[2] = { 1, BIG };
  for (int k = 0; k < 3; k++)
    for (int d = 0; d < 2; d++)
      for (int s = 0; s < 2; s++)
        for (int blocking = 0; blocking < 2; blocking++) {
          struct comm_group *g = group_at(k);
          struct exchange x;
          exchange_make(&x, g, scales[s], dtypes[d]);
          struct comm_request *req = NULL;
          int rc = comm_all_to_all_v(g, x.send, x.to, x.recv, x.from, dtypes[d], blocking ? NULL : &req);
          CHECK_MSG(rc == 0 && comm_wait(&req) == 0, "%s", comm_error());
          char what[96];
          snprintf(what, sizeof what, "%s %s all-to-all of scale %zu", blocking ? "blocking" : "non-blocking",
                   comm_dtype_name(dtypes[d]), scales[s]);
          CHECK_MSG(exchange_ok(&x, dtypes[d], g, what), "%s", what);
          exchange_free(&x);
        }
}

static void test_exchanged_counts_size_the_exchange(void)
{
  for (int k = 0; k < 3; k++) {
    struct comm_group *g = group_at(k);
    struct exchange x;
    exchange_make(&x, g, BIG, COMM_REAL);
    size_t *from = malloc((size_t)g->size * sizeof *from);
    for (int j = 0; j < g->size; j++)
      from[j] = 12345; /* overwritten by the exchange */
    struct comm_request *req = NULL;
    CHECK_MSG(comm_all_to_all_counts(g, x.to, from, &req) == 0 && comm_wait(&req) == 0, "%s", comm_error());
    int bad = 0;
    for (int j = 0; j < g->size; j++)
      bad += from[j] != x.from[j];
    CHECK_MSG(bad == 0, "rank %d on %s: %d exchanged counts differ from the senders'", rank, g->name, bad);
    CHECK_MSG(comm_all_to_all_v(g, x.send, x.to, x.recv, from, COMM_REAL, NULL) == 0, "%s", comm_error());
    CHECK(exchange_ok(&x, COMM_REAL, g, "all-to-all sized by the exchanged counts"));
    free(from);
    exchange_free(&x);
  }
}

static void test_several_in_flight_finish_in_issue_order(void)
{
  struct exchange a, b;
  exchange_make(&a, comm_world(), BIG, COMM_REAL);
  exchange_make(&b, reversed, 1, COMM_REAL);
  real one = 1, sum = 0;
  struct comm_request *reqs[3] = { NULL, NULL, NULL };
  CHECK(comm_all_to_all_v(comm_world(), a.send, a.to, a.recv, a.from, COMM_REAL, &reqs[0]) == 0);
  /* the counts are copied: changing them now changes nothing in flight */
  for (int j = 0; j < world; j++)
    a.to[j] = a.from[j] = 999;
  CHECK(comm_all_reduce(comm_world(), &one, &sum, 1, COMM_REAL, COMM_SUM, &reqs[1]) == 0);
  CHECK(comm_all_to_all_v(reversed, b.send, b.to, b.recv, b.from, COMM_REAL, &reqs[2]) == 0);
  CHECK_MSG(comm_wait_all(reqs, 3) == 0, "%s", comm_error());
  CHECK(exchange_ok(&a, COMM_REAL, comm_world(), "the first in flight"));
  CHECK(exchange_ok(&b, COMM_REAL, reversed, "the third in flight"));
  CHECK(sum == (real)world);
  exchange_free(&a);
  exchange_free(&b);
}

static void test_counters_hold_the_bytes_sent(void)
{
  comm_counters_reset();
  uint64_t seq0[3], want_bytes[3] = { 0, 0, 0 }, received[3] = { 0, 0, 0 };
  for (int k = 0; k < 3; k++)
    seq0[k] = comm_group_seq(group_at(k));
  for (int k = 0; k < 3; k++) {
    struct comm_group *g = group_at(k);
    for (int s = 0; s < 2; s++) {
      struct exchange x;
      exchange_make(&x, g, s ? BIG : 1, COMM_REAL);
      size_t *from = malloc((size_t)g->size * sizeof *from);
      CHECK(comm_all_to_all_counts(g, x.to, from, NULL) == 0);
      CHECK(comm_all_to_all_v(g, x.send, x.to, x.recv, x.from, COMM_REAL, NULL) == 0);
      want_bytes[k] += 8 * (uint64_t)g->size + x.sent * sizeof(real);
      received[k] += 8 * (uint64_t)g->size + x.received * sizeof(real);
      free(from);
      exchange_free(&x);
    }
  }
  for (int k = 0; k < 3; k++) {
    struct comm_group *g = group_at(k);
    struct comm_counter c = comm_counter_get(g, COMM_ALL_TO_ALL);
    CHECK_MSG(c.calls == 4 && c.n_bytes == want_bytes[k], "rank %d %s: %llu calls %llu bytes, want 4 calls %llu bytes",
              rank, g->name, (unsigned long long)c.calls, (unsigned long long)c.n_bytes,
              (unsigned long long)want_bytes[k]);
    CHECK(comm_group_seq(g) == seq0[k] + 4);
    for (int op = 0; op < COMM_N_OPS; op++)
      if (op != COMM_ALL_TO_ALL)
        CHECK(comm_counter_get(g, (enum comm_op)op).calls == 0);
    /* over the group, what its members counted as sent is what they received (control plane:
     * plain MPI on the world, not counted) */
    unsigned long long mine[2] = { (unsigned long long)c.n_bytes, (unsigned long long)received[k] }, all[2];
    MPI_Comm members;
    MPI_Comm_split(MPI_COMM_WORLD, g->ranks[0], rank, &members);
    MPI_Allreduce(mine, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, members);
    MPI_Comm_free(&members);
    CHECK_MSG(all[0] == all[1], "%s: %llu bytes sent, %llu received", g->name, all[0], all[1]);
  }
}

static void test_recorder_names_the_op_with_the_bytes_sent(void)
{
  struct exchange x;
  exchange_make(&x, reversed, BIG, COMM_REAL);
  comm_set_step(41, 2);
  uint64_t seq = comm_group_seq(reversed);
  CHECK(comm_all_to_all_v(reversed, x.send, x.to, x.recv, x.from, COMM_REAL, NULL) == 0);
  struct comm_record r;
  CHECK(comm_records(&r, 1) == 1);
  CHECK_MSG(r.op == COMM_ALL_TO_ALL && !strcmp(comm_op_name(r.op), "all-to-all") && !strcmp(r.group, "reversed") &&
            r.seq == seq && r.n_bytes == x.sent * sizeof(real) && r.peer == -1 && r.step == 41 && r.mb == 2 &&
            r.status == 0 && r.t_issue <= r.t_start && r.t_start <= r.t_end,
            "rank %d: %s on %s seq %llu, %zu bytes, peer %d, step %lld mb %d, status %d", rank, comm_op_name(r.op),
            r.group, (unsigned long long)r.seq, r.n_bytes, r.peer, r.step, r.mb, r.status);
  exchange_free(&x);
}

/* A number member of object `id` as a double; -1 when absent. */
static double number(const struct json_doc *j, int id, const char *key)
{
  int m = json_member(j, id, key);
  double v = -1;
  if (m >= 0 && j->nodes[m].type == JSON_NUMBER)
    json_double(j, m, &v);
  return v;
}

static const char *string(const struct json_doc *j, int id, const char *key)
{
  int m = json_member(j, id, key);
  return m >= 0 && j->nodes[m].type == JSON_STRING ? j->nodes[m].str : NULL;
}

/* Step 42's one all-to-all on the world: each rank's slice, with the bytes that rank sent. */
static void test_trace_shows_each_rank_s_all_to_all(void)
{
  struct exchange x;
  exchange_make(&x, comm_world(), 1, COMM_REAL);
  comm_set_step(42, 0);
  CHECK(comm_all_to_all_v(comm_world(), x.send, x.to, x.recv, x.from, COMM_REAL, NULL) == 0);
  comm_set_step(43, 0);
  exchange_free(&x);
  char err[512] = "";
  CHECK_MSG(comm_trace_write_steps(trace_path, 42, 42, err, sizeof err) == 0, "%s", err);
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
  int events = json_member(&j, 0, "traceEvents"), found[MAX_RANKS] = { 0 }, others = 0;
  for (int e = events >= 0 ? j.nodes[events].first : -1; e >= 0; e = j.nodes[e].next) {
    const char *ph = string(&j, e, "ph"), *name = string(&j, e, "name"), *cat = string(&j, e, "cat");
    if (!ph || strcmp(ph, "X") || !cat || strcmp(cat, "comm"))
      continue;
    int args = json_member(&j, e, "args"), pid = (int)number(&j, e, "pid");
    const char *group = args >= 0 ? string(&j, args, "group") : NULL;
    if (!name || strcmp(name, "all-to-all") || !group || strcmp(group, "world") || pid < 0 || pid >= world) {
      others++;
      continue;
    }
    size_t sent = 0;
    for (int b = 0; b < world; b++)
      sent += count(pid, b, 1);
    CHECK_MSG(number(&j, args, "n_bytes") == (double)(sent * sizeof(real)) && number(&j, e, "dur") >= 0,
              "rank %d's all-to-all: %g bytes, want %zu", pid, number(&j, args, "n_bytes"), sent * sizeof(real));
    found[pid]++;
  }
  CHECK_MSG(others == 0, "%d other comm slices in step 42", others);
  for (int r = 0; r < world; r++)
    CHECK_MSG(found[r] == 1, "rank %d has %d all-to-all slices in step 42", r, found[r]);
  json_free(&j);
  free(text);
}

static void test_refusals_name_the_cause_and_count_nothing(void)
{
  struct comm_group *w = comm_world();
  real buf[64] = { 0 };
  size_t to[MAX_RANKS] = { 0 }, from[MAX_RANKS] = { 0 };
  struct comm_counter before = comm_counter_get(w, COMM_ALL_TO_ALL);
  uint64_t seq = comm_group_seq(w);
  char want[512];

  CHECK(comm_all_to_all_v(w, buf, NULL, buf + 32, from, COMM_REAL, NULL) == -1);
  CHECK_MSG(!strcmp(comm_error(), "comm all-to-all on world: NULL send_counts"), "%s", comm_error());
  CHECK(comm_all_to_all_v(w, buf, to, buf + 32, NULL, COMM_REAL, NULL) == -1);
  CHECK_MSG(!strcmp(comm_error(), "comm all-to-all on world: NULL recv_counts"), "%s", comm_error());

  to[rank] = 3;
  from[rank] = 2;
  CHECK(comm_all_to_all_v(w, buf, to, buf + 32, from, COMM_REAL, NULL) == -1);
  snprintf(want, sizeof want, "comm all-to-all on world: group rank %d sends 3 elements to itself but expects 2 "
           "from itself (send_counts[%d] must equal recv_counts[%d])", rank, rank, rank);
  CHECK_MSG(!strcmp(comm_error(), want), "%s", comm_error());

  from[rank] = 3;
  from[(rank + 1) % world] += 4; /* 3 sent from buf[0], 3 + 4 (or 7 alone) received at buf[2] */
  CHECK(comm_all_to_all_v(w, buf, to, buf + 2, from, COMM_REAL, NULL) == -1);
  CHECK_MSG(!strcmp(comm_error(), "comm all-to-all on world: send and recv buffers overlap (the per-peer form has "
                                  "no in place)"), "%s", comm_error());
  CHECK(comm_all_to_all_v(w, NULL, to, buf, from, COMM_REAL, NULL) == -1);
  CHECK_MSG(!strcmp(comm_error(), "comm all-to-all on world: NULL buffer for 3 elements"), "%s", comm_error());

  struct comm_request *req = (struct comm_request *)buf; /* set to NULL by a refused call */
  CHECK(comm_all_to_all_v(w, buf, to, NULL, from, COMM_REAL, &req) == -1 && req == NULL);
  CHECK_MSG(!strcmp(comm_error(), "comm all-to-all on world: NULL buffer for 7 elements"), "%s", comm_error());

  struct comm_counter after = comm_counter_get(w, COMM_ALL_TO_ALL);
  CHECK(after.calls == before.calls && after.n_bytes == before.n_bytes && comm_group_seq(w) == seq);
}

static void test_a_chunk_without_every_member_is_refused(void)
{
  unsigned char members[MAX_RANKS] = { 0 };
  members[0] = 1; /* a REPL chunk on rank 0 only */
  CHECK(comm_restrict(members, world) == 0);
  size_t to[MAX_RANKS] = { 0 }, from[MAX_RANKS] = { 0 };
  real x = 0;
  CHECK(comm_all_to_all_v(comm_world(), &x, to, &x + 1, from, COMM_REAL, NULL) == -1);
  CHECK_STR_CONTAINS(comm_error(), "all-to-all on group world needs ranks 1");
  CHECK_STR_CONTAINS(comm_error(), "which this chunk does not run on (it runs on 0)");
  CHECK(comm_restrict(NULL, 0) == 0);
  CHECK_MSG(comm_all_to_all_v(comm_world(), &x, to, &x + 1, from, COMM_REAL, NULL) == 0, "%s", comm_error());
}

static void still_works(void)
{
  struct exchange x;
  exchange_make(&x, comm_world(), 1, COMM_REAL);
  CHECK_MSG(comm_all_to_all_v(comm_world(), x.send, x.to, x.recv, x.from, COMM_REAL, NULL) == 0, "%s", comm_error());
  CHECK(exchange_ok(&x, COMM_REAL, comm_world(), "an all-to-all after a refused one"));
  exchange_free(&x);
}

static void test_check_mode_names_the_pair_whose_counts_differ(void)
{
  struct comm_group *w = comm_world();
  comm_set_check(1);
  still_works(); /* agreeing counts pass the check */
  struct exchange x;
  exchange_make(&x, w, 1, COMM_REAL);
  /* group rank 0 sends one element more to the last rank than that rank expects; the data
   * would arrive truncated, or not at all */
  real *more = malloc((x.sent + 1) * sizeof *more);
  memcpy(more, x.send, x.sent * sizeof *more);
  more[x.sent] = 0;
  if (rank == 0)
    x.to[world - 1]++;
  uint64_t seq = comm_group_seq(w);
  CHECK(comm_all_to_all_v(w, more, x.to, x.recv, x.from, COMM_REAL, NULL) == -1);
  char want[512];
  snprintf(want, sizeof want, "comm check on world before all-to-all seq %llu: group rank 0 (world rank 0) sends %zu "
           "elements to group rank %d (world rank %d), which expects %zu from it", (unsigned long long)seq,
           count(0, world - 1, 1) + 1, world - 1, world - 1, count(0, world - 1, 1));
  CHECK_MSG(!strcmp(comm_error(), want), "rank %d: %s", rank, comm_error());
  if (rank == 0)
    x.to[world - 1]--;
  still_works();

  /* the per-peer form on one rank, the uniform one on the others */
  real a[MAX_RANKS] = { 0 }, b[MAX_RANKS];
  size_t ones[MAX_RANKS];
  for (int j = 0; j < world; j++)
    ones[j] = 1;
  seq = comm_group_seq(w);
  int rc = rank == 1 ? comm_all_to_all_v(w, a, ones, b, ones, COMM_REAL, NULL)
                     : comm_all_to_all(w, a, b, 1, COMM_REAL, NULL);
  CHECK(rc == -1);
  snprintf(want, sizeof want, "comm check on world before all-to-all seq %llu (as group rank 0 sees it): group rank 1 "
           "(world rank 1) has n_bytes per-peer counts where group rank 0 (world rank 0) has n_bytes %zu",
           (unsigned long long)seq, (size_t)world * sizeof(real));
  CHECK_MSG(!strcmp(comm_error(), want), "rank %d: %s", rank, comm_error());
  still_works();
  comm_set_check(0);
  free(more);
  exchange_free(&x);
}

/* Rank 1 never arrives at the second all-to-all; the others' watchdogs diagnose it. */
static int watchdog_run(void)
{
  struct comm_group *w = comm_world();
  size_t to[MAX_RANKS], sent = 0;
  for (int j = 0; j < world; j++)
    sent += to[j] = (size_t)(rank + j + 1);
  size_t from[MAX_RANKS];
  /* fp32 in either build: all_to_all_watchdog.sh expects these bytes */
  float *send = calloc(sent, sizeof *send), *recv = calloc(8 * MAX_RANKS, sizeof *recv);
  for (int mb = 0; mb < 2; mb++) {
    comm_set_step(7, mb);
    if (mb == 1 && rank == 1)
      sleep(30);
    for (int j = 0; j < world; j++)
      from[j] = (size_t)(j + rank + 1);
    if (comm_all_to_all_v(w, send, to, recv, from, COMM_FP32, NULL))
      comm_fatal("%s", comm_error());
  }
  fprintf(stderr, "rank %d: the second all-to-all finished: the watchdog did not fire\n", rank);
  free(send);
  free(recv);
  return 1;
}

int main(int argc, char **argv)
{
  char err[512];
  if (comm_init(&argc, &argv, err, sizeof err))
    comm_fatal("%s", err);
  rank = comm_world()->rank;
  world = comm_world()->size;
  if (world > MAX_RANKS)
    comm_fatal("at most %d ranks", MAX_RANKS);
  if (argc > 1 && !strcmp(argv[1], "watchdog")) {
    int status = watchdog_run();
    comm_finalize(err, sizeof err);
    return status;
  }
  trace_path = argc > 1 ? argv[1] : "mpi_all_to_all_trace.json";
  if (comm_group_split(comm_world(), 0, world - rank, "reversed", &reversed, err, sizeof err) ||
      comm_group_split(comm_world(), rank / 2, rank, "pairs", &pairs, err, sizeof err))
    comm_fatal("%s", err);
  const struct test_case tests[] = {
    TEST(test_uneven_counts_with_zeros_arrive_in_peer_order), TEST(test_exchanged_counts_size_the_exchange),
    TEST(test_several_in_flight_finish_in_issue_order), TEST(test_counters_hold_the_bytes_sent),
    TEST(test_recorder_names_the_op_with_the_bytes_sent), TEST(test_trace_shows_each_rank_s_all_to_all),
    TEST(test_refusals_name_the_cause_and_count_nothing), TEST(test_a_chunk_without_every_member_is_refused),
    TEST(test_check_mode_names_the_pair_whose_counts_differ),
  };
  int status = mpi_test_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
  if (comm_finalize(err, sizeof err))
    comm_fatal("%s", err);
  return status;
}
