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
 * every token instead (slow: a check of the cache). Tokens are printed as they come.
 *
 * Text: with a tokenizer (--tokenizer, else the plan's data.tokenizer, else a tokenizer.json in
 * the model folder or the plan's init.from folder: text/tokenizer.h), --prompt TEXT is encoded as the tokenizers library's
 * encode(text, add_special_tokens=False) and stdout streams the continuation's text (the ids go to
 * stderr at the end); without one, stdout streams the ids and --prompt is refused (exit 2). The
 * same encoding and decoding serve t:generate's text prompts (generate_set_text_codec). */
#include <lauxlib.h>
#include <lua.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "io/hf.h"
#include "runtime/model/generate.h"
#include "runtime/model/weights.h"
#include "runtime/state/ckpt.h"
#include "runtime/train/train.h"
#include "data/text_cache.h"
#include "text/tokenizer.h"
#include "tycho_runtime.h"
#include "util/err.h"
#include "util/file.h"
#include "util/json.h"
#include "util/strbuf.h"

#define GEN_MAX_TOKENS_LIMIT 1000000LL
#define GEN_MAX_EOS 16

struct gen_args {
  const char *source;        /* plan file or model folder */
  const char *prompt_ids, *prompt;
  const char *tokenizer;     /* --tokenizer PATH, or NULL: the model folder's tokenizer.json */
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
    } else if (strcmp(a, "--tokenizer") == 0 && next) {
      g->tokenizer = next;
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
                next || (strcmp(a, "--prompt-ids") && strcmp(a, "--prompt") && strcmp(a, "--tokenizer")) ? "unknown option" : "no value after", a);
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
  char tok_plan[4200];       /* the plan's data.tokenizer, or "" */
  char tok_dir[4200];        /* where a tokenizer.json may be: the model folder, init.from's */
  struct tokenizer *tok;     /* NULL: none */
  int *prompt;               /* --prompt's ids (malloc'd) */
};

static void gen_model_close(struct gen_model *gm)
{
  if (gm->have_trainer)
    trainer_close(&gm->t);
  if (gm->have_own)
    model_free(&gm->own);
  gm->have_trainer = gm->have_own = 0;
  if (gm->tok)
    tokenizer_free(gm->tok);
  gm->tok = NULL;
  free(gm->prompt);
  gm->prompt = NULL;
}

/* A Hugging Face folder's model: 0, or an exit code with the message. */
static int open_folder(struct gen_model *gm, const char *dir, char *err, size_t n)
{
  struct hf_config hc;
  int rc = hf_config_read(dir, &hc, err, n);
  if (rc)
    return rc == 2 ? EXIT_USAGE : EXIT_RUNTIME;
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
  if (hc.experts > 0) { /* a Mixtral: every layer sparse (model_create's default), no capacity */
    cfg.moe.experts = hc.experts;
    cfg.moe.top_k = hc.top_k;
    cfg.moe.ffn_dim = hc.ffn_dim;
    cfg.moe.aux_loss = hc.aux_loss;
    cfg.moe.n_layers = hc.n_layers;
  }
  if (model_create(&gm->own, &cfg, err, n))
    return EXIT_RUNTIME;
  gm->have_own = 1;
  gm->m = &gm->own;
  if (weights_load(gm->m, dir, err, n))
    return EXIT_USAGE;
  snprintf(gm->from, sizeof gm->from, "%s", dir);
  snprintf(gm->tok_dir, sizeof gm->tok_dir, "%s", dir);
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
  err_class_reset();
  if (p->data.n_text && text_cache_prepare(p, stderr, err, n)) /* the run's data, as tycho run sees it */
    return err_class_is_input() ? EXIT_USAGE : EXIT_RUNTIME;
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
  if (p->init.from[0] && hf_is_folder(p->init.from)) {
    gm->n_eos = read_eos(p->init.from, gm->eos);
    snprintf(gm->tok_dir, sizeof gm->tok_dir, "%s", p->init.from);
  }
  snprintf(gm->tok_plan, sizeof gm->tok_plan, "%s", p->data.tokenizer); /* what the plan trains with */
  return 0;
}

