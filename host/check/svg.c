/* check_svg (svg.h): the step and the memory bill of `tycho check` as one SVG document that needs
 * nothing else (no script, no external style or font), so a browser or rsvg-convert draws it alone.
 *
 * The schedule part is the simulation `check` prints its timeline and bubble from (sched_from_plan,
 * then sched_simulate: per-stage costs from forward FLOPs, the mean stage's forward 1 unit), so the
 * blocks stand where that timeline puts them and the bubble is the figure check prints. Every
 * compute block is one <rect class="blk K mbM rR cC"> (K: F forward, B backward, R recompute, W weight
 * gradient: a zero-bubble schedule's backward is B, its input gradient, and W; M the
 * micro-batch, R the pipeline rank, C the chunk) on a line of its own, in each rank's instruction
 * order, so a program (tests/e2e/check_svg.sh) can read them back and compare them with the lists
 * of `check --json` (the enlarged start and end of a long step repeat blocks as class "zblk").
 * A lane's background is the idle colour: what no block covers is the bubble. The memory part is
 * check's bill, category by category, per pipeline rank. */
#define _POSIX_C_SOURCE 200809L /* lstat */
#include "check/svg.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check/check_ep.h"
#include "check/check_internal.h"
#include "check/cost.h"
#include "layout/bill.h"
#include "sched/sched.h"
#include "util/file.h"
#include "util/path.h"

/* The page: a fixed width that a README shows whole; lanes and bars as tall as they need. */
enum { WIDTH = 1200, LEFT = 150, RIGHT = 40, LANE_H = 26, LANE_GAP = 6, BAR_H = 22, BAR_GAP = 10 };
#define PLOT_W ((double)(WIDTH - LEFT - RIGHT))

static const char *const kind_fill[4] = { "#4c78a8", "#f58518", "#b279a2", "#54a24b" }; /* F, B, R, W */
static const char *const kind_name[4] = { "forward", "backward", "recompute", "weight gradient" };
static const char kind_letter[4] = { 'F', 'B', 'R', 'W' };
/* The bill's categories, in check_bill_order (params .. checkpoint). */
static const char *const category_fill[ALLOC_N_CATEGORIES] = { "#4c78a8", "#72b7b2", "#54a24b", "#f58518",
                                                                "#e45756", "#b279a2", "#9d755d" };

/* Text as XML character data or an attribute value: & < > " ' escaped; bytes XML 1.0 cannot
 * hold (control bytes, bytes that begin no valid UTF-8 sequence) written as '?', so any plan
 * name gives a well-formed document. */
static void put_xml(struct strbuf *b, const char *s)
{
  const unsigned char *u = (const unsigned char *)s;
  while (*u) {
    const unsigned char c = *u;
    int len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 && c >= 0xc2 ? 2 : (c & 0xf0) == 0xe0 ? 3
              : (c & 0xf8) == 0xf0 && c <= 0xf4 ? 4 : 0;
    for (int k = 1; k < len; k++)
      if ((u[k] & 0xc0) != 0x80)
        len = 0;
    if (len == 3 && ((c == 0xe0 && u[1] < 0xa0) || (c == 0xed && u[1] >= 0xa0)))
      len = 0; /* overlong, or a UTF-16 surrogate */
    if (len == 4 && ((c == 0xf0 && u[1] < 0x90) || (c == 0xf4 && u[1] >= 0x90)))
      len = 0;
    if (len == 0 || (c < 0x20 && c != '\t' && c != '\n')) {
      sb_puts(b, "?");
      u++;
      continue;
    }
    switch (c) {
    case '&': sb_puts(b, "&amp;"); break;
    case '<': sb_puts(b, "&lt;"); break;
    case '>': sb_puts(b, "&gt;"); break;
    case '"': sb_puts(b, "&quot;"); break;
    case '\'': sb_puts(b, "&apos;"); break;
    default: sb_put(b, (const char *)u, (size_t)len);
    }
    u += len;
  }
}

