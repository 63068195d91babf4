/* `tycho check` (the plan's layout, memory bill and predicted step, as text, JSON or a batch
 * script; --svg FILE draws the step and the memory besides) and `tycho tune` (the best layouts
 * for a world and a cluster, the best written as a plan file): the commands that read a plan
 * without running it (host/check/). */
#define _POSIX_C_SOURCE 200809L /* getcwd */
#include <lua.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check/check.h"
#include "check/sbatch.h"
#include "check/svg.h"
#include "check/tune.h"
#include "cli.h"
#include "util/launch.h"
#include "util/path.h"
#include "util/strbuf.h"

/* One of tune's layouts as a line: LABEL tp .. pp .. v .. dp .., micro .., zero .., recompute .., ... */
static void print_choice(const char *label, const struct tune_choice *t)
{
  char rc[96], every[96] = "";
  if (t->zero >= 2) /* zero_every: how often the step reduce-scatters (and gathers) */
    snprintf(every, sizeof every, " (grads every %s%s%s)", t->grads_step ? "step" : "micro-batch",
             t->zero == 3 ? ", params every " : "", t->zero == 3 ? (t->params_step ? "step" : "micro-batch") : "");
  char ep[40] = "", zb[96] = "";
  if (t->zb) { /* zb-h1, and why `tycho run` refuses it where it does (layout/supported.c) */
    const char *why = t->moe              ? "MoE"
                      : tune_choice_runs(t) ? NULL
                      : !t->grads_step      ? "grads every micro-batch"
                                            : "params every micro-batch";
    if (why)
      snprintf(zb, sizeof zb, ", schedule zb-h1 (check prices it; run refuses it with %s)", why);
    else
      snprintf(zb, sizeof zb, ", schedule zb-h1");
  }
  if (t->ep > 1)
    snprintf(ep, sizeof ep, " ep %d", t->ep);
  if (t->cp > 1)
    snprintf(ep + strlen(ep), sizeof ep - strlen(ep), " cp %d", t->cp);
  printf("%s tp %d pp %d v %d dp %d%s, micro %d, zero %d%s, recompute %s, sequence parallel %s%s%s: "
         "%.3f s/step, %.0f tokens/s, MFU %.1f%%, %.1f GiB on the fullest rank (%.0f%% spare)\n", label,
         t->tp, t->pp, t->v, t->dp, ep, t->micro, t->zero, every, plan_recompute_text(t->recompute, rc, sizeof rc),
         t->sp ? "on" : "off", t->kv_replicate ? ", k and v replicated" : "",
         zb, t->step, t->tokens_per_s,
         100.0 * t->mfu, t->max_bytes / (1024.0 * 1024.0 * 1024.0), 100.0 * t->headroom);
}

/* The best layouts of a model for a world and a cluster; the fastest that `tycho run` runs written
 * as a plan file. */
