/* `tycho generate`: tokens from a model, on one rank, in the build's precision (fp32, or double in
 * the float64 build) on the CPU, whatever the plan's precision.compute (its fp32 master weights).
 *
 * The weights: a Hugging Face model folder given directly (config.json and its safetensors), or a
 * plan's as `tycho run` would start from them: the newest checkpoint in checkpoint.dir when there
 * is one, else init.from, else the initial weights of seeds.model. A plan is opened as a trainer
 * of one rank (mesh.tp, pp and dp set to 1, ZeRO 0, device "cpu": layout only, which a checkpoint
 * loads into from any mesh), so the weights are the ones a run of the plan would hold.
 *
 * The prompt runs once through the model's cached forward (runtime/model/generate.h), then each
 * new token one position; --no-cache recomputes the training forward over the whole sequence at
 * every token instead (slow: a check of the cache). Tokens are printed as they come. */
#include <lauxlib.h>
#include <lua.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "io/hf.h"
#include "runtime/model/generate.h"
#include "runtime/model/weights.h"
#include "runtime/state/ckpt.h"
#include "runtime/train/train.h"
#include "util/file.h"
#include "util/json.h"

#define GEN_MAX_TOKENS_LIMIT 1000000LL
#define GEN_MAX_EOS 16

struct gen_args {
  const char *source;        /* plan file or model folder */
  const char *prompt_ids, *prompt;
  long long max_tokens;
  struct gen_sampling s;
  int json, no_cache;
};

/* A strict decimal number for `opt` in [lo, hi] (hi_open: below hi); else exit 2 naming it. */
static double parse_real(lua_State *L, const char *opt, const char *v, double lo, double hi, int hi_open)
{
  char *end;
  errno = 0;
  double x = v && *v ? strtod(v, &end) : 0;
  if (!v || !*v || *end || errno || !isfinite(x) || x < lo || x > hi || (hi_open && x >= hi))
    host_fail(L, EXIT_USAGE, "%s %s: not a number in [%g, %g%c", opt, v ? v : "(missing)", lo, hi,
              hi_open ? ')' : ']');
  return x;
}

/* --prompt-ids I,J,K into ids (Lua-owned); exit 2 naming the option. The vocabulary is checked
 * once the model is known (generate). */
static int *parse_ids(lua_State *L, const char *text, int *n)
{
  size_t cap = strlen(text) / 2 + 1;
  int *ids = lua_newuserdatauv(L, cap * sizeof(int), 0); /* freed by Lua */
  *n = 0;
  const char *s = text;
  while (1) {
    char *end;
    errno = 0;
    if (*s < '0' || *s > '9')
      host_fail(L, EXIT_USAGE, "--prompt-ids %s: not a comma list of token ids", text);
    long long v = strtoll(s, &end, 10);
    if (errno || v > 0x7fffffff)
      host_fail(L, EXIT_USAGE, "--prompt-ids: token id %.*s is too large", (int)(end - s), s);
    ids[(*n)++] = (int)v;
    if (!*end)
      break;
    if (*end != ',')
      host_fail(L, EXIT_USAGE, "--prompt-ids %s: not a comma list of token ids", text);
    s = end + 1;
  }
  return ids;
}

/* config.json's eos_token_id (a number or a list of them) into eos; the count (0: none). */
static int read_eos(const char *dir, int *eos)
{
  char path[4200], err[256];
  snprintf(path, sizeof path, "%s/%s", dir, HF_CONFIG);
  struct file_map fm;
  if (file_map("config.json", path, 1 << 24, &fm, err, sizeof err))
    return 0;
  struct json_doc j;
  int n = 0;
  if (json_parse(&j, fm.data, fm.bytes, path, 0, err, sizeof err) == 0) {
    int id = json_member(&j, 0, "eos_token_id");
    uint64_t v;
    if (id >= 0 && j.nodes[id].type == JSON_NUMBER && json_uint64(&j, id, &v) && v < 1u << 30)
      eos[n++] = (int)v;
    else if (id >= 0 && j.nodes[id].type == JSON_ARRAY)
      for (int c = j.nodes[id].first; c >= 0 && n < GEN_MAX_EOS; c = j.nodes[c].next)
        if (json_uint64(&j, c, &v) && v < 1u << 30)
          eos[n++] = (int)v;
    json_free(&j);
  }
  file_unmap(&fm);
  return n;
}

