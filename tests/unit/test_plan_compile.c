/* The plan compiler end to end: shipped plans at several world sizes, --set overrides,
 * function-valued fields, tycho.extend, hash stability, source maps and the mesh.
 * (test_plan_moe.c holds the mixture-of-experts plans' tests.) */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "plan_files.h"
#include "check/check.h"
#include "layout/supported.h"
#include "lua/srcmap.h"
#include "mesh/mesh.h"
#include "plan/compile.h"
#include "util/devices.h"

/* The hash of the plan in test_hash_golden_value. */
#define GOLDEN_PLAN_HASH 0x1b8d78e77922f5ebull


/* Shipped plans compile at several world sizes with the arithmetic a user would do by hand. */
static void test_shipped_plans_at_world_sizes(void)
{
  static const struct { const char *plan; int world, dp, micro_batches, stage0_layers; } cases[] = {
    { "plans/tiny.lua", 1, 1, -1, 4 },
    { "plans/llama2_7b.lua", 8, 4, 256, 32 },
    { "plans/llama2_7b.lua", 16, 8, 128, 32 },
    { "plans/llama2_7b.lua", 1024, 512, 2, 32 },
    { "plans/llama2_70b.lua", 64, 2, 512, 20 },
    { "plans/llama2_70b.lua", 128, 4, 256, 20 },
    { "plans/llama2_70b.lua", 4096, 128, 8, 20 },
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char path[1200], err[2048];
    struct plan p;
    path_of(path, sizeof path, cases[i].plan);
    int rc = compile_with(path, cases[i].world, NULL, 0, &p, err, sizeof err);
    CHECK_MSG(rc == 0, "%s --world %d: %s", cases[i].plan, cases[i].world, err);
    if (rc)
      continue;
    CHECK(p.mesh.world == cases[i].world);
    CHECK_MSG(p.mesh.dp == cases[i].dp, "%s: dp %d", cases[i].plan, p.mesh.dp);
    if (cases[i].micro_batches > 0)
      CHECK_MSG(p.batch.microbatches == cases[i].micro_batches, "%s: %d micro-batches", cases[i].plan,
                p.batch.microbatches);
    CHECK((long long)p.batch.micro * p.batch.microbatches * p.mesh.dp == p.batch.global);
    CHECK(p.stages[0].n_layers == cases[i].stage0_layers && p.stages[0].has_embed);
    CHECK(p.stages[p.n_stages - 1].has_head);
    int total = 0;
    for (int s = 0; s < p.n_stages; s++)
      total += p.stages[s].n_layers;
    CHECK(total == p.model.n_layers);

    /* the JSON lists every rank and every group exactly once */
    struct strbuf b;
    sb_init(&b);
    check_write_json(&p, NULL, &b);
    CHECK(!b.failed);
    int ranks = 0;
    const char *list = NULL; /* the top-level "ranks" is the document's last (schedule has its own) */
    for (const char *s = b.s; (s = strstr(s, "\"ranks\":[")); s++)
      list = s;
    CHECK(list != NULL);
    for (const char *s = list; s && (s = strstr(s, "{\"rank\":")); s++)
      ranks++;
    CHECK(strstr(b.s, "\"schedule\":{") != NULL);
    CHECK_MSG(ranks == cases[i].world, "%d rank records for world %d", ranks, cases[i].world);
    CHECK(b.s[0] == '{' && b.s[b.n - 2] == '}');
    sb_free(&b);
    plan_free(&p);
  }
}

static void test_llama_parameter_counts(void)
{
  char path[1200], err[2048];
  struct plan p;
  path_of(path, sizeof path, "plans/llama2_7b.lua");
  CHECK(compile_with(path, 8, NULL, 0, &p, err, sizeof err) == 0);
  CHECK(plan_param_count(&p) == 6738415616LL); /* Llama-2-7b-hf's published count */
  plan_free(&p);
  path_of(path, sizeof path, "plans/llama2_70b.lua");
  CHECK(compile_with(path, 64, NULL, 0, &p, err, sizeof err) == 0);
  CHECK(plan_param_count(&p) == 68976648192LL); /* Llama-2-70b-hf */
  plan_free(&p);
}

