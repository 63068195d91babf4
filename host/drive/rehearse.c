/* tycho rehearse: a plan's layout at toy scale on CPU ranks against the serial run (rehearse.h). */
#define _POSIX_C_SOURCE 200809L
#include "drive/rehearse.h"

#include "util/launch.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "mesh/mesh.h"
#include "bf16.h"
#include "plan/compile.h"
#include "runtime/model/alloc.h"
#include "layout/bill.h"
#include "runtime/train/packed.h"
#include "runtime/train/train.h"
#include "util/err.h"

enum { DEFAULT_STEPS = 3, DEFAULT_HEAD_DIM = 4, DEFAULT_SEQ = 32, CORPUS_VOCAB = 64 };

/* The bounds against the serial run: those tests/mpi/mpi_dp_equiv.c argues for fp32 and float64;
 * for bf16 compute its weight and norm bounds (bf16_bounds there: a layout's fp32 rounding
 * differences flip bf16 roundings of weights and operands, 2^-8 relative each) and a loss bound
 * ten times its: the flips of the linears' inputs compound over the depth, which the rehearsed
 * plans keep (measured 4.4e-5 for the 7B plan's 32 layers at tp 2, 1.4e-4 for the 70B plan's 80
 * at tp 8 × pp 4, where the 4-layer test plans give a few 1e-6), while the final weights stay
 * within 3e-5 of the serial run's — a layout bug moves those by far more than 1e-3. With bf16
 * gradients the weights' bound is mpi_dp_equiv's for them, 5e-3 (each step's gradients one bf16
 * rounding apart between layouts, which AdamW passes to every element's update). At tp > 1 the
 * bf16 wire (runtime/parallel/tp.c) rounds each activation and activation gradient summed over
 * the tp group at each of its tp − 1 combinations (2^-9 relative each), four sums a layer each
 * way, and at pp > 1 exec.c's rounds each stage boundary, where the serial run keeps fp32: like
 * the inputs' flips these compound over the depth, in the backward's gradients as in the
 * forward's loss, so the norm's bound there is three times mpi_dp_equiv's, 3e-2 (measured
 * 1.39e-2 on the 70B plan's 80 layers at tp 8 × pp 4 over 3 steps, with both wires, 3.3e-4 in
 * the loss and 4.9e-5 in the final weights); a micro-batch dropped or counted twice moves the
 * norm by 1/M, above 10% for the rehearsals' 8. */
struct bounds { double loss, norm, param; };
static struct bounds bounds_of(const struct plan *p)
{
#if REAL_IS_DOUBLE
  (void)p;
  return (struct bounds){ 1e-10, 1e-10, 1e-10 };
#else
  if (p->precision.compute == PLAN_BF16)
    return (struct bounds){ 1e-3, p->mesh.tp > 1 || p->mesh.pp > 1 ? 3e-2 : 1e-2,
                            p->precision.grads == PLAN_BF16 ? 5e-3 : 1e-3 };
  return (struct bounds){ 1e-5, 1e-3, 1e-5 };
#endif
}

static int round_up(long long x, int m) { return (int)((x + m - 1) / m * m); }
static int min_int(int a, int b) { return a < b ? a : b; }

/* ---- the shrunk plan ------------------------------------------------------------------ */

static int add_set(struct rehearse_shrink *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int add_set(struct rehearse_shrink *s, const char *fmt, ...)
{
  if (s->n_sets >= (int)(sizeof s->sets / sizeof s->sets[0]))
    return -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->sets[s->n_sets++], sizeof s->sets[0], fmt, ap);
  va_end(ap);
  return 0;
}

/* "stages={{"embed",0,1},{2,3,"head"}}": every stage's layers as the full-size plan has them. */
static char *stages_list(const struct plan *p)
{
  size_t cap = 64 + (size_t)p->n_stages * 16 + (size_t)p->model.n_layers * 8, n = 0;
  char *s = malloc(cap);
  if (!s)
    return NULL;
  n += (size_t)snprintf(s + n, cap - n, "stages={");
  for (int st = 0; st < p->n_stages; st++) {
    const struct plan_stage *g = &p->stages[st];
    int first = 1;
    n += (size_t)snprintf(s + n, cap - n, "%s{", st ? "," : "");
    if (g->has_embed) {
      n += (size_t)snprintf(s + n, cap - n, "\"embed\"");
      first = 0;
    }
    for (int l = 0; l < p->model.n_layers; l++)
      if (p->layers[l].stage == st) {
        n += (size_t)snprintf(s + n, cap - n, "%s%d", first ? "" : ",", l);
        first = 0;
      }
    if (g->has_head)
      n += (size_t)snprintf(s + n, cap - n, "%s\"head\"", first ? "" : ",");
    n += (size_t)snprintf(s + n, cap - n, "}");
  }
  snprintf(s + n, cap - n, "}");
  return s;
}