static void parse_gen_args(lua_State *L, int argc, char **argv, struct cli *c, struct gen_args *g)
{
  c->command = argv[1];
  c->sets = lua_newuserdatauv(L, sizeof(char *) * (size_t)(argc + 8), 0); /* room for ours */
  const struct plan_opts po = { c->sets, &c->n_sets, &c->unsafe, &c->memory_limit, &c->instruction_limit };
  g->max_tokens = 64;
  g->s.top_p = 1.0;
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
    if (plan_option(L, argc, argv, &i, &po))
      continue;
    if (strcmp(a, "--prompt-ids") == 0 && next) {
      g->prompt_ids = next;
      i++;
    } else if (strcmp(a, "--prompt") == 0 && next) {
      g->prompt = next;
      i++;
    } else if (strcmp(a, "--max-tokens") == 0) {
      g->max_tokens = parse_count(L, "--max-tokens", next, 1, GEN_MAX_TOKENS_LIMIT);
      i++;
    } else if (strcmp(a, "--temperature") == 0) {
      g->s.temperature = parse_real(L, "--temperature", next, 0, 1e6, 0);
      i++;
    } else if (strcmp(a, "--top-k") == 0) {
      g->s.top_k = (int)parse_count(L, "--top-k", next, 0, 1 << 30);
      i++;
    } else if (strcmp(a, "--top-p") == 0) {
      g->s.top_p = parse_real(L, "--top-p", next, 0, 1, 0);
      if (g->s.top_p <= 0)
        host_fail(L, EXIT_USAGE, "--top-p %s: must be above 0 (1: off)", next);
      i++;
    } else if (strcmp(a, "--seed") == 0) {
      g->s.seed = (uint64_t)parse_count(L, "--seed", next, 0, 0x7fffffffffffffffLL);
      i++;
    } else if (strcmp(a, "--json") == 0) {
      g->json = 1;
    } else if (strcmp(a, "--no-cache") == 0) {
      g->no_cache = 1;
    } else if (a[0] == '-' && a[1]) {
      host_fail(L, EXIT_USAGE, "%s '%s' for 'generate'; see tycho generate --help",
                next || (strcmp(a, "--prompt-ids") && strcmp(a, "--prompt")) ? "unknown option" : "no value after", a);
    } else if (!g->source) {
      g->source = a;
    } else {
      host_fail(L, EXIT_USAGE, "unexpected argument '%s' (the model is %s); see tycho generate --help", a, g->source);
    }
  }
  if (!g->source)
    host_fail(L, EXIT_USAGE, "'generate' needs a plan file or a Hugging Face model folder, e.g. "
              "tycho generate plans/tiny.lua --prompt-ids 49,50");
  if (!g->prompt_ids == !g->prompt)
    host_fail(L, EXIT_USAGE, "generate needs one prompt: --prompt-ids I,J,K or --prompt TEXT");
  if (g->prompt)
    host_fail(L, EXIT_USAGE, "--prompt needs a tokenizer, which this build does not have; give the "
              "token ids with --prompt-ids I,J,K");
  c->plan = g->source;
}

/* Where the weights come from, and what is to free. */
struct gen_model {
  struct trainer t;
  int have_trainer;
  struct model own;
  int have_own;
  struct model *m;
  char from[4400];
  int eos[GEN_MAX_EOS], n_eos;
};