static void test_set_overrides(void)
{
  char path[1200], err[2048];
  struct plan p;
  path_of(path, sizeof path, "plans/llama2_7b.lua");
  const char *sets[] = { "mesh.tp=4", "zero=0", "optimizer.lr=0.01", "data.shuffle=false",
                         "recompute=attn_core,mlp_act", "name=overridden", "batch.micro=2",
                         "schedule.kind=gpipe", "seeds.data=77" };
  int rc = compile_with(path, 16, sets, (int)(sizeof sets / sizeof sets[0]), &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (rc)
    return;
  CHECK(p.mesh.tp == 4 && p.mesh.dp == 4);
  CHECK(p.zero == 0);
  CHECK(p.optimizer.lr == 0.01);
  CHECK(p.data.shuffle == 0);
  CHECK(p.layers[5].recompute == (PLAN_RC_ATTN_CORE | PLAN_RC_MLP_ACT));
  CHECK(strcmp(p.name, "overridden") == 0);
  CHECK(p.batch.micro == 2 && p.batch.microbatches == 128);
  CHECK(p.schedule == PLAN_SCHED_GPIPE);
  CHECK(p.seeds.value[PLAN_SEED_DATA] == 77 && !p.seeds.derived[PLAN_SEED_DATA]);
  CHECK(p.seeds.derived[PLAN_SEED_MODEL]);
  /* the overridden field's place is the command line */
  CHECK_STR_CONTAINS(plan_where(&p, "mesh.tp"), "--set mesh.tp=4");
  CHECK_STR_CONTAINS(plan_where(&p, "mesh.pp"), "llama2_7b.lua:");
  plan_free(&p);
}

/* comm: "auto" unless given, each name as written; only a comm that is not "auto" enters the plan
 * JSON (plans without it keep their hash); "nccl" is refused by the runtime's rules (no NCCL
 * backend in this build), the others pass them; an unknown value is refused naming the choices. */
static void test_comm_field(void)
{
  char path[1200], err[2048];
  struct plan p;
  path_of(path, sizeof path, "plans/tiny.lua");
  CHECK(compile_with(path, 1, NULL, 0, &p, err, sizeof err) == 0);
  CHECK(p.comm == PLAN_COMM_AUTO && trainer_plan_supported(&p, err, sizeof err) == 0);
  const uint64_t h_auto = plan_hash(&p);
  plan_free(&p);
  const char *names[] = { "auto", "staged", "mpi", "nccl" };
  for (int c = PLAN_COMM_AUTO; c <= PLAN_COMM_NCCL; c++) {
    char set[32];
    snprintf(set, sizeof set, "comm=%s", names[c]);
    const char *sets[] = { set };
    CHECK(compile_with(path, 1, sets, 1, &p, err, sizeof err) == 0);
    CHECK((int)p.comm == c && strcmp(plan_comm_name(p.comm), names[c]) == 0);
    CHECK(c == PLAN_COMM_AUTO ? plan_hash(&p) == h_auto : plan_hash(&p) != h_auto);
    struct strbuf b;
    sb_init(&b);
    check_write_json(&p, NULL, &b);
    char field[48];
    snprintf(field, sizeof field, "\"comm\":\"%s\"", names[c]);
    CHECK(!b.failed && b.s && (strstr(b.s, field) != NULL) == (c != PLAN_COMM_AUTO));
    sb_free(&b);
    err[0] = '\0';
    /* every value compiles and passes the build's checks; whether it can run is the trainer's
     * (dcomm_choose, tests/unit/test_dcomm_choose.c) */
    CHECK(trainer_plan_supported(&p, err, sizeof err) == 0);
    plan_free(&p);
  }
  const char *bad[] = { "comm=gloo" };
  CHECK(compile_with(path, 1, bad, 1, &p, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "comm = \"gloo\": must be one of \"auto\", \"staged\", \"mpi\", \"nccl\"");
}

/* device: "auto" unless given; "cpu" and "cuda" as written (plan file or --set); the shipped GPU
 * plans say "cuda"; an unknown value is refused at its line with the closest name. Only "cuda"
 * is off this build's CPU runtime, and only a device that is not "auto" enters the plan JSON
 * (so the hash of a plan without it is what it was). */
static void test_device_field(void)
{
  char path[1200], err[2048];
  struct plan p;
  path_of(path, sizeof path, "plans/tiny.lua");
  CHECK(compile_with(path, 1, NULL, 0, &p, err, sizeof err) == 0);
  CHECK(p.device == PLAN_DEVICE_AUTO && plan_on_cpu(&p));
  const uint64_t h_auto = plan_hash(&p);
  plan_free(&p);
  const char *auto_set[] = { "device=auto" }, *cpu_set[] = { "device=cpu" }, *cuda_set[] = { "device=cuda" };
  CHECK(compile_with(path, 1, auto_set, 1, &p, err, sizeof err) == 0);
  CHECK(p.device == PLAN_DEVICE_AUTO && plan_hash(&p) == h_auto);
  plan_free(&p);
  CHECK(compile_with(path, 1, cpu_set, 1, &p, err, sizeof err) == 0);
  CHECK(p.device == PLAN_DEVICE_CPU && plan_on_cpu(&p) && plan_hash(&p) != h_auto);
  CHECK_STR_CONTAINS(plan_where(&p, "device"), "--set device=cpu");
  plan_free(&p);
  CHECK(compile_with(path, 1, cuda_set, 1, &p, err, sizeof err) == 0);
  CHECK(p.device == PLAN_DEVICE_CUDA && !plan_on_cpu(&p));
  struct strbuf b;
  sb_init(&b);
  check_write_json(&p, NULL, &b);
  CHECK(!b.failed && b.s);
  if (b.s) {
    CHECK_STR_CONTAINS(b.s, devices_cuda_built() ? "\"runtime\":\"cuda\",\"runtime_note\":\"the byte figures are the GPU"
                                                 : "\"runtime\":\"cuda\",\"runtime_note\":\"no CUDA backend in this build");
    CHECK_STR_CONTAINS(b.s, "},\"device\":\"cuda\",\"optimizer\":{"); /* in the plan, after precision */
  }
  sb_free(&b);
  plan_free(&p);
  CHECK(strcmp(plan_device_name(PLAN_DEVICE_AUTO), "auto") == 0);
  CHECK(strcmp(plan_device_name(PLAN_DEVICE_CPU), "cpu") == 0 && strcmp(plan_device_name(PLAN_DEVICE_CUDA), "cuda") == 0);

  path_of(path, sizeof path, "plans/llama2_7b.lua");
  CHECK(compile_with(path, 8, NULL, 0, &p, err, sizeof err) == 0);
  CHECK(p.device == PLAN_DEVICE_CUDA);
  CHECK_STR_CONTAINS(plan_where(&p, "device"), "llama2_7b.lua:");
  plan_free(&p);
  path_of(path, sizeof path, "plans/llama2_70b.lua");
  CHECK(compile_with(path, 64, cpu_set, 1, &p, err, sizeof err) == 0);
  CHECK(p.device == PLAN_DEVICE_CPU && plan_on_cpu(&p));
  plan_free(&p);

  const char *bad = tmp_plan("device_bad.lua",
           "local tycho = require \"tycho\"\n"
           "return tycho.plan {\n"
           "  model = { n_layers = 2, dim = 64, n_heads = 4, ffn_dim = 128, vocab = 64, max_seq = 64 },\n"
           "  batch = { global = 8, micro = 2, seq = 32 },\n"
           "  device = \"cdua\",\n"
           "}\n");
  CHECK(compile_with(bad, 1, NULL, 0, &p, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "device_bad.lua:5: device = \"cdua\": must be one of \"auto\", \"cpu\", \"cuda\" "
                          "(did you mean \"cuda\"?)");
  const char *gpu_set[] = { "device=gpu" }, *num_set[] = { "device=1" };
  path_of(path, sizeof path, "plans/tiny.lua");
  CHECK(compile_with(path, 1, gpu_set, 1, &p, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "--set device=gpu: device = \"gpu\": must be one of \"auto\", \"cpu\", \"cuda\" "
                          "(did you mean \"cuda\"?");
  CHECK(compile_with(path, 1, num_set, 1, &p, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "device = 1: must be one of \"auto\", \"cpu\", \"cuda\"");
}

static const char *function_plan =
  "local tycho = require \"tycho\"\n"
  "return tycho.plan {\n"
  "  model = { n_layers = 6, dim = 64, n_heads = 4, n_kv_heads = 2, ffn_dim = 128, vocab = 100, max_seq = 64 },\n"
  "  mesh = { tp = 2, pp = 3 },\n"
  "  batch = { global = 12, micro = 2, seq = 32 },\n"
  "  stages = function(layer) return layer < 1 and 0 or (layer < 4 and 1 or 2) end,\n"
  "  tp_split = function(layer, module)\n"
  "    if layer == 0 then return \"replicate\" end\n"
  "    if module == \"head\" then return \"replicate\" end\n"
  "  end,\n"
  "  recompute = function(layer) if layer % 2 == 1 then return \"full\" end end,\n"
  "}\n";

static void test_function_fields(void)
{
  char err[2048];
  struct plan p;
  int rc = compile_with(tmp_plan("functions.lua", function_plan), 12, NULL, 0, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (rc)
    return;
  CHECK(p.stages_kind == PLAN_STAGES_FUNCTION && p.tp_split_is_function && p.recompute_is_function);
  CHECK(p.stages[0].first_layer == 0 && p.stages[0].n_layers == 1);
  CHECK(p.stages[1].first_layer == 1 && p.stages[1].n_layers == 3);
  CHECK(p.stages[2].first_layer == 4 && p.stages[2].n_layers == 2);
  CHECK(p.layers[0].split[PLAN_MOD_Q] == PLAN_SPLIT_REPLICATE);
  CHECK(p.layers[0].split[PLAN_MOD_DOWN] == PLAN_SPLIT_REPLICATE);
  CHECK(p.layers[1].split[PLAN_MOD_Q] == PLAN_SPLIT_COLUMN); /* nil: the default */
  CHECK(p.layers[1].split[PLAN_MOD_O] == PLAN_SPLIT_ROW);
  CHECK(p.embed_split == PLAN_SPLIT_VOCAB && p.head_split == PLAN_SPLIT_REPLICATE);
  CHECK(p.layers[0].recompute == 0 && p.layers[1].recompute == PLAN_RC_FULL && p.layers[2].recompute == 0);
  CHECK(p.model.vocab_padded == 100);
  plan_free(&p);
}

static void test_extend_merges_deeply_and_replaces_lists(void)
{
  tmp_plan("ext_base.lua",
           "local tycho = require \"tycho\"\n"
           "return tycho.plan {\n"
           "  model = { n_layers = 4, dim = 64, n_heads = 4, ffn_dim = 128, vocab = 64, max_seq = 64 },\n"
           "  mesh = { tp = 1, pp = 2, dp = 1 },\n"
           "  stages = { { \"embed\", 0 }, { 1, 2, 3, \"head\" } },\n"
           "  recompute = { \"attn_core\", \"mlp_act\" },\n"
           "  optimizer = { lr = 0.5, beta2 = 0.9 },\n"
           "  batch = { global = 8, micro = 2, seq = 32 },\n"
           "}\n");
  const char *child = tmp_plan("ext_child.lua",
           "local tycho = require \"tycho\"\n"
           "local base = require \"ext_base\"\n"
           "local child = tycho.extend(base, {\n"
           "  stages = { { \"embed\", 0, 1, 2 }, { 3, \"head\" } },\n"
           "  recompute = { \"mlp\" },\n"
           "  optimizer = { lr = 0.25 },\n"
           "})\n"
           "assert(base.optimizer.lr == 0.5, 'extend must not change its base')\n"
           "return child\n");
  char err[2048];
  struct plan p;
  int rc = compile_with(child, 2, NULL, 0, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (rc)
    return;
  CHECK(p.optimizer.lr == 0.25);      /* overridden */
  CHECK(p.optimizer.beta2 == 0.9);    /* kept from the base: tables merge */
  CHECK(p.layers[0].recompute == PLAN_RC_MLP); /* lists replace */
  CHECK(p.stages[0].n_layers == 3 && p.stages[1].n_layers == 1);
  CHECK_STR_CONTAINS(plan_where(&p, "optimizer.lr"), "ext_child.lua:6");
  CHECK_STR_CONTAINS(plan_where(&p, "optimizer.beta2"), "ext_base.lua:7");
  plan_free(&p);
}

static void test_hash_is_stable_and_sensitive(void)
{
  char path[1200], err[2048];
  struct plan a, b;
  path_of(path, sizeof path, "plans/llama2_70b.lua");
  CHECK(compile_with(path, 64, NULL, 0, &a, err, sizeof err) == 0);
  CHECK(compile_with(path, 64, NULL, 0, &b, err, sizeof err) == 0);
  uint64_t h = plan_hash(&a);
  CHECK(h == plan_hash(&b));
  /* The same plan file in another folder hashes the same. */
  char src[1200];
  path_of(src, sizeof src, "plans/llama2_70b.lua");
  FILE *in = fopen(src, "r");
  CHECK(in != NULL);
  if (in) {
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, in);
    text[n] = 0;
    fclose(in);
    struct plan c;
    CHECK(compile_with(tmp_plan("moved.lua", text), 64, NULL, 0, &c, err, sizeof err) == 0);
    CHECK_MSG(plan_hash(&c) == h, "a copy of the plan hashes %016llx, the original %016llx",
              (unsigned long long)plan_hash(&c), (unsigned long long)h);
    plan_free(&c);
  }
  /* Setting a field to the value it has changes nothing; any other value changes the hash. */
  const char *same[] = { "optimizer.lr=1.5e-4" };
  const char *lr[] = { "optimizer.lr=1.6e-4" };
  const char *seed[] = { "seeds.dropout=5" };
  struct plan c;
  CHECK(compile_with(path, 64, same, 1, &c, err, sizeof err) == 0);
  CHECK(plan_hash(&c) == h);
  plan_free(&c);
  CHECK(compile_with(path, 64, lr, 1, &c, err, sizeof err) == 0);
  CHECK(plan_hash(&c) != h);
  plan_free(&c);
  CHECK(compile_with(path, 64, seed, 1, &c, err, sizeof err) == 0);
  CHECK(plan_hash(&c) != h);
  plan_free(&c);
  CHECK(compile_with(path, 128, NULL, 0, &c, err, sizeof err) == 0); /* another world: dp differs */
  CHECK(plan_hash(&c) != h);
  plan_free(&c);
  plan_free(&a);
  plan_free(&b);
}

/* The same plan hashes to the same value on every machine and every run: the value is pinned
 * here. It changes only when the compiled plan's JSON schema changes (update it then, on
 * purpose, and say so in the commit). */
static void test_hash_golden_value(void)
{
  char err[2048];
  struct plan p;
  const char *path = tmp_plan("golden.lua",
           "local tycho = require \"tycho\"\n"
           "return tycho.plan {\n"
           "  name = \"golden\",\n"
           "  model = { n_layers = 2, dim = 64, n_heads = 4, ffn_dim = 128, vocab = 64, max_seq = 64 },\n"
           "  mesh = { tp = 2, pp = 1, dp = 2 },\n"
           "  batch = { global = 8, micro = 2, seq = 32 },\n"
           "  optimizer = { lr = 3e-4 },\n"
           "}\n");
  CHECK(compile_with(path, 0, NULL, 0, &p, err, sizeof err) == 0);
  printf("golden plan hash %016llx\n", (unsigned long long)plan_hash(&p));
  CHECK(plan_hash(&p) == GOLDEN_PLAN_HASH);
  plan_free(&p);
}

static void test_srcmap_keeps_lines_and_finds_keys(void)
{
  const char *src =
    "-- a comment with { braces } and \"quotes\"\n"
    "local s = [[ a long string {\n"
    "with } braces ]]\n"
    "local t = { a = 1,\n"
    "  b = { c = 2, 'x',\n"
    "        [\"d\"] = 3 },\n"
    "  f = function(x, y) local p, q = 1, 2; return { p } end,\n"
    "  10,\n"
    "}\n"
    "return f{ g = 1 }\n";
  struct srcmap m;
  srcmap_init(&m);
  size_t n = 0;
  char *out = srcmap_rewrite(&m, "x.lua", src, strlen(src), &n);
  CHECK(out != NULL);
  if (!out)
    return;
  int lines_in = 0, lines_out = 0;
  for (const char *c = src; *c; c++)
    lines_in += *c == '\n';
  for (const char *c = out; *c; c++)
    lines_out += *c == '\n';
  CHECK(lines_in == lines_out);
  CHECK_STR_CONTAINS(out, "[[ a long string {\nwith } braces ]]");  /* strings untouched */
  CHECK_STR_CONTAINS(out, "return f(__tycho_tc(");                   /* call form wrapped in () */
  /* record 0 is t: a on line 4, b on 5, f on 7, positional 1 (the 10) on line 8 */
  const struct srcmap_field *fa = srcmap_find_field(&m, 0, "a", 0);
  const struct srcmap_field *fb = srcmap_find_field(&m, 0, "b", 0);
  const struct srcmap_field *ff = srcmap_find_field(&m, 0, "f", 0);
  const struct srcmap_field *f1 = srcmap_find_field(&m, 0, NULL, 1);
  CHECK(fa && fa->line == 4);
  CHECK(fb && fb->line == 5);
  CHECK(ff && ff->line == 7);
  CHECK(f1 && f1->line == 8);
  /* the commas inside the function body are not fields of t */
  CHECK(srcmap_find_field(&m, 0, "q", 0) == NULL && srcmap_find_field(&m, 0, NULL, 2) == NULL);
  /* record 1 is b: c on 5, positional 'x' on 5, ["d"] on 6 */
  const struct srcmap_field *fd = srcmap_find_field(&m, 1, "d", 0);
  CHECK(fd && fd->line == 6);
  CHECK(srcmap_find_field(&m, 1, NULL, 1) && srcmap_find_field(&m, 1, NULL, 1)->line == 5);
  free(out);
  srcmap_free(&m);
}

static void test_mesh_groups_partition_the_world(void)
{
  struct plan_mesh m = { 0 };
  m.tp = 2;
  m.pp = 3;
  m.dp = 4;
  m.cp = 2;
  m.world = 48;
  enum plan_axis orders[2][PLAN_N_AXES] = { { PLAN_AXIS_TP, PLAN_AXIS_DP, PLAN_AXIS_PP, PLAN_AXIS_CP },
                                            { PLAN_AXIS_PP, PLAN_AXIS_CP, PLAN_AXIS_TP, PLAN_AXIS_DP } };
  for (int o = 0; o < 2; o++) {
    memcpy(m.order, orders[o], sizeof m.order);
    for (int ax = 0; ax < PLAN_N_AXES; ax++) {
      int seen[48] = { 0 };
      for (int r = 0; r < m.world; r++) {
        int c[PLAN_N_AXES], members[8];
        mesh_coords(&m, r, c);
        CHECK(mesh_rank(&m, c) == r);
        int size = mesh_group_members(&m, ax, r, members);
        CHECK(size == mesh_axis_size(&m, ax));
        int in = 0;
        for (int i = 0; i < size; i++) {
          int mc[PLAN_N_AXES];
          mesh_coords(&m, members[i], mc);
          CHECK(mc[ax] == i); /* members in coordinate order */
          in |= members[i] == r;
          /* all members share the group index */
          CHECK(mesh_group_index(&m, ax, members[i]) == mesh_group_index(&m, ax, r));
        }
        CHECK(in);
        if (c[ax] == 0)
          for (int i = 0; i < size; i++)
            seen[members[i]]++;
      }
      for (int r = 0; r < m.world; r++)
        CHECK(seen[r] == 1);
    }
  }
  /* default order: tp groups are consecutive ranks, pp outermost */
  memcpy(m.order, orders[0], sizeof m.order);
  int members[8];
  mesh_group_members(&m, PLAN_AXIS_TP, 5, members);
  CHECK(members[0] == 4 && members[1] == 5);
  mesh_group_members(&m, PLAN_AXIS_PP, 1, members);
  CHECK(members[0] == 1 && members[1] == 9 && members[2] == 17);
}

/* mesh.cp: the fourth axis, after tp by default; a three-axis order (a plan written before it)
 * places cp right after tp; four axes are taken as listed. */
static void test_mesh_cp_axis(void)
{
  const char *const orders[] = { NULL, "{ \"dp\", \"tp\", \"pp\" }", "{ \"cp\", \"tp\", \"dp\", \"pp\" }" };
  /* per order: the cp group and the tp group of rank 0 (world 8 = tp 2 × cp 2 × dp 2) */
  const int cp_members[][2] = { { 0, 2 }, { 0, 4 }, { 0, 1 } }, tp_members[][2] = { { 0, 1 }, { 0, 2 }, { 0, 2 } };
  for (int o = 0; o < 3; o++) {
    char text[1024], err[2048];
    snprintf(text, sizeof text,
             "local tycho = require \"tycho\"\n"
             "return tycho.plan {\n"
             "  model = { n_layers = 2, dim = 64, n_heads = 4, n_kv_heads = 2, ffn_dim = 128, vocab = 64, max_seq = 64 },\n"
             "  mesh = { tp = 2, cp = 2%s%s },\n"
             "  batch = { global = 8, micro = 2, seq = 32 },\n"
             "}\n", orders[o] ? ", order = " : "", orders[o] ? orders[o] : "");
    struct plan p;
    int rc = compile_with(tmp_plan("cp.lua", text), 8, NULL, 0, &p, err, sizeof err);
    CHECK_MSG(rc == 0, "order %d: %s", o, err);
    if (rc)
      continue;
    CHECK(p.mesh.cp == 2 && p.mesh.tp == 2 && p.mesh.dp == 2 && p.mesh.world == 8);
    int members[8];
    CHECK(mesh_group_members(&p.mesh, PLAN_AXIS_CP, 0, members) == 2);
    CHECK_MSG(members[0] == cp_members[o][0] && members[1] == cp_members[o][1], "order %d: cp group {%d, %d}", o,
              members[0], members[1]);
    CHECK(mesh_group_members(&p.mesh, PLAN_AXIS_TP, 0, members) == 2);
    CHECK_MSG(members[0] == tp_members[o][0] && members[1] == tp_members[o][1], "order %d: tp group {%d, %d}", o,
              members[0], members[1]);
    char buf[64];
    CHECK_STR_CONTAINS(plan_mesh_order_text(&p.mesh, buf, sizeof buf),
                       o == 0 ? "tp, cp, dp, pp" : o == 1 ? "dp, tp, cp, pp" : "cp, tp, dp, pp");
    plan_free(&p);
  }
  /* cp = 1: the axis is left out of the order's text (and the plan's JSON: the hash golden value) */
  struct plan p;
  char err[2048];
  const char *sets[] = { "mesh.tp=2" };
  int rc = compile_with(tmp_plan("nocp.lua",
                                 "local tycho = require \"tycho\"\n"
                                 "return tycho.plan {\n"
                                 "  model = { n_layers = 2, dim = 64, n_heads = 4, ffn_dim = 128, vocab = 64, max_seq = 64 },\n"
                                 "  batch = { global = 8, micro = 2, seq = 32 },\n"
                                 "}\n"), 4, sets, 1, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (rc)
    return;
  char buf[64];
  CHECK_STR_CONTAINS(plan_mesh_order_text(&p.mesh, buf, sizeof buf), "tp, dp, pp");
  CHECK(p.mesh.cp == 1 && strcmp(buf, "tp, dp, pp") == 0);
  plan_free(&p);
}

static void test_balanced_stages_follow_cost(void)
{
  /* A huge vocabulary makes the head cost several layers: "balanced" gives the last stage fewer
   * layers, "even" does not. */
  const char *path = tmp_plan("balanced.lua",
           "local tycho = require \"tycho\"\n"
           "return tycho.plan {\n"
           "  model = { n_layers = 12, dim = 256, n_heads = 4, ffn_dim = 512, vocab = 256000, max_seq = 64 },\n"
           "  mesh = { pp = 3, dp = 1 },\n"
           "  stages = \"balanced\",\n"
           "  batch = { global = 8, seq = 64 },\n"
           "}\n");
  char err[2048];
  struct plan p;
  int rc = compile_with(path, 0, NULL, 0, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (rc)
    return;
  CHECK_MSG(p.stages[2].n_layers < p.stages[0].n_layers, "stage layers %d %d %d", p.stages[0].n_layers,
            p.stages[1].n_layers, p.stages[2].n_layers);
  CHECK(p.stages[0].n_layers + p.stages[1].n_layers + p.stages[2].n_layers == 12);
  plan_free(&p);
}

int main(void)
{
  if (plan_files_setup("plan"))
    return 1;
  static const struct test_case tests[] = {
    TEST(test_shipped_plans_at_world_sizes),
    TEST(test_llama_parameter_counts),
    TEST(test_set_overrides),
    TEST(test_device_field),
    TEST(test_comm_field),
    TEST(test_function_fields),
    TEST(test_extend_merges_deeply_and_replaces_lists),
    TEST(test_hash_is_stable_and_sensitive),
    TEST(test_hash_golden_value),
    TEST(test_srcmap_keeps_lines_and_finds_keys),
    TEST(test_mesh_groups_partition_the_world),
    TEST(test_mesh_cp_axis),
    TEST(test_balanced_stages_follow_cost),
  };
  return plan_files_done(test_run_all(tests, (int)(sizeof tests / sizeof tests[0])));
}
