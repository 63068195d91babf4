/* What `tycho check` shows of a schedule: the text timeline against hand-drawn goldens, the
 * cut of a wide one, the JSON's facts, and sched_from_plan on hand-built and shipped plans. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>

#include "check.h"
#include "plan/compile.h"
#include "sched/sched.h"

static char source_dir[1024] = ".";

/* The timeline of a freshly built and simulated schedule, as a malloc'd string. */
static char *timeline(enum plan_schedule kind, int pp, int m, int v, int width)
{
  struct sched s;
  struct sched_sim r;
  char err[512];
  CHECK(sched_build(&s, kind, pp, m, v, NULL, err, sizeof err) == 0);
  CHECK(sched_simulate(&s, &r, err, sizeof err) == 0);
  FILE *f = tmpfile();
  sched_print_timeline(f, &s, &r, width);
  long n = ftell(f);
  rewind(f);
  char *text = calloc((size_t)n + 1, 1);
  CHECK(fread(text, 1, (size_t)n, f) == (size_t)n);
  fclose(f);
  sched_sim_free(&r);
  sched_free(&s);
  return text;
}

static void test_timeline_1f1b_pp4_m8_as_drawn_by_hand(void)
{
  const char *want =
    "schedule 1f1b: pp 4, 8 micro-batches; one column = 1 time unit\n"
    "time   | 0              5              10             15             20             25             30\n"
    "rank 0 | F0 F1 F2 F3 .  .  .  .  .  .  B0 -- F4 B1 -- F5 B2 -- F6 B3 -- F7 B4 -- .  B5 -- .  B6 -- .  B7 --\n"
    "rank 1 | .  F0 F1 F2 .  .  .  .  B0 -- F3 B1 -- F4 B2 -- F5 B3 -- F6 B4 -- F7 B5 -- .  B6 -- .  B7 -- .  .\n"
    "rank 2 | .  .  F0 F1 .  .  B0 -- F2 B1 -- F3 B2 -- F4 B3 -- F5 B4 -- F6 B5 -- F7 B6 -- .  B7 -- .  .  .  .\n"
    "rank 3 | .  .  .  F0 B0 -- F1 B1 -- F2 B2 -- F3 B3 -- F4 B4 -- F5 B5 -- F6 B6 -- F7 B7 -- .  .  .  .  .  .\n"
    "F<mb> forward, B<mb> backward, R<mb> recompute, -- still running, . idle\n"
    "makespan 33, bubble 27.3% (idle / (pp × makespan)) = 37.5% of the ideal time (idle / busy)\n"
    "peak in-flight micro-batches per rank: 4 3 2 1\n";
  char *got = timeline(PLAN_SCHED_1F1B, 4, 8, 1, 0);
  CHECK_MSG(strcmp(got, want) == 0, "got:\n%s", got);
  free(got);
}

static void test_timeline_interleaved_pp2_v2_m4_shows_chunks(void)
{
  const char *want =
    "schedule interleaved: pp 2 × 2 virtual stages, 4 micro-batches; one column = 1 time unit\n"
    "time   | 0                   5                   10                  15                  20                  25\n"
    "rank 0 | F0a F1a F0b F1b F2a .   B0b --  F3a B1b --  F2b B0a --  F3b B1a --  .   B2b --  .   B3b --  B2a --  B3a --\n"
    "rank 1 | .   F0a F1a F0b B0b --  F1b B1b --  F2a B0a --  F3a B1a --  F2b B2b --  F3b B3b --  B2a --  B3a --  .   .\n"
    "F<mb> forward, B<mb> backward, R<mb> recompute, -- still running, . idle\n"
    "chunks: a = stages 0..1, b = stages 2..3\n"
    "makespan 27, bubble 11.1% (idle / (pp × makespan)) = 12.5% of the ideal time (idle / busy)\n"
    "peak in-flight chunk micro-batches per rank: 5 3 (each 1/2 of a rank's layers)\n";
  char *got = timeline(PLAN_SCHED_INTERLEAVED, 2, 4, 2, 0);
  CHECK_MSG(strcmp(got, want) == 0, "got:\n%s", got);
  free(got);
}

/* A long step keeps its warm-up and cool-down, cuts the middle, and says so; no line of the
 * grid is wider than asked. */
static void test_timeline_of_many_microbatches_is_cut_and_says_so(void)
{
  char *got = timeline(PLAN_SCHED_1F1B, 2, 40, 1, 60);
  CHECK_STR_CONTAINS(got, "rank 0 | F0  F1  .   .   B0  --  ... B38 --  .   B39 --\n");
  CHECK_STR_CONTAINS(got, "rank 1 | .   F0  B0  --  F1  B1  ... F39 B39 --  .   .\n");
  CHECK_STR_CONTAINS(got, "(11 of 123 columns shown: the first 6 and the last 5; the middle repeats the steady state)\n");
  free(got);
  got = timeline(PLAN_SCHED_INTERLEAVED, 8, 64, 4, 0);
  for (char *line = got; *line;) {
    char *end = strchr(line, '\n');
    if (strncmp(line, "rank ", 5) == 0 || strncmp(line, "time ", 5) == 0)
      CHECK_MSG(end - line <= 120, "%.*s", (int)(end - line), line);
    line = end + 1;
  }
  CHECK_STR_CONTAINS(got, "columns shown");
  CHECK_STR_CONTAINS(got, "chunks: a = stages 0..7, b = stages 8..15, c = stages 16..23, d = stages 24..31\n");
  free(got);
}