static void gen_model_close(struct gen_model *gm)
{
  if (gm->have_trainer)
    trainer_close(&gm->t);
  if (gm->have_own)
    model_free(&gm->own);
  gm->have_trainer = gm->have_own = 0;
}

/* A Hugging Face folder's model: 0, or an exit code with the message. */
static int open_folder(struct gen_model *gm, const char *dir, char *err, size_t n)
{
  struct hf_config hc;
  int rc = hf_config_read(dir, &hc, err, n);
  if (rc)
    return rc == 2 ? EXIT_USAGE : EXIT_RUNTIME;
  if (hc.experts > 0) {
    snprintf(err, n, "%s: a mixture of experts (num_local_experts = %d): tycho generate runs dense "
             "models only", dir, hc.experts);
    return EXIT_USAGE;
  }
  struct plan_model cfg;
  memset(&cfg, 0, sizeof cfg);
  snprintf(cfg.family, sizeof cfg.family, "llama");
  cfg.n_layers = hc.n_layers;
  cfg.dim = hc.dim;
  cfg.n_heads = hc.n_heads;
  cfg.n_kv_heads = hc.n_kv_heads;
  cfg.ffn_dim = hc.ffn_dim;
  cfg.vocab = hc.vocab;
  cfg.max_seq = hc.max_seq;
  cfg.norm_eps = hc.norm_eps;
  cfg.rope_theta = hc.rope_theta;
  cfg.tie_embeddings = hc.tie_embeddings;
  if (model_create(&gm->own, &cfg, err, n))
    return EXIT_RUNTIME;
  gm->have_own = 1;
  gm->m = &gm->own;
  if (weights_load(gm->m, dir, err, n))
    return EXIT_USAGE;
  snprintf(gm->from, sizeof gm->from, "%s", dir);
  gm->n_eos = read_eos(dir, gm->eos);
  return 0;
}

/* A plan's weights, as a run of it would start from them. */
static int open_plan(lua_State *L, struct cli *c, struct gen_model *gm, char *err, size_t n)
{
  static const char *const one_rank[] = { "mesh.tp=1", "mesh.pp=1", "mesh.dp=1", "mesh.ep=nil",
                                          "zero=0", "device=cpu", "sequence_parallel=false" };
  for (size_t i = 0; i < sizeof one_rank / sizeof one_rank[0]; i++) c->sets[c->n_sets++] = one_rank[i];
  struct plan *p;
  char why[2048];
  if (compile_plan(L, c, 1, &p, why, sizeof why)) {
    snprintf(err, n, "plan error: %s", why);
    return EXIT_USAGE;
  }
  if (p->model.moe.experts > 0) {
    snprintf(err, n, "%s: model.moe (a mixture of experts): tycho generate runs dense models only", c->plan);
    return EXIT_USAGE;
  }
  int rc = trainer_open(&gm->t, p, NULL, err, n);
  if (rc)
    return rc == TRAIN_RUNTIME_ERROR ? EXIT_RUNTIME : EXIT_USAGE;
  gm->have_trainer = 1;
  gm->m = &gm->t.model;
  snprintf(gm->from, sizeof gm->from, "%s", p->init.from[0] ? p->init.from : "random (seeds.model)");
  if (p->checkpoint.dir[0]) {
    char path[4096];
    long long step;
    int found = ckpt_find_latest(p->checkpoint.dir, path, sizeof path, &step, err, n);
    if (found < 0)
      return EXIT_RUNTIME;
    if (found == 0) {
      rc = ckpt_load(&gm->t, path, err, n);
      if (rc)
        return rc == TRAIN_PLAN_ERROR ? EXIT_USAGE : EXIT_RUNTIME;
      snprintf(gm->from, sizeof gm->from, "checkpoint %s (step %lld)", path, step);
    }
  }
  if (p->init.from[0] && hf_is_folder(p->init.from))
    gm->n_eos = read_eos(p->init.from, gm->eos);
  return 0;
}

