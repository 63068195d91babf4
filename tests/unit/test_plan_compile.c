/* The plan compiler end to end: shipped plans at several world sizes, --set overrides,
 * function-valued fields, tycho.extend, hash stability, source maps and the mesh. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "check/check.h"
#include "layout/supported.h"
#include "lua/srcmap.h"
#include "mesh/mesh.h"
#include "plan/compile.h"
#include "util/devices.h"

/* The hash of the plan in test_hash_golden_value. */
#define GOLDEN_PLAN_HASH 0x1b8d78e77922f5ebull

static char source_dir[1024] = ".";
static char tmp_dir[256];

static void path_of(char *out, size_t n, const char *rel)
{
  snprintf(out, n, "%s/%s", source_dir, rel);
}

static int compile_with(const char *path, int world, const char *const *sets, int n_sets, struct plan *p,
                        char *err, size_t n)
{
  struct plan_compile_options opt = { 0 };
  opt.world = world;
  opt.sets = sets;
  opt.n_sets = n_sets;
  return plan_compile(path, &opt, p, err, n);
}

static void write_file(const char *path, const char *text)
{
  FILE *f = fopen(path, "w");
  if (!f) {
    perror(path);
    exit(1);
  }
  fputs(text, f);
  fclose(f);
}

static const char *tmp_plan(const char *name, const char *text)
{
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", tmp_dir, name);
  write_file(path, text);
  return path;
}

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
  m.world = 24;
  enum plan_axis orders[2][3] = { { PLAN_AXIS_TP, PLAN_AXIS_DP, PLAN_AXIS_PP },
                                  { PLAN_AXIS_PP, PLAN_AXIS_TP, PLAN_AXIS_DP } };
  for (int o = 0; o < 2; o++) {
    memcpy(m.order, orders[o], sizeof m.order);
    for (int ax = 0; ax < PLAN_N_AXES; ax++) {
      int seen[24] = { 0 };
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

/* A 4-layer plan with `moe` as the model's moe field (line 4) and `extra` as more plan fields
 * from line 6 on; compiled for `world` ranks. */
static int compile_moe(const char *name, const char *moe, const char *extra, int world, struct plan *p,
                       char *err, size_t n)
{
  char text[4096];
  snprintf(text, sizeof text,
           "local tycho = require \"tycho\"\n"
           "return tycho.plan {\n"
           "  model = { n_layers = 4, dim = 64, n_heads = 4, ffn_dim = 128, vocab = 64, max_seq = 64,\n"
           "    moe = %s },\n"
           "  batch = { global = 8, micro = 2, seq = 32 },\n"
           "%s"
           "}\n", moe, extra);
  return compile_with(tmp_plan(name, text), world, NULL, 0, p, err, n);
}

/* model.moe's three forms of layers ("all" by default, a list, a function), its defaults, and
 * a dense plan that has none of it. */
static void test_moe_forms_and_defaults(void)
{
  char err[2048];
  struct plan p;
  int rc = compile_moe("moe_defaults.lua", "{ experts = 4, top_k = 2 }", "", 1, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (!rc) {
    const struct plan_moe *e = &p.model.moe;
    CHECK(e->experts == 4 && e->top_k == 2 && e->ffn_dim == 128); /* ffn_dim: model.ffn_dim */
    CHECK(e->aux_loss == 0.01 && e->z_loss == 0 && e->capacity_factor == 0);
    CHECK(e->n_layers == 4 && !e->layers_is_function);
    for (int l = 0; l < 4; l++)
      CHECK(p.layers[l].moe == 1);
    CHECK_STR_CONTAINS(plan_where(&p, "model.moe.top_k"), "moe_defaults.lua:4");
    plan_free(&p);
  }
  rc = compile_moe("moe_all.lua", "{ experts = 8, top_k = 1, ffn_dim = 96, layers = \"all\", aux_loss = 0.02, "
                   "z_loss = 1e-3, capacity_factor = 1.25 }", "", 1, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (!rc) {
    const struct plan_moe *e = &p.model.moe;
    CHECK(e->experts == 8 && e->top_k == 1 && e->ffn_dim == 96 && e->n_layers == 4);
    CHECK(e->aux_loss == 0.02 && e->z_loss == 1e-3 && e->capacity_factor == 1.25);
    CHECK(plan_moe_capacity(&p.model, 32) == 5); /* ceil(1.25 · 32 · 1 / 8) */
    plan_free(&p);
  }
  rc = compile_moe("moe_list.lua", "{ experts = 4, top_k = 2, layers = { 3, 1 } }", "", 1, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (!rc) {
    CHECK(p.model.moe.n_layers == 2 && !p.model.moe.layers_is_function);
    CHECK(!p.layers[0].moe && p.layers[1].moe && !p.layers[2].moe && p.layers[3].moe);
    plan_free(&p);
  }
  rc = compile_moe("moe_function.lua", "{ experts = 4, top_k = 2, layers = function(layer) return layer % 2 == 0 end }",
                   "", 1, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (!rc) {
    CHECK(p.model.moe.n_layers == 2 && p.model.moe.layers_is_function);
    CHECK(p.layers[0].moe && !p.layers[1].moe && p.layers[2].moe && !p.layers[3].moe);
    plan_free(&p);
  }
  /* --set reaches into model.moe, and can make a dense plan sparse */
  char path[1200];
  path_of(path, sizeof path, "plans/tiny.lua");
  const char *sets[] = { "model.moe.experts=4", "model.moe.top_k=2", "model.moe.layers={1,2}" };
  rc = compile_with(path, 1, sets, 3, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (!rc) {
    CHECK(p.model.moe.experts == 4 && p.model.moe.n_layers == 2 && p.layers[1].moe && !p.layers[0].moe);
    CHECK_STR_CONTAINS(plan_where(&p, "model.moe.top_k"), "--set model.moe.top_k=2");
    plan_free(&p);
  }
  /* a dense plan: no sparse layer, experts 0, capacity 0 */
  CHECK(compile_with(path, 1, NULL, 0, &p, err, sizeof err) == 0);
  CHECK(p.model.moe.experts == 0 && p.model.moe.n_layers == 0 && plan_moe_capacity(&p.model, 32) == 0);
  for (int l = 0; l < p.model.n_layers; l++)
    CHECK(!p.layers[l].moe);
  CHECK(plan_active_param_count(&p) == plan_param_count(&p));
  plan_free(&p);
}

/* mesh.ep (docs/plans.md, docs/moe.md "Expert parallelism"): 1 when unset, read from the plan
 * and from --set, in the JSON and the hash only above 1 (an ep-1 plan hashes as one that does
 * not say it); a world not given makes dp "auto" ep. Each refusal: the whole text, at the line
 * of mesh.ep (or the --set), naming what would be valid. */
static void test_mesh_ep(void)
{
  char err[2048];
  struct plan p;
  const char *moe = "{ experts = 8, top_k = 2 }";
  int rc = compile_moe("ep_unset.lua", moe, "", 4, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  uint64_t h_unset = 0;
  if (!rc) {
    CHECK(p.mesh.ep == 1 && plan_ep(&p) == 1);
    h_unset = plan_hash(&p);
    struct strbuf b;
    sb_init(&b);
    check_write_json(&p, NULL, &b);
    CHECK(!b.failed && b.s && strstr(b.s, "\"dp_auto\":true,\"order\"")); /* no mesh.ep in the plan's JSON */
    CHECK(b.s && !strstr(b.s, "\"groups\":{\"tp\":[[0],[1],[2],[3]],\"dp\":[[0,1,2,3]],\"pp\":[[0],[1],[2],[3]],\"ep\""));
    CHECK(b.s && strstr(b.s, "\"ep_all_to_all\":null"));
    sb_free(&b);
    plan_free(&p);
  }
  rc = compile_moe("ep_unset.lua", moe, "  mesh = { ep = 1 },\n", 4, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (!rc) {
    CHECK(plan_ep(&p) == 1 && plan_hash(&p) == h_unset);
    plan_free(&p);
  }
  rc = compile_moe("ep_two.lua", moe, "  mesh = { ep = 2 },\n", 4, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (!rc) {
    CHECK(p.mesh.dp == 4 && plan_ep(&p) == 2 && plan_hash(&p) != h_unset);
    CHECK_STR_CONTAINS(plan_where(&p, "mesh.ep"), "ep_two.lua:6");
    struct strbuf b;
    sb_init(&b);
    check_write_json(&p, NULL, &b);
    CHECK(b.s && strstr(b.s, "\"dp_auto\":true,\"ep\":2,\"order\""));
    CHECK(b.s && strstr(b.s, "\"ep\":[[0,1],[2,3]]"));
    sb_free(&b);
    plan_free(&p);
  }
  /* no world given: dp "auto" is ep, the smallest world that has an ep group */
  rc = compile_moe("ep_two.lua", moe, "  mesh = { ep = 2 },\n", 0, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (!rc) {
    CHECK(p.mesh.world_assumed && p.mesh.dp == 2 && p.mesh.world == 2);
    plan_free(&p);
  }
  char path[1200];
  path_of(path, sizeof path, "plans/tiny_moe.lua");
  const char *sets[] = { "mesh.ep=4" };
  rc = compile_with(path, 4, sets, 1, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (!rc) {
    CHECK(plan_ep(&p) == 4);
    CHECK_STR_CONTAINS(plan_where(&p, "mesh.ep"), "--set mesh.ep=4");
    plan_free(&p);
  }
  static const struct { const char *moe, *extra; int world; const char *expect; } bad[] = {
    { NULL, "  mesh = { ep = 2 },\n", 4,
      "ep_bad.lua:6: mesh.ep = 2: expert parallelism spreads the experts of model.moe, and this model has none; "
      "set mesh.ep = 1 (or leave it out), or give the model a model.moe" },
    { "{ experts = 8, top_k = 2 }", "  mesh = { ep = 3 },\n", 4,
      "ep_bad.lua:6: mesh.ep = 3 does not divide mesh.dp = 4 (dp \"auto\" = world 4 / (tp 1 × pp 1)): an ep group "
      "is ep consecutive data-parallel ranks; use ep in {1, 2, 4} (the divisors of dp that divide "
      "model.moe.experts = 8)" },
    { "{ experts = 8, top_k = 2 }", "  mesh = { dp = 6, ep = 4 },\n", 0,
      "ep_bad.lua:6: mesh.ep = 4 does not divide mesh.dp = 6: an ep group is ep consecutive data-parallel ranks; "
      "use ep in {1, 2} (the divisors of dp that divide model.moe.experts = 8)" },
    { "{ experts = 6, top_k = 2 }", "  mesh = { ep = 4 },\n", 8,
      "ep_bad.lua:4): each ep rank holds "
      "experts / ep of every sparse layer's experts; use ep in {1, 2} (the divisors of the experts that divide "
      "mesh.dp = 8)" },
    { "{ experts = 8, top_k = 2 }", "  mesh = { ep = 0 },\n", 4, "ep_bad.lua:6: mesh.ep = 0: must be an integer in 1..1048576" },
    { "{ experts = 8, top_k = 2 }", "  mesh = { ep = \"auto\" },\n", 4,
      "ep_bad.lua:6: mesh.ep = \"auto\": must be an integer in 1..1048576" },
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char text[1024];
    if (bad[i].moe) {
      rc = compile_moe("ep_bad.lua", bad[i].moe, bad[i].extra, bad[i].world, &p, err, sizeof err);
    } else { /* the same lines without model.moe */
      snprintf(text, sizeof text,
               "local tycho = require \"tycho\"\n"
               "return tycho.plan {\n"
               "  model = { n_layers = 4, dim = 64, n_heads = 4, ffn_dim = 128, vocab = 64, max_seq = 64,\n"
               "    },\n"
               "  batch = { global = 8, micro = 2, seq = 32 },\n"
               "%s}\n", bad[i].extra);
      rc = compile_with(tmp_plan("ep_bad.lua", text), bad[i].world, NULL, 0, &p, err, sizeof err);
    }
    CHECK_MSG(rc != 0, "case %zu compiled", i);
    CHECK_MSG(strstr(err, bad[i].expect) != NULL, "case %zu: \"%s\" lacks \"%s\"", i, err, bad[i].expect);
    if (!rc)
      plan_free(&p);
  }
  /* a refusal through --set names the --set */
  const char *bad_set[] = { "mesh.ep=3" };
  CHECK(compile_with(path, 4, bad_set, 1, &p, err, sizeof err) != 0);
  CHECK_STR_CONTAINS(err, "--set mesh.ep=3: mesh.ep = 3 does not divide mesh.dp = 4");
}

/* Every refusal of model.moe: exit 2's message, at the line of the field to change. */
static void test_moe_refusals(void)
{
  static const struct { const char *moe, *extra, *expect; } cases[] = {
    { "{ experts = 4, topk = 2 }", "",
      "moe_bad.lua:4: model.moe.topk: unknown field (did you mean \"top_k\"?); model.moe fields are experts, "
      "top_k, ffn_dim, layers, aux_loss, z_loss, capacity_factor" },
    { "{ top_k = 2 }", "", "moe_bad.lua:4: model.moe.experts: missing; it is required (an integer ≥ 1)" },
    { "{ experts = 4 }", "", "moe_bad.lua:4: model.moe.top_k: missing; it is required (an integer ≥ 1)" },
    { "{ experts = 0, top_k = 1 }", "", "moe_bad.lua:4: model.moe.experts = 0: must be an integer in 1..65536" },
    { "{ experts = 2, top_k = 3 }", "",
      "moe_bad.lua:4: model.moe.top_k = 3: more than model.moe.experts = 2; each token goes to top_k of the "
      "experts, so 1 ≤ top_k ≤ 2" },
    { "{ experts = 2, top_k = 0 }", "", "moe_bad.lua:4: model.moe.top_k = 0: must be an integer in 1..65536" },
    { "{ experts = 2, top_k = 1, ffn_dim = 0 }", "", "model.moe.ffn_dim = 0: must be an integer in 1..4194304" },
    { "{ experts = 2, top_k = 1, aux_loss = -1 }", "", "moe_bad.lua:4: model.moe.aux_loss = -1: must be a number ≥ 0" },
    { "{ experts = 2, top_k = 1, z_loss = 1/0 }", "", "moe_bad.lua:4: model.moe.z_loss = inf: must be a finite number" },
    { "{ experts = 2, top_k = 1, capacity_factor = -0.5 }", "",
      "moe_bad.lua:4: model.moe.capacity_factor = -0.5: must be a number ≥ 0" },
    { "{ experts = 2, top_k = 1, layers = { 0,\n 9 } }", "",
      "moe_bad.lua:5: model.moe.layers[2] = 9: layer 9 does not exist; layers are 0..3" },
    { "{ experts = 2, top_k = 1, layers = { -1 } }", "",
      "moe_bad.lua:4: model.moe.layers[1] = -1: layer -1 does not exist; layers are 0..3" },
    { "{ experts = 2, top_k = 1, layers = { 1, 2, 1 } }", "",
      "moe_bad.lua:4: model.moe.layers[3] = 1: layer 1 appears twice; list each sparse layer once" },
    { "{ experts = 2, top_k = 1, layers = { 1, \"two\" } }", "",
      "moe_bad.lua:4: model.moe.layers[2] = \"two\": must be a layer index (0-based)" },
    { "{ experts = 2, top_k = 1, layers = {} }", "",
      "moe_bad.lua:4: model.moe.layers selects no layer; list at least one layer, or leave model.moe out for a "
      "dense model" },
    { "{ experts = 2, top_k = 1, layers = function(layer) return false end }", "",
      "moe_bad.lua:4: model.moe.layers selects no layer" },
    { "{ experts = 2, top_k = 1, layers = \"odd\" }", "",
      "moe_bad.lua:4: model.moe.layers = \"odd\": must be \"all\", a list of layer indices (0-based) or a "
      "function(layer) -> boolean" },
    { "{ experts = 2, top_k = 1, layers = function(layer) if layer > 1 then return true end end }", "",
      "moe_bad.lua:4: model.moe.layers: the function returned nil for layer 0; it must return true (the layer's "
      "MLP is sparse) or false (dense)" },
    { "{ experts = 2, top_k = 1, layers = function(layer)\n if layer == 2 then error(\"no\") end return true end }", "",
      "moe_bad.lua:5: no (in the model.moe.layers function, called for layer 2)" },
    { "{ experts = 2, top_k = 1 }", "  mesh = { tp = 2 },\n  sequence_parallel = true,\n",
      "moe_bad.lua:7: sequence_parallel = true with model.moe (" },
    { "{ experts = 2, top_k = 1 }", "  precision = { compute = \"bf16\" },\n",
      "moe_bad.lua:6: precision.compute = \"bf16\" with model.moe (" },
    { "{ experts = 2, top_k = 1, layers = { 1 } }", "  recompute = \"full\",\n",
      "moe_bad.lua:6: recompute = \"full\": layer 1 is sparse (model.moe, " },
    { "{ experts = 2, top_k = 1, layers = { 2 } }",
      "  recompute = function(layer) if layer == 2 then return { \"attn\", \"mlp_act\" } end end,\n",
      "moe_bad.lua:6: recompute = \"attn,mlp_act\" (returned by the recompute function for layer 2): layer 2 is "
      "sparse (model.moe, " },
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char err[2048] = "";
    struct plan p;
    int rc = compile_moe("moe_bad.lua", cases[i].moe, cases[i].extra, 0, &p, err, sizeof err);
    CHECK_MSG(rc != 0, "case %zu compiled", i);
    CHECK_MSG(strstr(err, cases[i].expect) != NULL, "case %zu: \"%s\" lacks \"%s\"", i, err, cases[i].expect);
  }
  /* the whole text of the three combinations refused for now, each naming where model.moe is */
  char err[2048];
  struct plan p;
  CHECK(compile_moe("moe_bad.lua", "{ experts = 2, top_k = 1 }", "  mesh = { tp = 2 },\n  sequence_parallel = true,\n",
                    0, &p, err, sizeof err));
  CHECK_STR_CONTAINS(err, "moe_bad.lua:7: sequence_parallel = true with model.moe (");
  CHECK_STR_CONTAINS(err, "moe_bad.lua:4) and mesh.tp = 2: a "
                          "sparse layer routes whole sequences (its capacity is per sequence), and sequence "
                          "parallelism leaves a tp rank part of each; set sequence_parallel = false");
  CHECK(compile_moe("moe_bad.lua", "{ experts = 2, top_k = 1 }", "  precision = { compute = \"bf16\" },\n", 0, &p,
                    err, sizeof err));
  CHECK_STR_CONTAINS(err, "moe_bad.lua:6: precision.compute = \"bf16\" with model.moe (");
  CHECK_STR_CONTAINS(err, "moe_bad.lua:4) on the CPU runtime: its bf16 mode has no mixture-of-experts kernels; use "
                          "precision.compute = \"fp32\" on the CPU");
  CHECK(compile_moe("moe_bad.lua", "{ experts = 2, top_k = 1 }", "  recompute = { \"mlp_norm\" },\n", 0, &p, err,
                    sizeof err));
  CHECK_STR_CONTAINS(err, "moe_bad.lua:6: recompute = \"mlp_norm\": layer 0 is sparse (model.moe, ");
  CHECK_STR_CONTAINS(err, "moe_bad.lua:4), and recompute of the sparse MLP is not supported yet; recompute attention "
                          "parts only (\"attn_norm\", \"attn_core\", \"attn\") on sparse layers");
  /* what stays allowed: bf16 for the GPU runtime, attention recompute on sparse layers, any recompute
   * on dense ones, tp 2 for a dense model */
  static const struct { const char *moe, *extra; } fine[] = {
    { "{ experts = 2, top_k = 1 }", "  precision = { compute = \"bf16\" },\n  device = \"cuda\",\n" },
    { "{ experts = 2, top_k = 1 }", "  recompute = { \"attn_norm\", \"attn_core\", \"attn\" },\n" },
    { "{ experts = 2, top_k = 1, layers = { 0 } }",
      "  recompute = function(layer) if layer > 0 then return \"full\" end return \"attn\" end,\n" },
  };
  for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
    int rc = compile_moe("moe_fine.lua", fine[i].moe, fine[i].extra, 0, &p, err, sizeof err);
    CHECK_MSG(rc == 0, "allowed case %zu: %s", i, err);
    if (!rc)
      plan_free(&p);
  }
  CHECK(compile_moe("moe_fine.lua", "nil", "  mesh = { tp = 2 },\n", 0, &p, err, sizeof err) == 0);
  plan_free(&p);
  /* tp 2 with sparse layers: their MLP whole on every tp rank ("replicate"), the dense layers' and
   * attention's splits as tp_split says */
  int rc = compile_moe("moe_tp.lua", "{ experts = 2, top_k = 1, layers = { 1, 3 } }", "  mesh = { tp = 2 },\n", 0, &p,
                   err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  for (int l = 0; !rc && l < 4; l++) {
    const uint8_t *sp = p.layers[l].split, want = l % 2 ? PLAN_SPLIT_REPLICATE : PLAN_SPLIT_COLUMN;
    CHECK_MSG(sp[PLAN_MOD_GATE] == want && sp[PLAN_MOD_UP] == want && sp[PLAN_MOD_Q] == PLAN_SPLIT_COLUMN &&
              sp[PLAN_MOD_O] == PLAN_SPLIT_ROW && sp[PLAN_MOD_DOWN] == (l % 2 ? PLAN_SPLIT_REPLICATE : PLAN_SPLIT_ROW),
              "layer %d: gate %d up %d down %d q %d o %d", l, sp[PLAN_MOD_GATE], sp[PLAN_MOD_UP], sp[PLAN_MOD_DOWN],
              sp[PLAN_MOD_Q], sp[PLAN_MOD_O]);
  }
  if (!rc)
    plan_free(&p);
}

/* model.moe enters the plan JSON (so the hash) with its sparse layers; a dense plan's JSON says
 * nothing of it (its hash is test_hash_golden_value's). Each moe field moves the hash. */
static void test_moe_json_and_hash(void)
{
  char err[2048];
  struct plan p;
  CHECK(compile_moe("moe_json.lua", "nil", "", 1, &p, err, sizeof err) == 0);
  struct strbuf b;
  sb_init(&b);
  check_write_json(&p, NULL, &b);
  CHECK(b.s && !strstr(b.s, "\"moe\":"));
  sb_free(&b);
  const uint64_t dense = plan_hash(&p);
  plan_free(&p);
  CHECK(compile_moe("moe_json.lua", "{ experts = 4, top_k = 2, layers = { 1, 3 } }", "", 1, &p, err, sizeof err) == 0);
  sb_init(&b);
  check_write_json(&p, NULL, &b);
  CHECK(b.s != NULL);
  if (b.s)
    CHECK_STR_CONTAINS(b.s, "\"moe\":{\"experts\":4,\"top_k\":2,\"ffn_dim\":128,\"aux_loss\":0.01,\"z_loss\":0,"
                            "\"capacity_factor\":0,\"layers_from\":\"value\",\"n_layers\":2,\"layers\":[1,3],"
                            "\"active_params\":");
  sb_free(&b);
  const uint64_t sparse = plan_hash(&p);
  CHECK(sparse != dense);
  plan_free(&p);
  static const char *const others[] = {
    "{ experts = 4, top_k = 2, layers = { 1, 2 } }", "{ experts = 4, top_k = 1, layers = { 1, 3 } }",
    "{ experts = 4, top_k = 2, layers = { 1, 3 }, aux_loss = 0.02 }",
    "{ experts = 4, top_k = 2, layers = { 1, 3 }, z_loss = 0.001 }",
    "{ experts = 4, top_k = 2, layers = { 1, 3 }, capacity_factor = 2 }",
    "{ experts = 4, top_k = 2, layers = { 1, 3 }, ffn_dim = 64 }", "{ experts = 5, top_k = 2, layers = { 1, 3 } }",
  };
  for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
    CHECK(compile_moe("moe_json.lua", others[i], "", 1, &p, err, sizeof err) == 0);
    CHECK_MSG(plan_hash(&p) != sparse, "%s hashes as { experts = 4, top_k = 2, layers = { 1, 3 } }", others[i]);
    plan_free(&p);
  }
  CHECK(compile_moe("moe_json.lua", "{ experts = 4, top_k = 2, layers = function(l) return l % 2 == 1 end }", "", 1,
                    &p, err, sizeof err) == 0);
  CHECK(plan_hash(&p) != sparse); /* the same layers, from a function: the JSON says so */
  plan_free(&p);
}

/* The resume compares model.moe's fields that change what is computed, as it does model.norm_eps. */
static void test_moe_resume_fields(void)
{
  char err[2048], v[64];
  struct plan p;
  CHECK(compile_moe("moe_resume.lua", "{ experts = 4, top_k = 2, aux_loss = 0.02, capacity_factor = 1.5 }", "", 1, &p,
                    err, sizeof err) == 0);
  static const struct { const char *name, *value; } want[] = {
    { "model.moe.top_k", "2" }, { "model.moe.aux_loss", "0.02" }, { "model.moe.z_loss", "0" },
    { "model.moe.capacity_factor", "1.5" },
  };
  for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
    int found = -1;
    for (int i = 0; i < PLAN_N_RESUME_FIELDS; i++)
      if (strcmp(plan_resume_field_name(i), want[k].name) == 0)
        found = i;
    CHECK_MSG(found >= 0, "%s is not compared on resume", want[k].name);
    if (found < 0)
      continue;
    CHECK(plan_resume_field(&p, found, v, sizeof v) == -1);
    CHECK_MSG(strcmp(v, want[k].value) == 0, "%s = %s", want[k].name, v);
  }
  /* the fields a resume compares keep their places (ckpt.c reads data.train and data.val by index) */
  CHECK(strcmp(plan_resume_field_name(5), "data.train") == 0 && strcmp(plan_resume_field_name(6), "data.val") == 0);
  CHECK(strcmp(plan_resume_field_name(PLAN_N_RESUME_FIELDS), "seeds.global") == 0);
  plan_free(&p);
  /* and allow_changes names them */
  CHECK(compile_moe("moe_resume.lua", "{ experts = 4, top_k = 2 }",
                    "  checkpoint = { dir = \"x\", allow_changes = { \"model.moe.aux_loss\", \"train.steps\" } },\n", 1,
                    &p, err, sizeof err) == 0);
  int aux = -1;
  for (int i = 0; i < PLAN_N_RESUME_NAMES; i++)
    if (strcmp(plan_resume_field_name(i), "model.moe.aux_loss") == 0)
      aux = i;
  CHECK(aux >= 0 && (p.checkpoint.allow_changes >> aux & 1));
  CHECK(p.checkpoint.allow_changes >> (PLAN_N_RESUME_FIELDS + 1) & 1); /* train.steps, the last bit */
  plan_free(&p);
}

/* plans/models/mixtral.lua's 8x7B has Mixtral-8x7B-v0.1's published 46.7B parameters, 12.9B of them
 * active per token; its FLOPs per token count the router and two experts per layer. */
static void test_mixtral_counts(void)
{
  const char *path = tmp_plan("mixtral.lua",
           "local tycho = require \"tycho\"\n"
           "local mixtral = require \"models.mixtral\"\n"
           "return tycho.plan { model = mixtral[\"8x7b\"], batch = { global = 8, seq = 4096 } }\n");
  char err[2048], plans_dir[1200];
  path_of(plans_dir, sizeof plans_dir, "plans");
  /* the plan lives in tmp_dir: reach plans/models through a link there */
  char link_path[512];
  snprintf(link_path, sizeof link_path, "%s/models", tmp_dir);
  char models[1300];
  snprintf(models, sizeof models, "%s/models", plans_dir);
  if (symlink(models, link_path) != 0)
    perror("symlink");
  struct plan p;
  int rc = compile_with(path, 8, NULL, 0, &p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  if (rc)
    return;
  const struct plan_model *m = &p.model;
  CHECK(m->n_layers == 32 && m->dim == 4096 && m->n_heads == 32 && m->n_kv_heads == 8 && m->ffn_dim == 14336);
  CHECK(m->vocab == 32000 && m->max_seq == 32768 && m->rope_theta == 1e6 && m->norm_eps == 1e-5);
  CHECK(m->moe.experts == 8 && m->moe.top_k == 2 && m->moe.ffn_dim == 14336 && m->moe.aux_loss == 0.02);
  CHECK(m->moe.n_layers == 32 && m->moe.z_loss == 0 && m->moe.capacity_factor == 0);
  /* per layer: attention 4096·(4096 + 2·1024) + 4096·4096, router 8·4096, experts 8 · 3·4096·14336, norms 2·4096;
   * embedding and head 2 · 32000·4096, final norm 4096 */
  const long long attn = 4096LL * (4096 + 2 * 1024) + 4096LL * 4096, expert = 3LL * 4096 * 14336;
  const long long rest = 2LL * 32000 * 4096 + 4096;
  const long long total = 32 * (attn + 8 * 4096 + 8 * expert + 2 * 4096) + rest;
  const long long active = 32 * (attn + 8 * 4096 + 2 * expert + 2 * 4096) + rest;
  CHECK_MSG(plan_param_count(&p) == total, "%lld parameters", plan_param_count(&p));
  CHECK_MSG(plan_active_param_count(&p) == active, "%lld active", plan_active_param_count(&p));
  CHECK(total == 46702792704LL && active == 12879925248LL);
  /* the published figures, to the digits they are given in */
  CHECK_NEAR(plan_param_count(&p) / 1e9, 46.7, 0.05);
  CHECK_NEAR(plan_active_param_count(&p) / 1e9, 12.9, 0.05);
  /* FLOPs per token: a sparse layer's MLP is the router and top_k experts */
  const struct plan_layer_flops dense = plan_layer_flops(&p), sparse = plan_layer_flops_of(&p, 5);
  CHECK(dense.mlp == 6.0 * 4096 * 14336);
  CHECK(sparse.mlp == 2.0 * 4096 * 8 + 2 * 6.0 * 4096 * 14336);
  CHECK(sparse.attn_proj == dense.attn_proj && sparse.attn_core == dense.attn_core);
  double stages = 0;
  for (int s = 0; s < p.n_stages; s++)
    stages += plan_stage_flops(&p, s).forward;
  const double model = plan_model_flops(&p);
  CHECK_NEAR(stages, model, 1e-9 * model);
  CHECK_NEAR(model, 32 * (dense.attn_proj + dense.attn_core + sparse.mlp) + plan_head_flops(&p), 1e-9 * model);
  /* apart from attention's core, 2 FLOPs per active parameter but the embedding's */
  CHECK_NEAR(model - 32 * dense.attn_core, 2.0 * (active - 32000LL * 4096 - 4096 - 32 * 2 * 4096), 1e-9 * model);
  plan_free(&p);
}

int main(void)
{
  const char *src = getenv("TYCHO_SOURCE_DIR");
  if (src)
    snprintf(source_dir, sizeof source_dir, "%s", src);
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/tycho-test-plan-XXXXXX");
  if (!mkdtemp(tmp_dir)) {
    perror("mkdtemp");
    return 1;
  }
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
    TEST(test_balanced_stages_follow_cost),
    TEST(test_moe_forms_and_defaults),
    TEST(test_moe_refusals),
    TEST(test_mesh_ep),
    TEST(test_moe_json_and_hash),
    TEST(test_moe_resume_fields),
    TEST(test_mixtral_counts),
  };
  int rc = test_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", tmp_dir);
  return rc;
}