static int count(const char *hay, const char *needle)
{
  int n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
    n++;
  return n;
}

/* The JSON carries the same numbers as the simulation and one entry per compute instruction. */
static void test_json_has_the_simulated_facts(void)
{
  struct sched s;
  struct sched_sim r;
  char err[512];
  CHECK(sched_1f1b(&s, 4, 8, 1, NULL, err, sizeof err) == 0);
  CHECK(sched_simulate(&s, &r, err, sizeof err) == 0);
  struct strbuf b;
  struct json j;
  sb_init(&b);
  json_init(&j, &b);
  sched_json(&j, &s, &r);
  CHECK(!b.failed);
  CHECK_STR_CONTAINS(b.s, "{\"kind\":\"1f1b\",\"pp\":4,\"virtual_stages\":1,\"microbatches\":8,");
  CHECK_STR_CONTAINS(b.s, "\"makespan\":33,\"idle\":36,\"bubble_fraction\":0.2727272727272727,\"bubble_over_ideal\":0.375,");
  CHECK_STR_CONTAINS(b.s, "{\"rank\":0,\"busy\":24,\"finish\":33,\"peak_inflight\":4,\"compute\":[{\"op\":\"fwd\",\"stage\":0,"
                          "\"chunk\":0,\"mb\":0,\"start\":0,\"end\":1},");
  CHECK_STR_CONTAINS(b.s, "{\"op\":\"bwd\",\"stage\":3,\"chunk\":0,\"mb\":7,\"start\":25,\"end\":27}");
  CHECK_STR_CONTAINS(b.s, "\"recompute\":[null,null,null,null]");
  CHECK(count(b.s, "\"op\":\"fwd\"") == 32 && count(b.s, "\"op\":\"bwd\"") == 32);
  CHECK(count(b.s, "\"op\":\"reduce_grads\"") == 4 && count(b.s, "\"op\":\"optimizer\"") == 4);
  CHECK(count(b.s, "{") == count(b.s, "}") && count(b.s, "[") == count(b.s, "]"));
  sb_free(&b);
  sched_sim_free(&r);
  sched_free(&s);
}

/* A plan built by hand: two stages of 3 and 1 layers (no LM head), full recompute on the last
 * layer, the attention core recomputed on the first. Costs are FLOPs scaled so the mean stage
 * forward is 1: forward 1.5 and 0.5, backward twice that, recompute the recomputed parts. */