/* <text> at (x, y) with the given attributes (size, anchor, ...) and escaped content. */
static void text_at(struct strbuf *b, double x, double y, const char *attrs, const char *content)
{
  sb_printf(b, "<text x=\"%.1f\" y=\"%.1f\" %s>", x, y, attrs);
  put_xml(b, content);
  sb_puts(b, "</text>\n");
}

/* The stages a pipeline rank holds, as "stage 1: layers 20-39", or "stages 1, 5" for several. */
static void rank_stages(const struct plan *p, int r, char *buf, size_t n)
{
  size_t used = 0;
  buf[0] = 0;
  if (p->n_stages > p->mesh.pp) {
    for (int s = 0; s < p->n_stages && used < n; s++)
      if (p->stages[s].pp_rank == r)
        used += (size_t)snprintf(buf + used, n - used, "%s%d", used ? ", " : "stages ", s);
    return;
  }
  for (int s = 0; s < p->n_stages && used < n; s++) {
    const struct plan_stage *st = &p->stages[s];
    if (st->pp_rank != r)
      continue;
    if (st->first_layer < 0 || st->n_layers == 0)
      used += (size_t)snprintf(buf + used, n - used, "%sstage %d: no layer", used ? ", " : "", s);
    else if (st->n_layers == 1)
      used += (size_t)snprintf(buf + used, n - used, "%sstage %d: layer %d", used ? ", " : "", s, st->first_layer);
    else
      used += (size_t)snprintf(buf + used, n - used, "%sstage %d: layers %d-%d", used ? ", " : "", s,
                               st->first_layer, st->first_layer + st->n_layers - 1);
  }
}

/* A step of about span/8 of the form 1, 2 or 5 × 10^k, for axis ticks. */
static double tick_step(double span)
{
  const double raw = span / 8.0, mag = pow(10.0, floor(log10(raw)));
  const double f = raw / mag;
  return mag * (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10);
}

static int kind_of(int op)
{
  return op == SCHED_FWD ? 0 : op == SCHED_BWD || op == SCHED_BWD_B ? 1 : op == SCHED_RECOMPUTE ? 2
         : op == SCHED_BWD_W ? 3 : -1;
}

/* The legend entry: a swatch and its words, at (x, y); returns the x after it. */
static double legend_item(struct strbuf *b, double x, double y, const char *fill, const char *words)
{
  sb_printf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"%s\" stroke=\"#555\" "
            "stroke-width=\"0.5\"/>\n", x, y - 11, fill);
  text_at(b, x + 19, y, "font-size=\"12\"", words);
  return x + 19 + 7.0 * (double)strlen(words) + 18;
}

/* The lanes of the pipeline ranks from time t0 to t1 over `width` pixels from x_left, and their
 * time axis: each lane is the idle pattern, every compute block inside [t0, t1] a rect of class
 * `cls` (cut to the window) in the rank's instruction order, labelled where it is wide enough.
 * With x_left = LEFT the ranks are named at the left. Returns the y below the axis. */