int rehearse_shrink(const struct plan *big, const struct rehearse_options *o, struct rehearse_shrink *out,
                    char *err, size_t err_size)
{
  memset(out, 0, sizeof *out);
  const struct plan_model *m = &big->model;
  const int tp = big->mesh.tp, pp = big->mesh.pp, v = big->virtual_stages;
  const int hd = o->head_dim > 0 ? o->head_dim : DEFAULT_HEAD_DIM;
  if (hd % 2)
    return errf(err, err_size, "--head-dim %d: RoPE rotates pairs of elements; give an even head size", hd);
  /* heads kept, each head shrunk: dim = n_heads × head_dim */
  int dim = m->dim, head = m->head_dim;
  if ((long long)m->n_heads * hd < m->dim) {
    dim = m->n_heads * hd;
    head = hd;
  }
  /* ffn in the plan's ratio to dim, a multiple of tp (the column and row splits divide it) */
  int ffn = m->ffn_dim;
  if (dim < m->dim) {
    long long f = ((long long)m->ffn_dim * dim + m->dim - 1) / m->dim;
    ffn = min_int(m->ffn_dim, round_up(f > 0 ? f : 1, tp));
  }
  /* a sparse layer's experts in the same ratio (mesh.tp is 1 with model.moe) */
  int moe_ffn = m->moe.ffn_dim;
  if (m->moe.experts > 0 && dim < m->dim) {
    long long f = ((long long)m->moe.ffn_dim * dim + m->dim - 1) / m->dim;
    moe_ffn = min_int(m->moe.ffn_dim, f > 0 ? (int)f : 1);
  }
  /* the corpus's byte tokens; the plan's divisibility by tp (or its want of it) kept */
  int vocab = m->vocab;
  if (m->vocab > CORPUS_VOCAB) {
    vocab = CORPUS_VOCAB;
    if (m->vocab % tp == 0)
      vocab = round_up(CORPUS_VOCAB, tp);
    else if (vocab % tp == 0)
      vocab++;
  } else if (m->vocab < CORPUS_VOCAB && !big->data.synthetic[0]) {
    return errf(err, err_size, "model.vocab = %d: the rehearsal trains on the addition corpus's %d byte "
                "tokens; rehearse a plan whose vocabulary has at least %d", m->vocab, CORPUS_VOCAB, CORPUS_VOCAB);
  }
  /* the sequence: a multiple of tp when the plan's is (sequence parallelism splits it); under
   * context parallelism at least its 2 · cp chunks, and a multiple of 2 · cp (times tp with
   * sequence parallelism: plan_validate's rule) when the plan's is */
  int seq = big->batch.seq, want = o->seq > 0 ? o->seq : DEFAULT_SEQ;
  const int cp = big->mesh.cp > 1 ? big->mesh.cp : 1;
  if (want < seq) {
    seq = want;
    if (big->batch.seq % tp == 0)
      seq = round_up(seq, tp);
    if (cp > 1) {
      const int unit = 2 * cp * (big->sequence_parallel && tp > 1 ? tp : 1);
      seq = big->batch.seq % unit == 0 ? round_up(seq, unit) : seq > 2 * cp ? seq : 2 * cp;
    }
    seq = min_int(seq, big->batch.seq);
  }
  /* micro-batches per step per rank: every phase of the schedule */
  const int M = big->batch.microbatches;
  int cap = o->micro_batches > 0 ? o->micro_batches : (2 * pp * v > 4 ? 2 * pp * v : 4);
  int mb = M < cap ? M : cap;
  if (big->schedule == PLAN_SCHED_INTERLEAVED && mb % pp)
    mb = round_up(mb, pp);
  if (mb > M)
    mb = M;
  out->micro_batches = mb;
  const long long global = (long long)mb * big->batch.micro * big->mesh.dp;
  /* a bf16 plan rehearses in bf16 (its products widened where the CPU has no bf16 ones), with its
   * gradients in its precision.grads, except in the float64 build, which has no bf16 */
  const int lowp = !REAL_IS_DOUBLE && big->precision.compute == PLAN_BF16;
  const int grads_bf16 = lowp && big->precision.grads == PLAN_BF16;

  int bad = add_set(out, "model.dim=%d", dim) || add_set(out, "model.ffn_dim=%d", ffn) ||
            (m->moe.experts > 0 && add_set(out, "model.moe.ffn_dim=%d", moe_ffn)) ||
            add_set(out, "model.vocab=%d", vocab) || add_set(out, "model.max_seq=%d", seq) ||
            add_set(out, "batch.seq=%d", seq) || add_set(out, "batch.global=%lld", global) ||
            add_set(out, "precision.compute=%s", lowp ? "bf16" : "fp32") || add_set(out, "precision.grads=%s", grads_bf16 ? "bf16" : "fp32") ||
            add_set(out, "precision.master=fp32") || add_set(out, "device=cpu") ||
            add_set(out, "data=nil") || add_set(out, "data.synthetic=addition") || add_set(out, "init=nil") ||
            add_set(out, "export=nil") || add_set(out, "checkpoint=nil") || add_set(out, "log=nil") ||
            add_set(out, "lr_schedule.warmup=0") || add_set(out, "train.steps=%d", o->steps > 0 ? o->steps : DEFAULT_STEPS) ||
            add_set(out, "train.eval_every=%d", o->steps > 0 ? o->steps : DEFAULT_STEPS);
  if (bad)
    return errf(err, err_size, "too many overrides");
  out->stages_set = stages_list(big);
  if (!out->stages_set)
    return errf(err, err_size, "out of memory");
  /* the sparse layers: experts, top_k and which layers kept, each expert's width shrunk */
  char experts[160] = "";
  if (m->moe.experts > 0)
    snprintf(experts, sizeof experts, ", %d experts top %d (kept) of ffn %d (%d)", m->moe.experts,
             m->moe.top_k, moe_ffn, m->moe.ffn_dim);
  snprintf(out->summary, sizeof out->summary,
           "%d layers (kept), dim %d (%d), %d heads / %d kv (kept) of %d (%d), ffn %d (%d)%s, vocab %d (%d), seq %d "
           "(%d); %d micro-batch%s of %d per step per rank (%d)", m->n_layers, dim, m->dim, m->n_heads,
           m->n_kv_heads, head, m->head_dim, ffn, m->ffn_dim, experts, vocab, m->vocab, seq, big->batch.seq, mb,
           mb == 1 ? "" : "es", big->batch.micro, M);
  return 0;
}

