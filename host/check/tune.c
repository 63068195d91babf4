/* `tycho tune` (tune.h). */
#define _XOPEN_SOURCE 700
#include "check/tune.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check/check_zb.h"
#include "check/cost.h"
#include "lua/sandbox.h"
#include "plan/compile.h"
#include "layout/bill.h"
#include "layout/supported.h"
#include "util/err.h"
#include "util/path.h"

static double now(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int tune_choice_runs(const struct tune_choice *c)
{
  return !c->zb || (!c->moe && bill_split_runs_zero(c->zero, c->grads_step, c->params_step));
}

static void insert(struct tune_result *r, int keep, const struct tune_choice *c)
{
  /* the fastest the runtime runs (tune_choice_runs), which the written plan takes */
  const int runs = tune_choice_runs(c);
  if (runs && (!r->have_runnable || c->step < r->runnable.step ||
                 (c->step == r->runnable.step && c->max_bytes < r->runnable.max_bytes))) {
    r->runnable = *c;
    r->have_runnable = 1;
  }
  int at = r->n_best; /* by step time; of two alike, the one with less memory first */
  while (at > 0 && (r->best[at - 1].step > c->step ||
                    (r->best[at - 1].step == c->step && r->best[at - 1].max_bytes > c->max_bytes)))
    at--;
  if (at >= keep)
    return;
  int n = r->n_best < keep ? r->n_best + 1 : keep;
  memmove(r->best + at + 1, r->best + at, (size_t)(n - at - 1) * sizeof *r->best);
  r->best[at] = *c;
  r->n_best = n;
}

/* Builds and prices one candidate; returns 2 when it fit, 1 when it compiled only, 0 otherwise. */
static int try_one(const struct plan *base, int world, const struct cluster *c, double headroom, int keep,
                   struct tune_choice *ch, struct tune_result *r)
{
  struct plan p;
  char err[512];
  if (plan_copy(&p, base))
    return 0;
  p.mesh.tp = ch->tp;
  p.mesh.pp = ch->pp;
  p.mesh.dp = ch->dp;
  p.mesh.ep = ch->ep;
  p.mesh.cp = ch->cp;
  p.mesh.world = world;
  p.mesh.dp_auto = 0;
  p.mesh.world_assumed = 0;
  p.virtual_stages = ch->v;
  p.stages_kind = PLAN_STAGES_BALANCED;
  p.stages_is_function = 0;
  p.schedule = ch->v > 1 ? PLAN_SCHED_INTERLEAVED : ch->zb ? PLAN_SCHED_ZB_H1 : PLAN_SCHED_1F1B;
  p.batch.micro = ch->micro;
  p.zero = ch->zero;
  p.zero_every.grads_set = ch->zero >= 2; /* the base plan's choices are the search's now */
  p.zero_every.params_set = ch->zero == 3;
  p.zero_every.grads = ch->grads_step ? PLAN_ZERO_EVERY_STEP : PLAN_ZERO_EVERY_MICRO_BATCH;
  p.zero_every.params = ch->params_step ? PLAN_ZERO_EVERY_STEP : PLAN_ZERO_EVERY_MICRO_BATCH;
  p.sequence_parallel = ch->sp;
  for (int l = 0; l < p.model.n_layers; l++) {
    p.layers[l].recompute = ch->recompute;
    if (ch->kv_replicate) {
      p.layers[l].split[PLAN_MOD_K] = PLAN_SPLIT_REPLICATE;
      p.layers[l].split[PLAN_MOD_V] = PLAN_SPLIT_REPLICATE;
    }
  }
  int ok = plan_validate(&p, err, sizeof err) == 0;
  if (ok) {
    r->n_valid++;
    double worst = 0;
    struct bill b;
    /* zb-h1: what its deferred W's hold beyond the bill, as check prints it (0 where the bill
     * counts it: bill_split_runs) */
    struct check_zb_held *zb = ch->zb ? calloc((size_t)p.mesh.pp, sizeof *zb) : NULL;
    if (ch->zb && (!zb || check_zb_held(&p, NULL, zb, err, sizeof err)))
      ok = 0;
    for (int k = 0; k < p.mesh.pp && ok; k++) {
      if (bill_predict(&p, k, &b, err, sizeof err))
        ok = 0;
      else {
        const double device = b.total - b.host_total + (zb ? check_zb_rank_bytes(&zb[k], &b) : 0);
        worst = device > worst ? device : worst; /* the device's part */
      }
    }
    free(zb);
    struct cost cost;
    if (ok && worst <= c->device_memory * (1.0 - headroom) && cost_predict(&p, c, &cost, err, sizeof err) == 0) {
      r->n_fit++;
      ch->step = cost.step;
      ch->mfu = cost.mfu;
      ch->tokens_per_s = cost.tokens_per_s;
      ch->max_bytes = worst;
      ch->headroom = 1.0 - worst / c->device_memory;
      insert(r, keep, ch);
      ok = 2;
    }
  }
  plan_free(&p);
  return ok;
}

/* One layout with zero ch->zero over its zero_every choices, fastest first: "step" for both
 * (fewest collectives, the most held during a step), then each one "micro_batch", then both (the
 * least memory, the most collectives). Under the step-time model each choice of "step" is as
 * fast or faster and holds as much or more, so the first to fit is the fastest that fits: the
 * slower ones are not priced. With one micro-batch per step the gradients' choices move the
 * same bytes, and "micro_batch" (less memory) is the only one tried. */
static void tune_zero_every(const struct plan *base, int world, const struct cluster *c, double headroom,
                            int keep, struct tune_choice *ch, struct tune_result *r)
{
  if (ch->zero < 2) {
    r->n_tried++;
    try_one(base, world, c, headroom, keep, ch, r);
    return;
  }
  const int microbatches = base->batch.global / (ch->micro * ch->dp);
  const int gmax = microbatches > 1, qmax = ch->zero == 3; /* the choices there are */
  for (int level = gmax + qmax; level >= 0; level--) { /* how many of them are "step" */
    int fit = 0;
    for (int g = gmax; g >= 0; g--)
      for (int q = qmax; q >= 0; q--) {
        if (g + q != level)
          continue;
        struct tune_choice one = *ch;
        one.grads_step = g;
        one.params_step = q;
        r->n_tried++;
        fit |= try_one(base, world, c, headroom, keep, &one, r) == 2;
      }
    if (fit)
      return;
  }
}

int tune_search(const struct plan *base, int world, const struct cluster *c, double headroom, int keep,
                struct tune_result *out, char *err, size_t err_size)
{
  memset(out, 0, sizeof *out);
  if (keep < 1)
    keep = 1;
  out->best = calloc((size_t)keep, sizeof *out->best);
  if (!out->best)
    return errf(err, err_size, "out of memory");
  const double start = now();
  const struct plan_model *m = &base->model;
  static const uint8_t recomputes[] = { 0, PLAN_RC_ATTN_CORE, PLAN_RC_FULL };
  static const int micros[] = { 1, 2, 4, 8 };
  /* cp 1; then, where nothing fit, each cp the runtime runs with this plan (tune.h) */
  int fit_without_cp = 0;
  for (int cp = 1; cp <= world; cp++) {
    if (cp == 2)
      fit_without_cp = out->n_fit > 0;
    if (cp > 1) {
      struct plan q;
      char why[512];
      if (fit_without_cp || world % cp || base->batch.seq % (2 * cp) || plan_copy(&q, base))
        continue;
      q.mesh.cp = cp;
      const int refused = plan_cp_refused(&q, why, sizeof why) != 0;
      plan_free(&q);
      if (refused)
        break;
    }
  for (int tp = 1; tp <= c->gpus_per_node && tp <= m->n_heads; tp++) {
    if (m->n_heads % tp || world % (tp * cp))
      continue;
    for (int pp = 1; pp <= m->n_layers; pp++) {
      if (m->n_layers % pp || world % (tp * cp * pp))
        continue;
      const int dp = world / (tp * cp * pp);
      for (int v = 1; v <= 2; v++) {
        if (v > 1 && (pp == 1 || (m->n_layers / pp) % v))
          continue;
        for (size_t mi = 0; mi < sizeof micros / sizeof *micros; mi++) {
          const int micro = micros[mi];
          if (base->batch.global % (micro * dp))
            continue;
          for (int ep = 1; ep <= dp; ep++) {
            if (dp % ep || (ep > 1 && (m->moe.experts <= 0 || m->moe.experts % ep)))
              continue;
            for (int zero = 1; zero <= 3; zero++)
              for (size_t ri = 0; ri < sizeof recomputes; ri++)
                for (int zb = 0; zb <= (v == 1 && pp > 1 && cp == 1); zb++) { /* zb-h1 beside 1F1B (not with cp) */
                  struct tune_choice ch = { .tp = tp, .pp = pp, .v = v, .dp = dp, .micro = micro, .zero = zero,
                                            .sp = tp > 1, .kv_replicate = tp > 1 && m->n_kv_heads % tp != 0,
                                            .ep = ep, .moe = m->moe.experts > 0, .recompute = recomputes[ri],
                                            .zb = zb, .cp = cp };
                  tune_zero_every(base, world, c, headroom, keep, &ch, out);
                }
          }
        }
      }
    }
  }
  }
  out->seconds = now() - start;
  return 0;
}

void tune_result_free(struct tune_result *r)
{
  free(r->best);
  memset(r, 0, sizeof *r);
}

/* ---- the written plan ------------------------------------------------------------------- */

/* The module name by which a plan written at out_path requires exactly the file base_path: the
 * shortest dotted name, made of the last folders of base_path's real path and its file name
 * less ".lua", that `require` in the written file resolves to that same file (the sandbox's own
 * search, sandbox_find_module, from the written file's folder). 0 when there is none: a file
 * name with dots or other characters require refuses, a base outside the search path or
 * behind a namesake found first. */
static int base_module(const char *base_path, const char *out_path, char *module, size_t n)
{
  char out_dir[PATH_MAX], real_base[PATH_MAX], stem[PATH_MAX];
  snprintf(out_dir, sizeof out_dir, "%s", out_path);
  char *slash = strrchr(out_dir, '/');
  if (slash)
    *slash = 0;
  else
    snprintf(out_dir, sizeof out_dir, ".");
  if (!realpath(base_path, real_base))
    return 0;
  const size_t bl = strlen(real_base);
  if (bl < 5 || strcmp(real_base + bl - 4, ".lua") != 0)
    return 0;
  snprintf(stem, sizeof stem, "%.*s", (int)(bl - 4), real_base);
  for (char *start = strrchr(stem, '/'); start; ) {
    const char *rel = start + 1; /* the last parts of the path, as folder/folder/file */
    char name[PATH_MAX], found[PATH_MAX + 600], real_found[PATH_MAX];
    if (strchr(rel, '.')) /* a dot inside a part: no dotted name reaches it, nor any longer one */
      return 0;
    snprintf(name, sizeof name, "%s", rel);
    for (char *p = name; *p; p++)
      if (*p == '/')
        *p = '.';
    if (strlen(name) < n && sandbox_find_module(out_dir, name, found, sizeof found) &&
        realpath(found, real_found) && strcmp(real_found, real_base) == 0) {
      snprintf(module, n, "%s", name);
      return 1;
    }
    if (start == stem)
      break;
    do
      start--;
    while (start > stem && *start != '/');
    if (*start != '/')
      break;
  }
  return 0;
}

/* s on one line of a Lua comment: a control byte could end the comment and start code. */
static void comment_text(FILE *f, const char *s)
{
  for (; *s; s++)
    fputc((unsigned char)*s < 0x20 ? '?' : *s, f);
}

int tune_write_plan(FILE *f, const char *plan_path, const char *out_path, int n_sets, const char *const *sets,
                    const struct tune_choice *t, const char *command, char *err, size_t err_size)
{
  char rc[96], module[256];
  fputs("-- Written by `", f);
  comment_text(f, command);
  fputs("`:\n", f);
  fprintf(f, "-- the fastest layout that fits, by the predicted step time (%.3f s per step, MFU %.1f%%,\n"
             "-- %.1f GiB on the fullest rank, %.0f%% of device memory spare). Check it with tycho check.\n",
          t->step, 100.0 * t->mfu, t->max_bytes / (1024.0 * 1024.0 * 1024.0), 100.0 * t->headroom);
  fprintf(f, "local tycho = require \"tycho\"\n\n");
  if (base_module(plan_path, out_path, module, sizeof module)) {
    fprintf(f, "local plan = require \"%s\" -- ", module);
    comment_text(f, plan_path);
    fputs("\n", f);
  } else {
    /* No name require takes finds the base from here: its text, as tuned, runs in place. */
    char *text;
    size_t n;
    if (path_read_input("tune: the base plan", plan_path, PATH_MAX_TEXT_BYTES, &text, &n, err, err_size))
      return -1;
    fputs("-- The base plan, ", f);
    comment_text(f, plan_path);
    fputs(", as it was when tuned: from this folder no name\n"
          "-- `require` takes (letters, digits, '_' and '-', in the plan search path) finds that file.\n"
          "local plan = (function()\n", f);
    fwrite(text, 1, n, f);
    fputs("\nend)()\n", f);
    free(text);
  }
  if (n_sets > 0) {
    fputs("\n-- The --set overrides tune was given, applied as --set applies them.\n"
          "local function set(path, value)\n"
          "  local t = plan\n"
          "  for i = 1, #path - 1 do\n"
          "    if rawget(t, path[i]) == nil then rawset(t, path[i], {}) end\n"
          "    t = rawget(t, path[i])\n"
          "  end\n"
          "  rawset(t, path[#path], value)\n"
          "end\n", f);
    for (int i = 0; i < n_sets; i++)
      plan_set_as_lua(f, sets[i]);
  }
  fputs("\n", f);
  fprintf(f, "return tycho.extend(plan, {\n");
  char cp[32] = "";
  if (t->cp > 1)
    snprintf(cp, sizeof cp, ", cp = %d", t->cp);
  if (t->ep > 1 || t->moe) /* ep written for a MoE model even at 1: the base plan may set another */
    fprintf(f, "  mesh = { tp = %d, pp = %d, dp = \"auto\", ep = %d%s },\n", t->tp, t->pp, t->ep > 1 ? t->ep : 1, cp);
  else
    fprintf(f, "  mesh = { tp = %d, pp = %d, dp = \"auto\"%s },\n", t->tp, t->pp, cp);
  fprintf(f, "  stages = \"balanced\",\n");
  fprintf(f, "  virtual_stages = %d,\n", t->v);
  fprintf(f, "  schedule = { kind = \"%s\" },\n", t->v > 1 ? "interleaved" : t->zb ? "zb-h1" : "1f1b");
  fprintf(f, "  batch = { micro = %d },\n", t->micro);
  fprintf(f, "  zero = %d,\n", t->zero);
  if (t->zero == 2)
    fprintf(f, "  zero_every = { grads = \"%s\" },\n", t->grads_step ? "step" : "micro_batch");
  if (t->zero == 3)
    fprintf(f, "  zero_every = { grads = \"%s\", params = \"%s\" },\n", t->grads_step ? "step" : "micro_batch",
            t->params_step ? "step" : "micro_batch");
  fprintf(f, "  sequence_parallel = %s,\n", t->sp ? "true" : "false");
  if (t->recompute == 0 || t->recompute == PLAN_RC_FULL)
    fprintf(f, "  recompute = \"%s\",\n", plan_recompute_text(t->recompute, rc, sizeof rc));
  else
    fprintf(f, "  recompute = { \"%s\" },\n", plan_recompute_text(t->recompute, rc, sizeof rc));
  if (t->kv_replicate)
    fprintf(f, "  tp_split = { k = \"replicate\", v = \"replicate\" },\n");
  fprintf(f, "})\n");
  if (ferror(f)) {
    errf(err, err_size, "cannot write %s", out_path);
    return -1;
  }
  return 0;
}