static double draw_lanes(const struct plan *p, const struct sched *s, const struct sched_sim *sim, struct strbuf *b,
                         double y, double x_left, double width, double t0, double t1, const char *cls)
{
  const double scale = width / (t1 - t0);
  for (int r = 0; r < s->pp; r++) {
    const double top = y + r * (LANE_H + LANE_GAP);
    if (x_left == LEFT) {
      char label[64], stages[512];
      snprintf(label, sizeof label, "pp rank %d", r);
      text_at(b, LEFT - 8, top + 11, "font-size=\"12\" text-anchor=\"end\" font-weight=\"bold\"", label);
      rank_stages(p, r, stages, sizeof stages);
      if (strlen(stages) > 24)
        snprintf(stages + 21, sizeof stages - 21, "...");
      text_at(b, LEFT - 8, top + 23, "font-size=\"10\" text-anchor=\"end\" fill=\"#555\"", stages);
    }
    sb_printf(b, "<rect class=\"lane\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"url(#idle)\"/>\n",
              x_left, top, width, LANE_H);
    const struct sched_list *l = &s->ranks[r];
    const struct sched_sim_rank *sr = &sim->ranks[r];
    for (int i = 0; i < l->n; i++) {
      const struct sched_instr *in = &l->instr[i];
      const int k = kind_of(in->op);
      if (k < 0 || sr->end[i] <= t0 || sr->start[i] >= t1)
        continue;
      const int chunk = in->stage / s->pp;
      const double a = fmax(sr->start[i], t0), e = fmin(sr->end[i], t1);
      const double x0 = x_left + (a - t0) * scale, w = (e - a) * scale;
      sb_printf(b, "<rect class=\"%s %c mb%d r%d c%d\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\"%s%s>", cls,
                kind_letter[k], in->mb, r, chunk, x0, top, w, LANE_H, chunk % 2 ? " fill-opacity=\"0.7\"" : "",
                w >= 4 ? " stroke=\"#fff\" stroke-width=\"0.6\"" : "");
      if (w >= 6) /* a tooltip where one can point at the block */
        sb_printf(b, "<title>%s of micro-batch %d, stage %d, %.4g to %.4g</title>", kind_name[k], in->mb, in->stage,
                  sr->start[i], sr->end[i]);
      sb_puts(b, "</rect>\n");
      char text[32], name[8] = "";
      if (s->v > 1)
        snprintf(name, sizeof name, "%c", chunk < 26 ? 'a' + chunk : '+');
      const int len = snprintf(text, sizeof text, "%d%s", in->mb, name);
      if (w >= 7.0 * len + 4)
        sb_printf(b, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\" fill=\"#fff\">%s</text>\n",
                  x0 + w / 2, top + LANE_H / 2.0 + 4, text);
    }
  }
  y += s->pp * (LANE_H + LANE_GAP);
  sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x_left, y, x_left + width, y);
  const double step = tick_step((t1 - t0) * PLOT_W / width);
  for (double t = ceil(t0 / step - 1e-9) * step; t <= t1 * (1 + 1e-9); t += step) {
    char tv[32];
    snprintf(tv, sizeof tv, "%.6g", fabs(t) < 1e-9 ? 0.0 : t);
    const double tx = x_left + (t - t0) * scale;
    sb_printf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", tx, y, tx, y + 5);
    text_at(b, tx, y + 17, "font-size=\"11\" text-anchor=\"middle\"", tv);
  }
  return y + 26;
}

/* The lanes: one per pipeline rank, its compute blocks where the simulator puts them. Returns the
 * y below what it drew. */