void rehearse_shrink_free(struct rehearse_shrink *s)
{
  free(s->stages_set);
  s->stages_set = NULL;
}

/* ---- the launcher ---------------------------------------------------------------------- */

static int compile(const struct rehearse_options *o, int world, const char *const *extra, int n_extra,
                   struct plan *p, char *err, size_t err_size)
{
  const char *sets[2 * REHEARSE_MAX_SETS + 32];
  int n = 0;
  for (int i = 0; i < o->n_sets && n < REHEARSE_MAX_SETS; i++) sets[n++] = o->sets[i];
  for (int i = 0; i < n_extra && n < (int)(sizeof sets / sizeof sets[0]); i++) sets[n++] = extra[i];
  struct plan_compile_options opt = { world, o->unsafe, o->memory_limit, o->instruction_limit, n, sets };
  return plan_compile(o->plan_path, &opt, p, err, err_size);
}

int rehearse_launch(const struct rehearse_options *o, const char *self, char *err, size_t err_size)
{
  struct plan big;
  char why[2048];
  if (compile(o, o->world, NULL, 0, &big, why, sizeof why)) {
    errf(err, err_size, "plan error: %s", why);
    return 2;
  }
  const int world = big.mesh.world, assumed = big.mesh.world_assumed;
  plan_free(&big);
  if (assumed) {
    errf(err, err_size, "%s: mesh.dp is \"auto\": give the ranks to rehearse with --world N", o->plan_path);
    return 2;
  }
  /* tycho rehearse --worker and our arguments */
  const char *args[2 * REHEARSE_MAX_SETS + 64];
  char num[8][32];
  int n = 0;
  args[n++] = "rehearse";
  args[n++] = "--worker";
  args[n++] = o->plan_path;
  const struct { const char *flag; long long value; } nums[] = {
    { "--world", world }, { "--steps", o->steps }, { "--head-dim", o->head_dim }, { "--seq", o->seq },
    { "--micro-batches", o->micro_batches }, { "--max-instructions", o->instruction_limit },
    { "--max-memory", (long long)(o->memory_limit >> 20) },
  };
  for (int i = 0; i < (int)(sizeof nums / sizeof nums[0]); i++)
    if (nums[i].value > 0) {
      snprintf(num[i], sizeof num[i], "%lld", nums[i].value);
      args[n++] = nums[i].flag;
      args[n++] = num[i];
    }
  if (o->unsafe)
    args[n++] = "--unsafe";
  for (int i = 0; i < o->n_sets && i < REHEARSE_MAX_SETS; i++) {
    args[n++] = "--set";
    args[n++] = o->sets[i];
  }
  for (int i = 0; i < o->n_faults && i < REHEARSE_MAX_FAULTS; i++) {
    args[n++] = "--fault";
    args[n++] = o->faults[i];
  }
  double s;
  int code = launch_self(o->launcher ? o->launcher : launch_default(), world, self, args, n, &s, err, err_size);
  if (code < 0)
    return 1;
  if (code == 2 && !err[0])
    errf(err, err_size, "the rehearsal refused the plan (above)");
  else if (code && !err[0])
    errf(err, err_size, "the rehearsal failed after %.1f s (above)", s);
  else if (!code)
    printf("rehearsed  in %.1f s (%d ranks, launcher included)\n", s, world);
  return code;
}