int cmd_tune(lua_State *L, const struct cli *c)
{
  if (!c->world)
    return host_fail(L, EXIT_USAGE, "tune needs --world N (the ranks to plan for)");
  if (!c->cluster)
    return host_fail(L, EXIT_USAGE, "tune needs --cluster C.lua (e.g. plans/clusters/h100_80g_ib.lua)");
  struct plan *p = compile_or_fail(L, c, 0); /* the model and batch; tune picks the mesh */
  const struct cluster *cl = load_cluster(L, c);
  const double headroom = c->headroom_given ? c->headroom : 0.10;
  const int top = c->top > 0 ? c->top : 5;
  struct tune_result r;
  char err[1024];
  if (tune_search(p, c->world, cl, headroom, top, &r, err, sizeof err))
    return host_fail(L, EXIT_RUNTIME, "%s", err);
  printf("tune %s for %d ranks on %s: %d layouts tried, %d valid, %d fit with %.0f%% headroom (%.2f s)\n",
         p->name[0] ? p->name : c->plan, c->world, cl->name, r.n_tried, r.n_valid, r.n_fit,
         100.0 * headroom, r.seconds);
  if (r.n_best == 0) {
    tune_result_free(&r);
    return host_fail(L, EXIT_USAGE, "no layout of %s fits %d ranks of %s with %.0f%% headroom; more ranks, "
                     "a larger device or a smaller micro-batch", c->plan, c->world, cl->name, 100.0 * headroom);
  }
  for (int i = 0; i < r.n_best; i++) {
    char label[16];
    snprintf(label, sizeof label, "%2d.", i + 1);
    print_choice(label, &r.best[i]);
  }
  /* the best as a plan file, by default next to the model's */
  char module[256], path[1200], command[1600];
  const char *base = strrchr(c->plan, '/');
  base = base ? base + 1 : c->plan;
  snprintf(module, sizeof module, "%s", base);
  char *dot = strrchr(module, '.');
  if (dot && strcmp(dot, ".lua") == 0)
    *dot = 0;
  if (c->out)
    snprintf(path, sizeof path, "%s", c->out);
  else
    snprintf(path, sizeof path, "%.*s%s_tuned_%d.lua", (int)(base - c->plan), c->plan, module, c->world);
  snprintf(command, sizeof command, "tycho tune %s --world %d --cluster %s", c->plan, c->world, c->cluster);
  FILE *f;
  char why[1400];
  const int opened = path_fopen_output(c->out ? "--out" : NULL, path, 0, &f, why, sizeof why);
  if (opened) { /* 2: a FIFO, a device or a folder at the path, left as it is */
    tune_result_free(&r);
    return host_fail(L, opened == 2 ? EXIT_USAGE : EXIT_RUNTIME, "%s", why);
  }
  char werr[1400] = "";
  /* the written plan is one `tycho run` runs: the fastest such, where a zb-h1 layout it does not
   * run (tune_choice_runs: MoE, ZeRO 2 and 3 with zero_every "micro_batch") ranks first */
  const int best_runs = tune_choice_runs(&r.best[0]);
  const struct tune_choice *w = !best_runs && r.have_runnable ? &r.runnable : &r.best[0];
  if (w != &r.best[0]) /* the line again, as the written plan's */
    print_choice("written (the fastest that tycho run runs; it runs zb-h1 on dense layers, under ZeRO 2 and 3 "
                 "with zero_every \"step\" only):", w);
  int bad = tune_write_plan(f, c->plan, path, c->n_sets, c->sets, w, command, werr, sizeof werr);
  if (fclose(f))
    bad = 1;
  tune_result_free(&r);
  if (bad)
    return host_fail(L, EXIT_RUNTIME, "%s", werr[0] ? werr : "cannot write the tuned plan");
  printf("wrote %s (check it: tycho check %s --world %d --cluster %s)\n", path, path, c->world, c->cluster);
  return 0;
}

int cmd_check(lua_State *L, const struct cli *c)
{
  if (c->sbatch && !c->cluster)
    return host_fail(L, EXIT_USAGE, "--sbatch needs --cluster C.lua, the cluster the job runs on (e.g. "
                     "plans/clusters/h100_80g_ib.lua): its nodes size the script");
  if (c->sbatch && c->json)
    return host_fail(L, EXIT_USAGE, "--sbatch and --json: choose one (the script, or the JSON document)");
  if (c->cpus_per_task && !c->sbatch)
    return host_fail(L, EXIT_USAGE, "--cpus-per-task is for the batch script: tycho check PLAN --world N "
                     "--cluster C.lua --sbatch --cpus-per-task N");
  struct plan *p = compile_or_fail(L, c, c->world);
  char cp_err[512];
  if (check_cp_refused(p, "check", cp_err, sizeof cp_err))
    return host_fail(L, EXIT_USAGE, "%s", cp_err);
  const struct cluster *cl = load_cluster(L, c);
  if (c->svg) { /* first, so a bad path fails before anything is printed */
    char err[5000];
    const int rc = check_svg_write(p, cl, c->svg, err, sizeof err);
    if (rc)
      return host_fail(L, rc == 2 ? EXIT_USAGE : EXIT_RUNTIME, "%s", err);
  }
  if (c->sbatch) {
    char self[4096], cwd[4096], err[1024];
    if (!getcwd(cwd, sizeof cwd))
      return host_fail(L, EXIT_RUNTIME, "--sbatch: cannot read the current folder: %s", strerror(errno));
    const struct sbatch_options so = { c->plan, c->cluster, launch_self_path(self, sizeof self, "tycho"), cwd,
                                       c->n_sets, c->sets, c->cpus_per_task, c->unsafe };
    const int rc = check_write_sbatch(p, cl, &so, stdout, err, sizeof err);
    if (rc)
      return host_fail(L, rc == 2 ? EXIT_USAGE : EXIT_RUNTIME, "%s", err);
  } else if (c->json) {
    struct strbuf b;
    sb_init(&b);
    check_write_json(p, cl, &b);
    if (b.failed) {
      sb_free(&b);
      return host_fail(L, EXIT_RUNTIME, "out of memory writing the JSON document");
    }
    fwrite(b.s, 1, b.n, stdout);
    sb_free(&b);
  } else {
    check_print_text(p, cl, stdout);
    if (c->svg)
      printf("svg        wrote %s (the step's schedule and each pipeline rank's memory, drawn)\n", c->svg);
  }
  if (fflush(stdout) != 0)
    return host_fail(L, EXIT_RUNTIME, "cannot write to stdout");
  return 0;
}