/* The prompt fits the model: 0, or an exit code with the message in err. */
static int check_prompt(const struct model *m, const int *prompt, int P, char *err, size_t n)
{
  for (int i = 0; i < P; i++)
    if (prompt[i] >= m->config.vocab) {
      snprintf(err, n, "--prompt-ids: token id %d is not below the model's vocabulary (%d)", prompt[i],
               m->config.vocab);
      return EXIT_USAGE;
    }
  if (P > m->config.max_seq) {
    snprintf(err, n, "--prompt-ids: %d tokens, longer than the model's max_seq (%d)", P, m->config.max_seq);
    return EXIT_USAGE;
  }
  return 0;
}

/* Each token as it is chosen: printed and flushed. */
static void emit_id(void *ctx, int id)
{
  int *first = ctx;
  printf(*first ? "%d" : " %d", id);
  *first = 0;
  fflush(stdout);
}

/* Generates; 0, or an exit code with the message in err. */
static int generate(const struct gen_args *g, struct gen_model *gm, const int *prompt, int P, char *err,
                    size_t n)
{
  int first = 1;
  struct gen_request r = { prompt, P, g->max_tokens, g->s, gm->eos, gm->n_eos, g->no_cache,
                           g->json ? NULL : emit_id, &first };
  int *out = malloc((size_t)gen_budget(gm->m, P, g->max_tokens) * sizeof *out);
  if (!out) {
    snprintf(err, n, "generate: out of memory");
    return EXIT_RUNTIME;
  }
  long long n_out = gen_run(gm->m, &r, out, err, n);
  if (n_out >= 0 && g->json) {
    printf("{\"ids\": [");
    for (long long i = 0; i < n_out; i++) printf(i ? ", %d" : "%d", out[i]);
    printf("], \"text\": null}\n");
  } else if (n_out >= 0) {
    printf("\n");
  }
  fflush(stdout);
  free(out);
  return n_out < 0 ? EXIT_USAGE : 0;
}

int cmd_generate(lua_State *L, int argc, char **argv)
{
  struct cli c = { 0 };
  struct gen_args g = { 0 };
  parse_gen_args(L, argc, argv, &c, &g);
  int P;
  const int *prompt = parse_ids(L, g.prompt_ids, &P);
  struct gen_model *gm = lua_newuserdatauv(L, sizeof *gm, 0);
  memset(gm, 0, sizeof *gm);
  char err[4096];
  const int folder = hf_is_folder(g.source);
  int code = folder ? open_folder(gm, g.source, err, sizeof err) : open_plan(L, &c, gm, err, sizeof err);
  if (!code)
    code = check_prompt(gm->m, prompt, P, err, sizeof err);
  if (!code) {
    const struct plan_model *mc = &gm->m->config;
    char how[160];
    if (g.s.temperature > 0)
      snprintf(how, sizeof how, "sampled: temperature %g, top_k %d, top_p %g, seed %llu", g.s.temperature,
               g.s.top_k, g.s.top_p, (unsigned long long)g.s.seed);
    else
      snprintf(how, sizeof how, "greedy");
    fprintf(stderr, "generate: %d layers, dim %d, %d heads / %d kv, vocab %d, in %s on the CPU%s; weights: %s; "
            "%s, at most %lld tokens%s\n", mc->n_layers, mc->dim, mc->n_heads, mc->n_kv_heads, mc->vocab,
            REAL_NAME, gm->have_trainer && gm->t.plan->precision.compute == PLAN_BF16
              ? " (the plan computes in bf16: its fp32 master weights)" : "",
            gm->from, how, g.max_tokens, g.no_cache ? " (no cache: the full forward at every token)" : "");
    code = generate(&g, gm, prompt, P, err, sizeof err);
  }
  gen_model_close(gm);
  if (code)
    return host_fail(L, code, "%s", err);
  return 0;
}