/* ---- the worker ------------------------------------------------------------------------ */

/* What each rank found, gathered to rank 0. */
struct rank_report {
  int pp_rank;
  int failed;             /* the run stopped: msg says why */
  int traffic_bad, bill_bad;
  int steps;
  double loss[REHEARSE_MAX_STEPS], norm[REHEARSE_MAX_STEPS];
  unsigned long long calls; /* collectives and messages of the last step, every group */
  double bill_worst;        /* the worst category's difference in bytes */
  char msg[900];
};

static struct comm_group *traffic_group(struct comm_group *const *groups, const struct trainer *t, int g)
{
  switch (g) {
  case TRAFFIC_TP: return groups[PLAN_AXIS_TP];
  case TRAFFIC_DP: return t->dpcp ? t->dpcp : groups[PLAN_AXIS_DP]; /* under mesh.cp the dp layer's dp × cp */
  case TRAFFIC_PP: return groups[PLAN_AXIS_PP];
  case TRAFFIC_EP: return t->ep;
  case TRAFFIC_EDP: return t->edp;
  case TRAFFIC_CP: return groups[PLAN_AXIS_CP];
  default: return t->exec.embed;
  }
}

void rehearse_counters(struct comm_group *const *groups, const struct trainer *t,
                       struct comm_counter out[TRAFFIC_N_GROUPS][COMM_N_OPS])
{
  memset(out, 0, sizeof(struct comm_counter) * TRAFFIC_N_GROUPS * COMM_N_OPS);
  for (int g = 0; g < TRAFFIC_N_GROUPS; g++)
    for (int op = 0; op < COMM_N_OPS; op++)
      if (traffic_group(groups, t, g))
        out[g][op] = comm_counter_get(traffic_group(groups, t, g), (enum comm_op)op);
}

int rehearse_traffic_check(const struct plan *p, struct comm_group *const *groups, const struct trainer *t,
                           const struct comm_counter before[TRAFFIC_N_GROUPS][COMM_N_OPS],
                           unsigned long long *calls, char *msg, size_t msg_size)
{
  struct traffic want;
  char why[512];
  *calls = 0;
  if (traffic_predict_cp(p, NULL, t->exec.rank, t->model.cp.rank, &want, why, sizeof why))
    return snprintf(msg, msg_size, "no traffic prediction: %s", why), -1;
  int bad = 0;
  for (int g = 0; g < TRAFFIC_N_GROUPS; g++) {
    struct comm_group *grp = traffic_group(groups, t, g);
    for (int op = 0; op < COMM_N_OPS; op++) {
      unsigned long long dc = 0, db = 0;
      if (grp) {
        struct comm_counter c = comm_counter_get(grp, (enum comm_op)op);
        dc = c.calls - before[g][op].calls;
        db = c.n_bytes - before[g][op].n_bytes;
      }
      *calls += dc;
      /* a dropless ep group's bytes are exact summed over the group only (bill.h) */
      const int bytes_differ = db != want.bytes[g][op] && !want.summed_only[g];
      if ((dc != want.calls[g][op] || bytes_differ) && !bad) {
        bad = 1;
        snprintf(msg, msg_size, "%s %s: %llu calls, %llu bytes in the last step; tycho check predicts %llu "
                 "calls, %llu bytes", traffic_group_name((enum traffic_group)g), comm_op_name((enum comm_op)op),
                 dc, db, want.calls[g][op], want.bytes[g][op]);
      }
    }
  }
  return bad;
}