static double draw_schedule(const struct plan *p, struct strbuf *b, double y)
{
  struct sched s;
  struct sched_sim sim;
  char err[512], line[1024];
  if (sched_from_plan(p, &s, err, sizeof err) != 0 || sched_simulate(&s, &sim, err, sizeof err) != 0) {
    snprintf(line, sizeof line, "(no schedule to draw: %s)", err);
    text_at(b, LEFT, y + 16, "font-size=\"13\" fill=\"#a00\"", line);
    sched_free(&s);
    return y + 30;
  }
  char v[64] = "";
  if (s.v > 1)
    snprintf(v, sizeof v, ", %d virtual stages per rank", s.v);
  snprintf(line, sizeof line, "schedule %s, %d micro-batch%s per step per rank%s; makespan %.6g units", plan_schedule_name(s.kind),
           s.m, s.m == 1 ? "" : "es", v, sim.makespan);
  text_at(b, 20, y + 14, "font-size=\"13\"", line);
  snprintf(line, sizeof line, "bubble %.1f%% (idle / (pp × makespan)) = %.1f%% of the ideal time (idle / busy)",
           100 * sim.bubble_fraction, 100 * sim.bubble_over_ideal);
  text_at(b, 20, y + 31, "font-size=\"13\"", line);
  y += 51;
  double x = LEFT;
  for (int k = 0; k < 4; k++) {
    int used = k < 2 || (k == 3 && s.split);
    for (int st = 0; k == 2 && st < s.n_stages; st++)
      used |= s.recompute[st] != 0;
    if (used) {
      char words[64];
      snprintf(words, sizeof words, "%c  %s%s of micro-batch n", kind_letter[k], kind_name[k],
               k == 1 && s.split ? " (input gradient)" : "");
      x = legend_item(b, x, y, kind_fill[k], words);
    }
  }
  x = legend_item(b, x, y, "url(#idle)", "idle (the bubble)");
  if (s.v > 1)
    text_at(b, x, y, "font-size=\"12\" fill=\"#444\"", "3b: micro-batch 3, chunk 1");
  y += 14;
  const double span = sim.makespan > 0 ? sim.makespan : 1.0;
  y = draw_lanes(p, &s, &sim, b, y, LEFT, PLOT_W, 0, span, "blk");
  /* Many micro-batches make the whole step's blocks thinner than their labels: the step's start
   * and its end, where the bubble is, are drawn again wider below it (class zblk). */
  const double window = fmin(span / 2, 3.0 * (s.pp * s.v + 4));
  if (PLOT_W / span < 18 && window < span / 2) {
    const double half = PLOT_W / 2 - 12;
    y += 6;
    text_at(b, LEFT, y + 12, "font-size=\"12\" font-weight=\"bold\"", "the step's start, enlarged");
    text_at(b, LEFT + half + 24, y + 12, "font-size=\"12\" font-weight=\"bold\"", "the step's end, enlarged");
    y += 20;
    draw_lanes(p, &s, &sim, b, y, LEFT, half, 0, window, "zblk");
    y = draw_lanes(p, &s, &sim, b, y, LEFT + half + 24, half, span - window, span, "zblk");
  }
  text_at(b, LEFT + PLOT_W / 2, y + 4, "font-size=\"12\" text-anchor=\"middle\"",
          "time in the simulator's units (the mean stage's forward = 1 unit, a backward 2; communication not priced)");
  sched_sim_free(&sim);
  sched_free(&s);
  return y + 22;
}

/* The memory bill of each pipeline rank as a stacked bar, against the device's memory where a
 * cluster gives it. Returns the y below what it drew. */