/* The prompt fits the model: 0, or an exit code with the message in err. */
static int check_prompt(const struct model *m, const char *opt, const int *prompt, int P, char *err,
                        size_t n)
{
  for (int i = 0; i < P; i++)
    if (prompt[i] >= m->config.vocab) {
      snprintf(err, n, "%s: token id %d is not below the model's vocabulary (%d)", opt, prompt[i],
               m->config.vocab);
      return EXIT_USAGE;
    }
  if (P > m->config.max_seq) {
    snprintf(err, n, "%s: %d tokens, longer than the model's max_seq (%d)", opt, P, m->config.max_seq);
    return EXIT_USAGE;
  }
  if (P == 0) {
    snprintf(err, n, "%s: the prompt has no tokens", opt);
    return EXIT_USAGE;
  }
  return 0;
}

/* The tokenizer (--tokenizer, else the plan's data.tokenizer, else a tokenizer.json in the model's
 * folder) and --prompt's ids. 0, or an exit code with the message. */
static int open_tokenizer(const struct gen_args *g, struct gen_model *gm, int *P, char *err, size_t n)
{
  char path[4300];
  const char *at = g->tokenizer;
  if (!at && gm->tok_plan[0])
    at = gm->tok_plan;
  if (!at && gm->tok_dir[0]) {
    snprintf(path, sizeof path, "%s/tokenizer.json", gm->tok_dir);
    if (access(path, F_OK) == 0)
      at = path;
  }
  if (!at && g->prompt) {
    snprintf(err, n, "--prompt needs a tokenizer, and %.2000s%s; give --tokenizer PATH (a tokenizer.json "
             "or the folder holding it) or the ids with --prompt-ids I,J,K",
             gm->tok_dir[0] ? gm->tok_dir : "the plan has no data.tokenizer and no init.from folder",
             gm->tok_dir[0] ? " holds no tokenizer.json" : " to find one in");
    return EXIT_USAGE;
  }
  if (!at)
    return 0;
  char why[2048];
  if (tokenizer_load(&gm->tok, at, why, sizeof why)) {
    gm->tok = NULL;
    snprintf(err, n, "%s%s", g->tokenizer ? "--tokenizer: " : "", why);
    return EXIT_USAGE;
  }
  if (gm->n_eos == 0 && tokenizer_eos(gm->tok) >= 0)
    gm->eos[gm->n_eos++] = (int)tokenizer_eos(gm->tok);
  if (!g->prompt)
    return 0;
  char *text;
  size_t len;
  struct tok_ids ids = { 0 };
  struct tok_worker *w = tok_worker_new(gm->tok);
  int bad = !w || text_utf8_clean(g->prompt, strlen(g->prompt), &text, &len);
  if (!bad) {
    bad = tok_encode(w, text, len, &ids, why, sizeof why);
    free(text);
  } else {
    snprintf(why, sizeof why, "out of memory");
  }
  if (w)
    tok_worker_free(w);
  if (!bad && !(gm->prompt = malloc((ids.n + 1) * sizeof *gm->prompt))) {
    bad = 1;
    snprintf(why, sizeof why, "out of memory");
  }
  for (size_t i = 0; !bad && i < ids.n; i++) gm->prompt[i] = ids.v[i] > 0x7fffffffu ? 0x7fffffff : (int)ids.v[i];
  *P = (int)ids.n;
  tok_ids_free(&ids);
  if (bad) {
    snprintf(err, n, "--prompt: %s", why);
    return EXIT_RUNTIME;
  }
  return 0;
}

/* ids[0, n) through the tokenizer's decoder: malloc'd text (NUL-terminated), or NULL. */
static char *decode(const struct tokenizer *tok, const int *ids, long long n, size_t *len)
{
  uint32_t *u = malloc((size_t)(n + 1) * sizeof *u);
  char *text = NULL, why[256];
  if (!u)
    return NULL;
  for (long long i = 0; i < n; i++) u[i] = (uint32_t)ids[i];
  if (tok_decode(tok, u, (size_t)n, &text, len, why, sizeof why))
    text = NULL;
  free(u);
  return text;
}