int rehearse_bill_check(const struct plan *p, const struct trainer *t, double *worst_bytes, char *msg,
                        size_t msg_size)
{
  struct bill b;
  char why[512];
  *worst_bytes = 0;
  if (bill_predict(p, t->exec.rank, &b, why, sizeof why))
    return snprintf(msg, msg_size, "no memory bill: %s", why), -1;
  const struct alloc_bill *a = alloc_bill();
  int bad = 0;
  for (int c = 0; c < ALLOC_N_CATEGORIES; c++) {
    const double measured = (double)a->peak_bytes[c], predicted = b.bytes[c], diff = fabs(measured - predicted);
    *worst_bytes = diff > *worst_bytes ? diff : *worst_bytes;
    if (diff != 0 && !bad) {
      bad = 1;
      snprintf(msg, msg_size, "%s: peak %.0f B, tycho check's bill %.0f B", alloc_category_name((enum alloc_category)c),
               measured, predicted);
    }
  }
  return bad;
}

static double rel_diff(double a, double b) { return b != 0 ? fabs(a - b) / fabs(b) : fabs(a - b); }

void rehearse_compare(const real *a, const real *b, size_t n, double *l2_rel, double *max_rel)
{
  double num = 0, den = 0, max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - (double)b[i]);
    num += d * d;
    den += (double)b[i] * (double)b[i];
    max_diff = d > max_diff ? d : max_diff;
    max_abs = fabs((double)b[i]) > max_abs ? fabs((double)b[i]) : max_abs;
  }
  *l2_rel = den > 0 ? sqrt(num / den) : sqrt(num);
  *max_rel = max_abs > 0 ? max_diff / max_abs : max_diff;
}

/* The serial run of the rehearsed plan on this rank alone. 0 ok; −1 with err. */
static int serial_run(const struct rehearse_options *o, const struct rehearse_shrink *s, int steps,
                      double *loss, double *norm, real **initial, real **final, size_t *n, char *err, size_t err_size)
{
  static const char *const serial[] = { "zero=0", "mesh.tp=1", "mesh.pp=1", "mesh.dp=1", "virtual_stages=1",
                                        "stages=even", "schedule.kind=1f1b", "sequence_parallel=false",
                                        "zero_every=nil", "mesh.ep=1", "mesh.cp=1" };
  const char *extra[40];
  int k = 0;
  for (int i = 0; i < s->n_sets; i++) extra[k++] = s->sets[i];
  for (int i = 0; i < (int)(sizeof serial / sizeof serial[0]); i++) extra[k++] = serial[i];
  struct plan p;
  char why[2048];
  if (compile(o, 1, extra, k, &p, why, sizeof why))
    return errf(err, err_size, "the serial plan: %s", why);
  struct trainer t;
  if (trainer_open(&t, &p, NULL, why, sizeof why) != TRAIN_OK) {
    plan_free(&p);
    return errf(err, err_size, "the serial run: %s", why);
  }
  int rc = 0;
  *initial = model_packed(&t.model, n);
  for (int i = 0; i < steps && rc == 0; i++) {
    struct train_step_stats st;
    if (trainer_step(&t, &st, why, sizeof why))
      rc = errf(err, err_size, "the serial run, step %d: %s", i, why);
    loss[i] = st.loss;
    norm[i] = st.grad_norm;
  }
  *final = model_packed(&t.model, n);
  trainer_close(&t);
  plan_free(&p);
  if (rc == 0 && (!*initial || !*final))
    rc = errf(err, err_size, "out of memory packing the serial run's parameters");
  return rc;
}

static const char *on_off(int x) { return x ? "on" : "off"; }