static double draw_memory(const struct plan *p, const struct cluster *c, struct strbuf *b, double y)
{
  char err[512], line[1024], v[32], cap[32];
  struct bill *bills = check_bills_of(p, 1, err, sizeof err);
  text_at(b, 20, y + 14, "font-size=\"14\" font-weight=\"bold\"", "Memory per pipeline rank");
  if (!bills) {
    snprintf(line, sizeof line, "(no bill: %s)", err);
    text_at(b, LEFT, y + 36, "font-size=\"13\" fill=\"#a00\"", line);
    return y + 50;
  }
  if (c)
    snprintf(line, sizeof line, "every rank of a pipeline rank's stages holds its bill: the peak of each category, as "
             "check prints it; the red line is the device memory, %s", check_format_bytes(c->device_memory, cap, sizeof cap));
  else
    snprintf(line, sizeof line, "every rank of a pipeline rank's stages holds its bill: the peak of each category, as "
             "check prints it (no --cluster: no device memory to compare with)");
  text_at(b, 20, y + 32, "font-size=\"12\" fill=\"#333\"", line);
  y += 54;
  double x = LEFT;
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++)
    if (check_bill_shows(p, k))
      x = legend_item(b, x, y, category_fill[k], alloc_category_name(check_bill_order[k]));
  y += 14;
  double most = c ? c->device_memory : 0; /* the bars take 55% of the width, their words the rest */
  for (int r = 0; r < p->mesh.pp; r++)
    most = fmax(most, check_device_total(&bills[r]));
  const double scale = most > 0 ? PLOT_W * 0.55 / most : 0;
  for (int r = 0; r < p->mesh.pp; r++) {
    const struct bill *bl = &bills[r];
    const double top = y + r * (BAR_H + BAR_GAP);
    char label[32];
    snprintf(label, sizeof label, "pp rank %d", r);
    text_at(b, LEFT - 8, top + 15, "font-size=\"12\" text-anchor=\"end\" font-weight=\"bold\"", label);
    /* the device's part of each category: what the device memory must hold (a cuda plan's batch
     * and async snapshot are billed to the host, said in words after the bar) */
    double x0 = LEFT;
    for (int k = 0; k < ALLOC_N_CATEGORIES; k++) {
      if (!check_bill_shows(p, k))
        continue;
      const enum alloc_category cat = check_bill_order[k];
      const double bytes = bl->bytes[cat] - bl->host[cat], w = bytes * scale;
      check_format_bytes(bytes, v, sizeof v);
      sb_printf(b, "<rect class=\"mem %s r%d\" x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%d\" fill=\"%s\"%s>"
                "<title>pp rank %d, %s: %s</title></rect>\n", alloc_category_name(cat), r, x0, top, w, BAR_H,
                category_fill[k], w >= 3 ? " stroke=\"#fff\" stroke-width=\"0.6\"" : "", r, alloc_category_name(cat), v);
      if (w >= 6.3 * (double)strlen(v) + 6)
        sb_printf(b, "<text x=\"%.2f\" y=\"%.1f\" font-size=\"10.5\" text-anchor=\"middle\" fill=\"#fff\">%s</text>\n",
                  x0 + w / 2, top + BAR_H / 2.0 + 4, v);
      x0 += w;
    }
    int used = snprintf(line, sizeof line, "%s%s", check_format_bytes(check_device_total(bl), v, sizeof v),
                        bl->host_total > 0 ? " on the device" : "");
    if (c) {
      const double head = 1.0 - check_device_total(bl) / c->device_memory;
      if (head >= 0)
        snprintf(line + used, sizeof line - (size_t)used, ": fits, %.0f%% headroom", 100.0 * head);
      else
        snprintf(line + used, sizeof line - (size_t)used, ": DOES NOT FIT (%s over)",
                 check_format_bytes(-head * c->device_memory, cap, sizeof cap));
    }
    const double tx = fmax(x0, c ? LEFT + c->device_memory * scale : 0) + 6;
    if (bl->host_total > 0) { /* the host's part on a second, smaller line */
      char host[512];
      int h = snprintf(host, sizeof host, "+ %s on the host:", check_format_bytes(bl->host_total, cap, sizeof cap));
      for (int k = 0; k < ALLOC_N_CATEGORIES; k++)
        if (check_bill_shows(p, k) && bl->host[check_bill_order[k]] > 0 && h < (int)sizeof host)
          h += snprintf(host + h, sizeof host - (size_t)h, "%s %s", host[h - 1] == ':' ? "" : ",",
                        alloc_category_name(check_bill_order[k]));
      text_at(b, tx, top + 10, "font-size=\"11\"", line);
      text_at(b, tx, top + 21, "font-size=\"10\" fill=\"#555\"", host);
    } else {
      text_at(b, tx, top + 15, "font-size=\"12\"", line);
    }
  }
  const double bottom = y + p->mesh.pp * (BAR_H + BAR_GAP);
  if (c) {
    const double cx = LEFT + c->device_memory * scale;
    sb_printf(b, "<line class=\"capacity\" x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"#d62728\" "
              "stroke-width=\"2\" stroke-dasharray=\"6 3\"/>\n", cx, y - 4, cx, bottom);
    snprintf(line, sizeof line, "device memory %s", check_format_bytes(c->device_memory, cap, sizeof cap));
    text_at(b, cx, bottom + 14, "font-size=\"11\" text-anchor=\"middle\" fill=\"#d62728\"", line);
  }
  free(bills);
  return bottom + 26;
}