static void test_from_plan_costs_follow_layers_and_recompute(void)
{
  struct plan p;
  plan_init(&p);
  p.model = (struct plan_model){ .n_layers = 4, .dim = 64, .n_heads = 4, .n_kv_heads = 4, .ffn_dim = 128,
                                 .vocab = 256, .head_dim = 16 };
  p.mesh.pp = 2;
  p.virtual_stages = 1;
  p.n_stages = 2;
  p.schedule = PLAN_SCHED_1F1B;
  p.batch.seq = 32;
  p.batch.microbatches = 4;
  struct plan_stage stages[2] = { { 0, 0, 0, 0, 3, 1, 0 }, { 1, 1, 0, 3, 1, 0, 0 } };
  struct plan_layer layers[4] = { { .stage = 0, .recompute = PLAN_RC_ATTN_CORE }, { .stage = 0 }, { .stage = 0 },
                                  { .stage = 1, .recompute = PLAN_RC_FULL } };
  p.stages = stages;
  p.layers = layers;
  struct sched s;
  struct sched_sim r;
  char err[512];
  CHECK_MSG(sched_from_plan(&p, &s, err, sizeof err) == 0, "%s", err);
  CHECK(s.kind == PLAN_SCHED_1F1B && s.pp == 2 && s.m == 4 && s.v == 1);
  /* Costs are ratios of FLOP counts in double: a rounding or two of 1.1e-16, so 1e-12 says
   * "equal"; a layer on the wrong stage moves them by ≥ 0.1. */
  CHECK_NEAR(s.costs.fwd[0], 1.5, 1e-12);
  CHECK_NEAR(s.costs.fwd[1], 0.5, 1e-12);
  CHECK_NEAR(s.costs.bwd[0], 3.0, 1e-12);
  CHECK_NEAR(s.costs.bwd[1], 1.0, 1e-12);
  /* per layer: q,k,v,o 32768, attention core 2·T·C = 4096, MLP 6·C·F = 49152; mean stage 2 layers */
  CHECK_NEAR(s.costs.recompute[0], 4096.0 / (2 * 86016.0), 1e-12);
  CHECK_NEAR(s.costs.recompute[1], 0.5, 1e-12);
  CHECK(s.recompute[0] == 1 && s.recompute[1] == 1);
  CHECK_MSG(sched_simulate(&s, &r, err, sizeof err) == 0, "%s", err);
  /* the heavy first stage sets the pace: 4 × (1.5 + 3 + recompute) on rank 0, then the tail */
  CHECK(r.makespan >= 4 * (4.5 + s.costs.recompute[0]));
  CHECK(r.bubble_fraction > 0.25 && r.bubble_fraction < 0.5);
  sched_sim_free(&r);
  sched_free(&s);
  /* the head adds 2·C·V FLOPs to the stage that holds it */
  stages[1].has_head = 1;
  CHECK(sched_from_plan(&p, &s, err, sizeof err) == 0);
  double head = 2.0 * 64 * 256, mean = (4 * 86016.0 + head) / 2;
  CHECK_NEAR(s.costs.fwd[1], (86016.0 + head) / mean, 1e-12);
  sched_free(&s);
  /* zb-h1 splits each backward: W is the linears' share (the forward less the attention core,
   * which has no weights), of a backward twice the forward */
  p.schedule = PLAN_SCHED_ZB_H1;
  p.batch.microbatches = 2;
  CHECK_MSG(sched_from_plan(&p, &s, err, sizeof err) == 0, "%s", err);
  CHECK(s.split == 1);
  CHECK_NEAR(s.costs.w_share[0], (3 * 86016.0 - 3 * 4096.0) / (2 * 3 * 86016.0), 1e-12);
  CHECK_NEAR(s.costs.w_share[1], (86016.0 + head - 4096.0) / (2 * (86016.0 + head)), 1e-12);
  sched_free(&s);
  /* and a plan the generators cannot serve is refused, not crashed on */
  p.schedule = PLAN_SCHED_INTERLEAVED;
  p.virtual_stages = 1;
  CHECK(sched_from_plan(&p, &s, err, sizeof err) == SCHED_INVALID);
  sched_free(&s);
  p.stages = NULL;
  p.layers = NULL;
  plan_free(&p);
}

/* The shipped 70B plan (pp 4, 1F1B, 512 micro-batches per step on 64 ranks, selective
 * recompute) and its interleaved variant: complete, free of deadlock, and a bubble close to
 * the textbook figure, a little above it because the last stage also holds the LM head. */
static void test_from_shipped_70b_plan(void)
{
  char path[1200];
  snprintf(path, sizeof path, "%s/plans/llama2_70b.lua", source_dir);
  const char *sets[2][2] = { { "schedule.kind=1f1b", "virtual_stages=1" },
                             { "schedule.kind=interleaved", "virtual_stages=2" } };
  for (int k = 0; k < 2; k++) {
    struct plan p;
    struct plan_compile_options opt = { 0 };
    opt.world = 64;
    opt.sets = sets[k];
    opt.n_sets = 2;
    char err[1024];
    int rc = plan_compile(path, &opt, &p, err, sizeof err);
    CHECK_MSG(rc == 0, "%s", err);
    if (rc)
      continue;
    struct sched s;
    struct sched_sim r;
    CHECK_MSG(sched_from_plan(&p, &s, err, sizeof err) == 0, "%s", err);
    CHECK(s.pp == 4 && s.v == k + 1 && s.m == p.batch.microbatches && s.m > 100);
    CHECK(s.recompute[0] == 1);
    CHECK_MSG(sched_simulate(&s, &r, err, sizeof err) == 0, "%s", err);
    double ideal = 3.0 / (s.v * s.m); /* (p−1)/(v·m) */
    CHECK_MSG(r.bubble_over_ideal >= ideal * 0.99 && r.bubble_over_ideal < ideal + 0.03,
              "%s: bubble/ideal %.5f, textbook %.5f", plan_schedule_name(s.kind), r.bubble_over_ideal, ideal);
    sched_sim_free(&r);
    sched_free(&s);
    plan_free(&p);
  }
}

int main(void)
{
  const char *src = getenv("TYCHO_SOURCE_DIR");
  if (src)
    snprintf(source_dir, sizeof source_dir, "%s", src);
  static const struct test_case tests[] = {
    TEST(test_timeline_1f1b_pp4_m8_as_drawn_by_hand),
    TEST(test_timeline_interleaved_pp2_v2_m4_shows_chunks),
    TEST(test_timeline_of_many_microbatches_is_cut_and_says_so),
    TEST(test_json_has_the_simulated_facts),
    TEST(test_from_plan_costs_follow_layers_and_recompute),
    TEST(test_from_shipped_70b_plan),
  };
  return test_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
}