/* 6.74B, 43.1M, 52.3k */
static const char *count_text(double n, char *buf, size_t size)
{
  if (n >= 1e9)
    snprintf(buf, size, "%.3gB", n / 1e9);
  else if (n >= 1e6)
    snprintf(buf, size, "%.3gM", n / 1e6);
  else
    snprintf(buf, size, "%.3gk", n / 1e3);
  return buf;
}

static void print_header(FILE *out, const struct plan *big, const struct plan *p, const struct rehearse_shrink *s,
                         int steps)
{
  int rc_layers = 0;
  for (int l = 0; l < p->model.n_layers; l++) rc_layers += p->layers[l].recompute != 0;
  fprintf(out, "rehearse   %s (%s): its layout on %d CPU ranks, %d step%s\n", big->name, big->file,
          p->mesh.world, steps, steps == 1 ? "" : "s");
  char order[64];
  char cp[32] = ""; /* context parallelism: the axis named where it is there */
  if (p->mesh.cp > 1)
    snprintf(cp, sizeof cp, " × cp %d", p->mesh.cp);
  fprintf(out, "layout     tp %d%s × pp %d × dp %d (order %s); %d stage%s (virtual %d) under %s; zero %d; "
          "sequence parallel %s; recompute in %d of %d layers\n", p->mesh.tp, cp, p->mesh.pp, p->mesh.dp,
          plan_mesh_order_text(&p->mesh, order, sizeof order),
          p->n_stages, p->n_stages == 1 ? "" : "s", p->virtual_stages, plan_schedule_name(p->schedule), p->zero,
          on_off(p->sequence_parallel), rc_layers, p->model.n_layers);
  char small[32], full[32];
  fprintf(out, "shrunk     %s; %s parameters (%s); the plan's figures in brackets\n", s->summary,
          count_text((double)plan_param_count(p), small, sizeof small),
          count_text((double)plan_param_count(big), full, sizeof full));
  if (p->precision.compute == PLAN_BF16) {
    char lin[200];
    fprintf(out, "           bf16 compute on the CPU runtime (the linears' products: %s)%s, gradients in %s, "
            "master in fp32, the addition corpus, no learning-rate warm-up\n", bf16_linear_path(lin, sizeof lin),
            plan_on_cpu(big) ? "" : " (the plan's precision and layout are rehearsed, not its device)",
            plan_dtype_name(p->precision.grads));
  } else {
    fprintf(out, "           %s on the CPU runtime%s, the addition corpus, no learning-rate warm-up\n", REAL_NAME,
            big->precision.compute != PLAN_FP32 ? " (the plan's layout is rehearsed, not its precision or device: "
            "this build has no bf16)" : !plan_on_cpu(big) ? " (the plan's layout is rehearsed, not its device)" : "");
  }
  fflush(out);
}