void check_svg(const struct plan *p, const struct cluster *c, struct strbuf *b)
{
  struct strbuf body;
  sb_init(&body);
  char title[PLAN_PATH_MAX + 2048], mesh[256], err[512];
  int used = snprintf(mesh, sizeof mesh, "tp %d × pp %d × dp %d", p->mesh.tp, p->mesh.pp, p->mesh.dp);
  if (p->mesh.cp > 1) /* context parallelism: named where it is there */
    used += snprintf(mesh + used, sizeof mesh - (size_t)used, " × cp %d", p->mesh.cp);
  if (plan_ep(p) > 1)
    used += snprintf(mesh + used, sizeof mesh - (size_t)used, " (ep %d)", plan_ep(p));
  snprintf(mesh + used, sizeof mesh - (size_t)used, " = %d rank%s", p->mesh.world, p->mesh.world == 1 ? "" : "s");
  struct cost k;
  const char *name = p->name[0] ? p->name : p->file;
  char sub[1024];
  if (!c) {
    snprintf(title, sizeof title, "%s: %s; no step time without --cluster", name, mesh);
    snprintf(sub, sizeof sub, "tycho check PLAN --cluster C.lua --svg FILE prices the step and draws the device memory");
  } else if (cost_predict(p, c, &k, err, sizeof err)) {
    snprintf(title, sizeof title, "%s: %s; no step time", name, mesh);
    snprintf(sub, sizeof sub, "on %s: %s", c->name, err);
  } else {
    snprintf(title, sizeof title, "%s: %s; %.*f s per step", name, mesh, c->peak_flops >= 1e12 ? 3 : 4, k.step);
    snprintf(sub, sizeof sub, "on %s: %.0f tokens/s, MFU %.1f%%, of which pipeline bubble %.3f s", c->name,
             k.tokens_per_s, 100.0 * k.mfu, k.bubble);
  }
  text_at(&body, 20, 30, "font-size=\"18\" font-weight=\"bold\"", title);
  text_at(&body, 20, 50, "font-size=\"12\" fill=\"#333\"", sub);
  double y = draw_schedule(p, &body, 58);
  y = draw_memory(p, c, &body, y + 6);
  text_at(&body, 20, y + 4, "font-size=\"10\" fill=\"#777\"", "drawn by tycho check --svg");
  const double height = y + 16;
  sb_printf(b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" viewBox=\"0 0 %d %.0f\" "
            "font-family=\"DejaVu Sans, Verdana, Arial, sans-serif\">\n", WIDTH, height, WIDTH, height);
  sb_puts(b, "<title>");
  put_xml(b, title);
  sb_printf(b, "</title>\n<defs><pattern id=\"idle\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
          "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#eeeeee\"/>"
          "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#c8c8c8\" stroke-width=\"2\"/></pattern></defs>\n"
          "<style>.F{fill:%s}.B{fill:%s}.R{fill:%s}.W{fill:%s}</style>\n<rect width=\"100%%\" height=\"100%%\" "
          "fill=\"#fff\"/>\n", kind_fill[0], kind_fill[1], kind_fill[2], kind_fill[3]);
  sb_put(b, body.s ? body.s : "", body.n);
  sb_puts(b, "</svg>\n");
  b->failed |= body.failed;
  sb_free(&body);
}

int check_svg_write(const struct plan *p, const struct cluster *c, const char *path, char *err, size_t n)
{
  struct stat st;
  if (!path[0]) {
    snprintf(err, n, "--svg needs a file, e.g. --svg step.svg");
    return 2;
  }
  if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
    snprintf(err, n, "--svg %s: is a symbolic link; give the file itself", path);
    return 2;
  }
  const int rc = path_check_output("--svg", path, err, n);
  if (rc)
    return rc == 2 ? 2 : -1;
  char dir[4096];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) {
    slash[slash == dir ? 1 : 0] = 0;
    const int missing = stat(dir, &st) != 0;
    if (missing || !S_ISDIR(st.st_mode)) {
      snprintf(err, n, "--svg %s: %s %s", path, dir, missing ? "does not exist" : "is not a folder");
      return 2;
    }
  }
  struct strbuf b;
  sb_init(&b);
  check_svg(p, c, &b);
  if (b.failed) {
    sb_free(&b);
    snprintf(err, n, "--svg %s: out of memory drawing the picture", path);
    return -1;
  }
  const int bad = file_write_atomic("--svg", path, b.s, b.n, err, n);
  sb_free(&b);
  return bad ? -1 : 0;
}
