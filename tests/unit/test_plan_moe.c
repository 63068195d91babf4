/* The plan compiler on mixture-of-experts plans: model.moe's forms and defaults, the ep axis of
 * the mesh, the refusals, the JSON and hash, the resume fields, and Mixtral's parameter and FLOP
 * counts. (test_plan_compile.c holds the dense compiler's tests.) */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "plan_files.h"
#include "check/check.h"
#include "plan/compile.h"
#include "util/strbuf.h"



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
  /* the whole text of the two combinations refused for now, each naming where model.moe is */
  char err[2048];
  struct plan p;
  CHECK(compile_moe("moe_bad.lua", "{ experts = 2, top_k = 1 }", "  mesh = { tp = 2 },\n  sequence_parallel = true,\n",
                    0, &p, err, sizeof err));
  CHECK_STR_CONTAINS(err, "moe_bad.lua:7: sequence_parallel = true with model.moe (");
  CHECK_STR_CONTAINS(err, "moe_bad.lua:4) and mesh.tp = 2: a "
                          "sparse layer routes whole sequences (its capacity is per sequence), and sequence "
                          "parallelism leaves a tp rank part of each; set sequence_parallel = false");
  CHECK(compile_moe("moe_bad.lua", "{ experts = 2, top_k = 1 }", "  recompute = { \"mlp_norm\" },\n", 0, &p, err,
                    sizeof err));
  CHECK_STR_CONTAINS(err, "moe_bad.lua:6: recompute = \"mlp_norm\": layer 0 is sparse (model.moe, ");
  CHECK_STR_CONTAINS(err, "moe_bad.lua:4), and recompute of the sparse MLP is not supported yet; recompute attention "
                          "parts only (\"attn_norm\", \"attn_core\", \"attn\") on sparse layers");
  /* what stays allowed: bf16 for the GPU runtime and the CPU's, attention recompute on sparse
   * layers, any recompute on dense ones, tp 2 for a dense model */
  static const struct { const char *moe, *extra; } fine[] = {
    { "{ experts = 2, top_k = 1 }", "  precision = { compute = \"bf16\" },\n  device = \"cuda\",\n" },
    { "{ experts = 2, top_k = 1 }", "  precision = { compute = \"bf16\" },\n" },
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
  if (plan_files_setup("plan-moe"))
    return 1;
  static const struct test_case tests[] = {
    TEST(test_moe_forms_and_defaults),
    TEST(test_moe_refusals),
    TEST(test_mesh_ep),
    TEST(test_moe_json_and_hash),
    TEST(test_moe_resume_fields),
    TEST(test_mixtral_counts),
  };
  return plan_files_done(test_run_all(tests, (int)(sizeof tests / sizeof tests[0])));
}