int rehearse_worker(const struct rehearse_options *o, FILE *out, char *err, size_t err_size)
{
  struct comm_group *world = comm_world();
  const int rank = world->rank, W = world->size;
  const int steps = o->steps > 0 ? o->steps : DEFAULT_STEPS;
  char why[COMM_AGREE_MSG_MAX] = "";
  struct plan big, p, run;
  struct rehearse_shrink s;
  int have_big = 0, have_p = 0, have_run = 0, code = 0, opened = 0;
  static struct rank_report me;
  real *initial = NULL, *final = NULL;
  size_t n_par = 0;
  struct comm_group *groups[PLAN_N_AXES] = { 0 };
  struct comm_group *ctl = NULL;
  char **reports = NULL;
  size_t *counts = NULL;
  struct trainer t;
  memset(&s, 0, sizeof s);
  memset(&me, 0, sizeof me);
  if (o->world && o->world != W) {
    code = 2;
    snprintf(why, sizeof why, "--world %d, but the job has %d ranks", o->world, W);
  }
  if (!code && compile(o, W, NULL, 0, &big, why, sizeof why) == 0)
    have_big = 1;
  else if (!code)
    code = 2;
  if (!code && rehearse_shrink(&big, o, &s, why, sizeof why))
    code = 2;
  const char *extra[2 * REHEARSE_MAX_SETS + 32];
  int k = 0;
  if (!code) {
    for (int i = 0; i < s.n_sets; i++) extra[k++] = s.sets[i];
    extra[k++] = s.stages_set;
    if (compile(o, W, extra, k, &p, why, sizeof why) == 0)
      have_p = 1;
    else
      code = 2;
  }
  if (!code) {
    int kr = k;
    for (int i = 0; i < o->n_faults && kr < (int)(sizeof extra / sizeof extra[0]); i++) extra[kr++] = o->faults[i];
    if (compile(o, W, extra, kr, &run, why, sizeof why) == 0)
      have_run = 1;
    else
      code = 2;
    if (!code && (run.mesh.tp != p.mesh.tp || run.mesh.pp != p.mesh.pp || run.mesh.dp != p.mesh.dp ||
                  run.mesh.cp != p.mesh.cp))
      code = 2, snprintf(why, sizeof why, "a --fault may not change the mesh (the ranks run the plan's groups)");
  }
  if (!code && steps > REHEARSE_MAX_STEPS)
    code = 2, snprintf(why, sizeof why, "--steps %d: at most %d", steps, REHEARSE_MAX_STEPS);
  if (comm_agree_err(world, code, why, sizeof why, COMM_AGREE_PLAIN)) {
    errf(err, err_size, "plan error: %s", why);
    code = 2;
    goto out;
  }
  if (rank == 0)
    print_header(out, &big, &p, &s, steps);

  /* the layout's run */
  code = comm_build_mesh_groups(&run.mesh, groups, why, sizeof why) ? 1 : 0;
  if (!code) {
    alloc_reset_peaks();
    code = trainer_open(&t, &run, groups, why, sizeof why);
    opened = code == TRAIN_OK;
  }
  if (comm_agree_err(world, code, why, sizeof why, COMM_AGREE_NAME_RANK)) {
    errf(err, err_size, "%s", why);
    code = code == TRAIN_PLAN_ERROR ? 2 : 1;
    goto close;
  }
  me.pp_rank = t.exec.rank;
  if (trainer_gather_packed(&t, &initial, &n_par, why, sizeof why))
    me.failed = 1, snprintf(me.msg, sizeof me.msg, "gathering the initial parameters: %s", why);
  alloc_reset_peaks(); /* the gathered copy is the rehearsal's, not the run's */
  struct comm_counter before[TRAFFIC_N_GROUPS][COMM_N_OPS];
  memset(before, 0, sizeof before);
  for (int i = 0; i < steps && !me.failed; i++) {
    if (i == steps - 1)
      rehearse_counters(groups, &t, before);
    struct train_step_stats st;
    int bad = trainer_step(&t, &st, why, sizeof why);
    if (comm_agree_err(world, bad ? -1 : 0, why, sizeof why, COMM_AGREE_NAME_RANK)) {
      me.failed = 1;
      snprintf(me.msg, sizeof me.msg, "step %d: %s", i, why);
      break;
    }
    me.loss[i] = st.loss;
    me.norm[i] = st.grad_norm;
    me.steps = i + 1;
  }
  if (!me.failed) {
    char msg[sizeof me.msg];
    me.bill_bad = rehearse_bill_check(&p, &t, &me.bill_worst, me.msg, sizeof me.msg) != 0;
    me.traffic_bad = rehearse_traffic_check(&p, groups, &t, before, &me.calls, msg, sizeof msg) != 0;
    if (me.traffic_bad && !me.bill_bad)
      snprintf(me.msg, sizeof me.msg, "%s", msg);
    if (trainer_gather_packed(&t, &final, &n_par, why, sizeof why))
      me.failed = 1, snprintf(me.msg, sizeof me.msg, "gathering the final parameters: %s", why);
  }
close:
  if (opened)
    trainer_close(&t);
  if (comm_free_mesh_groups(groups, why, sizeof why) && code == 0)
    code = 1, errf(err, err_size, "%s", why);
  if (code)
    goto out;

  /* every rank's report to rank 0, on a control group (its waits outlast the serial run) */
  if (comm_group_split(world, 0, rank, "rehearse", &ctl, why, sizeof why)) {
    code = 1;
    errf(err, err_size, "%s", why);
    goto out;
  }
  reports = rank == 0 ? calloc((size_t)W, sizeof *reports) : NULL;
  counts = rank == 0 ? calloc((size_t)W, sizeof *counts) : NULL;
  int verdict = 0;
  if (comm_control_gather(ctl, &me, sizeof me, 0, reports, counts, "the rehearsal's reports", why, sizeof why)) {
    verdict = 1;
    errf(err, err_size, "%s", why);
  } else if (rank == 0) {
    int failed = 0, traffic_bad = 0, bill_bad = 0, differ = 0, first_bad = -1;
    double bill_worst = 0;
    for (int r = 0; r < W; r++) {
      const struct rank_report *x = (const struct rank_report *)reports[r];
      if (!x || counts[r] != sizeof me) {
        failed++;
        continue;
      }
      int bad = x->failed || x->traffic_bad || x->bill_bad;
      failed += x->failed;
      traffic_bad += x->traffic_bad;
      bill_bad += x->bill_bad;
      bill_worst = x->bill_worst > bill_worst ? x->bill_worst : bill_worst;
      if (bad && first_bad < 0) {
        first_bad = r;
        fprintf(out, "rank %d (pipeline rank %d): %s\n", r, x->pp_rank, x->msg);
      }
      differ += memcmp(x->loss, me.loss, sizeof me.loss) != 0 || memcmp(x->norm, me.norm, sizeof me.norm) != 0;
    }
    if (failed) {
      fprintf(out, "run        FAILED on %d rank%s\n", failed, failed == 1 ? "" : "s");
      verdict = 1;
    } else {
      double sl[REHEARSE_MAX_STEPS], sn[REHEARSE_MAX_STEPS];
      real *s_init = NULL, *s_final = NULL;
      size_t n_s = 0;
      if (serial_run(o, &s, steps, sl, sn, &s_init, &s_final, &n_s, why, sizeof why)) {
        fprintf(out, "serial     FAILED: %s\n", why);
        verdict = 1;
      } else if (n_s != n_par) {
        fprintf(out, "serial     FAILED: %zu parameters in the serial run, %zu gathered from the ranks\n", n_s, n_par);
        verdict = 1;
      } else {
        double wl = 0, wn = 0, l2, mx;
        for (int i = 0; i < steps; i++) {
          double a = rel_diff(me.loss[i], sl[i]), b = rel_diff(me.norm[i], sn[i]);
          wl = a > wl ? a : wl;
          wn = b > wn ? b : wn;
        }
        rehearse_compare(final, s_final, n_s, &l2, &mx);
        const int init_same = memcmp(initial, s_init, n_s * sizeof(real)) == 0;
        const struct bounds bd = bounds_of(&p);
        const int ok = init_same && wl <= bd.loss && wn <= bd.norm && l2 <= bd.param &&
                       (!REAL_IS_DOUBLE || mx <= bd.param) && !differ;
        fprintf(out, "steps     ");
        for (int i = 0; i < steps; i++) fprintf(out, " loss %.6f (serial %.6f)%s", me.loss[i], sl[i], i + 1 < steps ? ";" : "");
        fprintf(out, "\nserial     initial parameters %s; worst relative difference: loss %.3g, grad norm %.3g, "
                "final weights %.3g (relative L2; max %.3g); bounds %g, %g, %g%s: %s\n",
                init_same ? "bitwise equal" : "DIFFER", wl, wn, l2, mx, bd.loss, bd.norm, bd.param,
                differ ? "; the ranks' losses differ" : "", ok ? "ok" : "FAILED");
        verdict |= !ok;
      }
      free(s_init);
      free(s_final);
      fprintf(out, "traffic    the last step's collectives and messages on every group %s tycho check's "
              "prediction on %s (%llu on rank 0): %s\n", traffic_bad ? "differ from" : "equal",
              traffic_bad ? "some ranks" : "every rank", me.calls, traffic_bad ? "FAILED" : "ok");
      fprintf(out, "memory     every category's peak %s tycho check's bill on %s (to the byte; worst %.0f B "
              "off): %s\n", bill_bad ? "differs from" : "equals", bill_bad ? "some ranks" : "every rank", bill_worst,
              bill_bad ? "FAILED" : "ok");
      verdict |= traffic_bad || bill_bad;
    }
    fprintf(out, "verdict    %s\n", verdict ? "the rehearsal FAILED" : "the layout holds");
    fflush(out);
  }
  if (reports)
    for (int r = 0; r < W; r++) free(reports[r]);
  free(reports);
  free(counts);
  if (comm_control_bcast(ctl, &verdict, sizeof verdict, 0, "the rehearsal's verdict", why, sizeof why))
    verdict = 1;
  comm_group_free(ctl, why, sizeof why);
  code = verdict; /* rank 0 has said what failed; err stays empty unless the exchange failed */
out:
  free(initial);
  free(final);
  rehearse_shrink_free(&s);
  if (have_run)
    plan_free(&run);
  if (have_p)
    plan_free(&p);
  if (have_big)
    plan_free(&big);
  return code;
}