/* Streaming text: the continuation decoded again at each token, and the bytes past what is
 * printed written when the text extends what is printed and does not end in U+FFFD (a byte-level
 * token may hold part of a character, which decodes as U+FFFD until the rest comes). */
struct text_stream {
  const struct tokenizer *tok;
  int *ids;
  long long n;
  char *shown;     /* what is printed (malloc'd), `printed` bytes */
  size_t printed;
};

/* 1 when text[0, len) extends what ts printed. */
static int extends(const struct text_stream *ts, const char *text, size_t len)
{
  return len >= ts->printed && (ts->printed == 0 || memcmp(text, ts->shown, ts->printed) == 0);
}

static void emit_text(void *ctx, int id)
{
  struct text_stream *ts = ctx;
  ts->ids[ts->n++] = id;
  size_t len = 0;
  char *text = decode(ts->tok, ts->ids, ts->n, &len);
  const int partial = !text || (len >= 3 && memcmp(text + len - 3, "\xef\xbf\xbd", 3) == 0);
  if (!partial && len > ts->printed && text_utf8_valid(text, len) && extends(ts, text, len)) {
    fwrite(text + ts->printed, 1, len - ts->printed, stdout);
    fflush(stdout);
    free(ts->shown);
    ts->shown = text;
    ts->printed = len;
    return;
  }
  free(text);
}

/* Each token as it is chosen: printed and flushed. */
static void emit_id(void *ctx, int id)
{
  int *first = ctx;
  printf(*first ? "%d" : " %d", id);
  *first = 0;
  fflush(stdout);
}

/* t:generate's text prompts (tycho_runtime.h): this command's tokenizer, encoding and decoding. */
static void *codec_load(const char *path, char *err, size_t n)
{
  struct tokenizer *tok;
  return tokenizer_load(&tok, path, err, n) ? NULL : tok;
}

static int codec_encode(void *tok, const char *text, size_t len, int **ids, int *n, char *err, size_t err_size)
{
  char *clean;
  size_t clean_len;
  struct tok_ids v = { 0 };
  struct tok_worker *w = tok_worker_new(tok);
  int rc = !w || text_utf8_clean(text, len, &clean, &clean_len) ? errf(err, err_size, "out of memory") : 0;
  if (!rc) {
    rc = tok_encode(w, clean, clean_len, &v, err, err_size) ? -1 : 0;
    free(clean);
  }
  if (w)
    tok_worker_free(w);
  if (!rc && !(*ids = malloc((v.n + 1) * sizeof **ids)))
    rc = errf(err, err_size, "out of memory");
  for (size_t i = 0; !rc && i < v.n; i++) (*ids)[i] = v.v[i] > 0x7fffffffu ? 0x7fffffff : (int)v.v[i];
  *n = rc ? 0 : (int)v.n;
  tok_ids_free(&v);
  return rc;
}

static char *codec_decode(void *tok, const int *ids, long long n, size_t *len)
{
  return decode(tok, ids, n, len);
}

static void codec_close(void *tok)
{
  tokenizer_free(tok);
}

/* the tokenizer's eos (config.json beside it first, tokenizer.h): where a text prompt's generation stops */
static long long codec_eos(void *tok)
{
  return (long long)tokenizer_eos(tok);
}

void generate_set_text_codec(void)
{
  static const struct tycho_text_codec c = { codec_load, codec_encode, codec_decode, codec_close, codec_eos };
  tycho_runtime_set_text_codec(&c);
}

/* Generates; 0, or an exit code with the message in err. */
static int generate(const struct gen_args *g, struct gen_model *gm, const int *prompt, int P, char *err,
                    size_t n)
{
  int first = 1;
  const long long budget = gen_budget(gm->m, P, g->max_tokens);
  int *out = malloc((size_t)budget * sizeof *out);
  struct text_stream ts = { gm->tok, malloc((size_t)budget * sizeof(int)), 0, NULL, 0 };
  struct gen_request r = { prompt, P, g->max_tokens, g->s, gm->eos, gm->n_eos, g->no_cache,
                           g->json ? NULL : gm->tok ? emit_text : emit_id, gm->tok ? (void *)&ts : &first };
  if (!out || !ts.ids) {
    free(out);
    free(ts.ids);
    snprintf(err, n, "generate: out of memory");
    return EXIT_RUNTIME;
  }
  long long n_out = gen_run(gm->m, &r, out, err, n);
  size_t len = 0;
  char *text = n_out >= 0 && gm->tok ? decode(gm->tok, out, n_out, &len) : NULL;
  if (n_out >= 0 && g->json) {
    struct strbuf b;
    struct json j;
    sb_init(&b);
    json_init(&j, &b);
    if (text)
      json_string(&j, text);
    else
      json_null(&j);
    printf("{\"ids\": [");
    for (long long i = 0; i < n_out; i++) printf(i ? ", %d" : "%d", out[i]);
    printf("], \"text\": %.*s}\n", (int)b.n, b.s ? b.s : "null");
    sb_free(&b);
  } else if (n_out >= 0 && gm->tok) { /* the rest of the text, then the ids on stderr */
    if (text && extends(&ts, text, len))
      fwrite(text + ts.printed, 1, len - ts.printed, stdout);
    else if (text) /* the decoder changed what it had given: the whole text again */
      printf("\n%s", text);
    printf("\n");
    fputs("ids:", stderr);
    for (long long i = 0; i < n_out; i++) fprintf(stderr, " %d", out[i]);
    fputs("\n", stderr);
  } else if (n_out >= 0) {
    printf("\n");
  }
  fflush(stdout);
  free(text);
  free(out);
  free(ts.ids);
  free(ts.shown);
  return n_out < 0 ? EXIT_USAGE : 0;
}

int cmd_generate(lua_State *L, int argc, char **argv)
{
  struct cli c = { 0 };
  struct gen_args g = { 0 };
  parse_gen_args(L, argc, argv, &c, &g);
  int P = 0;
  const int *prompt = g.prompt_ids ? parse_ids(L, g.prompt_ids, &P) : NULL;
  struct gen_model *gm = lua_newuserdatauv(L, sizeof *gm, 0);
  memset(gm, 0, sizeof *gm);
  char err[4096];
  const int folder = hf_is_folder(g.source);
  int code = folder ? open_folder(gm, g.source, err, sizeof err) : open_plan(L, &c, gm, err, sizeof err);
  if (!code)
    code = open_tokenizer(&g, gm, &P, err, sizeof err);
  if (!code && g.prompt)
    prompt = gm->prompt;
  if (!code)
    code = check_prompt(gm->m, g.prompt ? "--prompt" : "--prompt-ids", prompt, P, err, sizeof err);
  if (!code) {
    const struct plan_model *mc = &gm->m->config;
    char how[160];
    if (g.s.temperature > 0)
      snprintf(how, sizeof how, "sampled: temperature %g, top_k %d, top_p %g, seed %llu", g.s.temperature,
               g.s.top_k, g.s.top_p, (unsigned long long)g.s.seed);
    else
      snprintf(how, sizeof how, "greedy");
    char sparse[160] = "";
    int n_sparse = 0;
    for (int l = 0; gm->m->moe && l < mc->n_layers; l++) n_sparse += gm->m->moe[l];
    if (n_sparse)
      snprintf(sparse, sizeof sparse, " (%d sparse: %d experts, top %d, every assignment kept)", n_sparse,
               mc->moe.experts, mc->moe.top_k);
    fprintf(stderr, "generate: %d layers%s, dim %d, %d heads / %d kv, vocab %d, in %s on the CPU%s; weights: %s; "
            "%s, at most %lld tokens%s\n", mc->n_layers, sparse, mc->dim, mc->n_heads, mc->n_kv_heads, mc->vocab,
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
