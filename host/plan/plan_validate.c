/* Whole-plan validation: what no single field can check alone (docs/design.md, "Plans are compiled
 * once"). Every message names where the offending field was written, the field, its value, and what
 * would be valid. A valid plan is never changed silently: what is derived here (dp from "auto", the
 * padded vocab, micro-batches per step, stage ranges, derived seeds) is shown by `tycho check`. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fields.h"
#include "plan.h"

static int fail(char *err, size_t n, const struct plan *p, const char *path, const char *fmt, ...)
{
  int used = snprintf(err, n, "%s: ", plan_where(p, path));
  if (used < 0 || (size_t)used >= n)
    return -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err + used, n - (size_t)used, fmt, ap);
  va_end(ap);
  return -1;
}

/* "1, 2, 4" : the numbers that divide both a and b, for hints. */
static const char *common_divisors(int a, int b, char *buf, size_t n)
{
  size_t used = 0;
  buf[0] = 0;
  for (int d = 1; d <= a && d <= b; d++) {
    if (a % d || b % d)
      continue;
    int w = snprintf(buf + used, n - used, "%s%d", used ? ", " : "", d);
    if (w < 0 || (size_t)w >= n - used)
      break;
    used += (size_t)w;
  }
  return buf;
}

/* "1, 2, 4, 8" : the divisors of x, for hints. */
static const char *divisors(int x, char *buf, size_t n)
{
  return common_divisors(x, x, buf, n);
}

/* Every real-valued field is finite: inf, -inf and nan are refused, whatever the field's
 * range (a range such as "> 0" alone lets inf through, and norm_eps = inf trains garbage). */
static int validate_finite(struct plan *p, char *err, size_t n)
{
  char msg[256];
  for (int i = 0; i < plan_n_fields; i++)
    if (plan_field_check_finite(&plan_fields[i], p, msg, sizeof msg))
      return fail(err, n, p, plan_fields[i].path, "%s", msg);
  return 0;
}

static int validate_model(struct plan *p, char *err, size_t n)
{
  struct plan_model *m = &p->model;
  if (m->dim % m->n_heads)
    return fail(err, n, p, "model.dim", "model.dim = %d: not a multiple of model.n_heads = %d "
                "(the head size is dim / n_heads)", m->dim, m->n_heads);
  m->head_dim = m->dim / m->n_heads;
  if (m->head_dim % 2)
    return fail(err, n, p, "model.dim", "model.dim = %d: head size dim / n_heads = %d is odd; "
                "rotary embeddings need an even head size", m->dim, m->head_dim);
  if (m->n_kv_heads > m->n_heads || m->n_heads % m->n_kv_heads) {
    char d[256];
    return fail(err, n, p, "model.n_kv_heads", "model.n_kv_heads = %d: must divide model.n_heads = %d "
                "(grouped-query attention); use one of %s", m->n_kv_heads, m->n_heads,
                divisors(m->n_heads, d, sizeof d));
  }
  return 0;
}

static int validate_mesh(struct plan *p, char *err, size_t n)
{
  struct plan_mesh *me = &p->mesh;
  /* the axes beside dp: tp × pp, or tp × cp × pp with context parallelism (named only then, so
   * the messages of plans without it stay as they were) */
  long long tp_pp = (long long)me->tp * me->cp * me->pp;
  char axes[64], sizes[64], each[96];
  if (me->cp > 1) {
    snprintf(axes, sizeof axes, "tp × cp × pp");
    snprintf(sizes, sizeof sizes, "%d × %d × %d", me->tp, me->cp, me->pp);
    snprintf(each, sizeof each, "tp %d × cp %d × pp %d", me->tp, me->cp, me->pp);
  } else {
    snprintf(axes, sizeof axes, "tp × pp");
    snprintf(sizes, sizeof sizes, "%d × %d", me->tp, me->pp);
    snprintf(each, sizeof each, "tp %d × pp %d", me->tp, me->pp);
  }
  if (me->dp_auto) {
    if (me->world <= 0) { /* no world given: the smallest one, dp = 1, or mesh.ep (check says so) */
      me->world = (int)tp_pp * plan_ep(p);
      me->world_assumed = 1;
    }
    if (me->world % tp_pp)
      return fail(err, n, p, "mesh", "mesh: a world of %d ranks is not a multiple of %s = %s "
                  "= %lld; use a world that is, or change %s", me->world, axes, sizes, tp_pp,
                  me->cp > 1 ? "tp, cp or pp" : "tp or pp");
    me->dp = (int)(me->world / tp_pp);
  } else {
    long long product = tp_pp * me->dp;
    if (me->world > 0 && product != me->world) {
      if (me->world % tp_pp == 0)
        return fail(err, n, p, "mesh.dp", "mesh.dp = %d: %s × dp %d = %lld ranks, but the "
                    "world has %d; set dp = %lld or dp = \"auto\"", me->dp, each, me->dp,
                    product, me->world, me->world / tp_pp);
      return fail(err, n, p, "mesh", "mesh: %s × dp %d = %lld ranks, but the world has %d, "
                  "which is not a multiple of %s = %lld", each, me->dp, product,
                  me->world, axes, tp_pp);
    }
    if (product > 1 << 30)
      return fail(err, n, p, "mesh", "mesh: %s × dp = %lld ranks is too many", axes, product);
    me->world = (int)product;
  }
  return 0;
}


/* mesh.ep (plan.h, docs/moe.md "Expert parallelism"): groups of ep consecutive data-parallel
 * ranks, each holding experts / ep of every sparse layer's experts. So ep needs experts to
 * spread, and divides both dp and the experts. */
static int validate_ep(struct plan *p, char *err, size_t n)
{
  const int ep = plan_ep(p), dp = p->mesh.dp, experts = p->model.moe.experts;
  if (ep == 1)
    return 0;
  char d[256], moe_at[PLAN_PATH_MAX + 32];
  if (experts <= 0)
    return fail(err, n, p, "mesh.ep", "mesh.ep = %d: expert parallelism spreads the experts of model.moe, and "
                "this model has none; set mesh.ep = 1 (or leave it out), or give the model a model.moe", ep);
  snprintf(moe_at, sizeof moe_at, "%s", plan_where(p, "model.moe.experts"));
  if (dp % ep) {
    char given[160] = ""; /* without a world size dp "auto" is ep (validate_mesh), so a world was given */
    if (p->mesh.dp_auto)
      snprintf(given, sizeof given, " (dp \"auto\" = world %d / (tp %d × pp %d))", p->mesh.world, p->mesh.tp,
               p->mesh.pp);
    return fail(err, n, p, "mesh.ep", "mesh.ep = %d does not divide mesh.dp = %d%s: an ep group is ep consecutive "
                "data-parallel ranks; use ep in {%s} (the divisors of dp that divide model.moe.experts = %d)",
                ep, dp, given, common_divisors(dp, experts, d, sizeof d), experts);
  }
  if (experts % ep)
    return fail(err, n, p, "mesh.ep", "mesh.ep = %d does not divide model.moe.experts = %d (%s): each ep rank "
                "holds experts / ep of every sparse layer's experts; use ep in {%s} (the divisors of the experts "
                "that divide mesh.dp = %d)", ep, experts, moe_at, common_divisors(experts, dp, d, sizeof d), dp);
  return 0;
}

/* Smallest achievable maximum stage cost, splitting L equal layers into S contiguous
 * non-empty stages where stage 0 carries `first` extra and stage S-1 `last` extra. Fills
 * counts[s]. Exact: tries every feasible count for the two end stages. */
static void balance(int L, int S, double unit, double first, double last, int *counts)
{
  if (S == 1) {
    counts[0] = L;
    return;
  }
  double best = -1, best_spread = 0;
  int best_a = 1, best_b = 1;
  for (int a = 1; a <= L - (S - 1); a++) {
    for (int b = 1; a + b <= L - (S - 2); b++) {
      int mid = L - a - b, inner = S - 2;
      if ((inner == 0 && mid != 0) || (inner > 0 && mid < inner))
        continue;
      double c0 = first + a * unit, cl = last + b * unit;
      double hi = inner ? (double)((mid + inner - 1) / inner) * unit : 0, lo = inner ? (double)(mid / inner) * unit : 0;
      double worst = c0 > cl ? c0 : cl;
      if (hi > worst)
        worst = hi;
      /* among splits with the same maximum, the most even one (least sum of squares) */
      double spread = c0 * c0 + cl * cl + (inner ? (mid % inner) * hi * hi + (inner - mid % inner) * lo * lo : 0);
      if (best < 0 || worst < best * (1 - 1e-12) || (worst <= best * (1 + 1e-12) && spread < best_spread)) {
        best = worst;
        best_spread = spread;
        best_a = a;
        best_b = b;
      }
    }
  }
  counts[0] = best_a;
  counts[S - 1] = best_b;
  int mid = L - best_a - best_b, inner = S - 2;
  for (int s = 1; s < S - 1; s++)
    counts[s] = mid / inner + ((s - 1) < mid % inner ? 1 : 0);
}

int plan_assign_stages(struct plan *p, char *err, size_t n)
{
  int L = p->model.n_layers, S = p->n_stages;
  if (p->stages_kind != PLAN_STAGES_EVEN && p->stages_kind != PLAN_STAGES_BALANCED)
    return 0;
  const char *kind = p->stages_kind == PLAN_STAGES_EVEN ? "even" : "balanced";
  if (L < S)
    return fail(err, n, p, "stages", "stages = \"%s\": %d layers cannot fill %d stages "
                "(pp %d × virtual_stages %d); use fewer stages or list them explicitly",
                kind, L, S, p->mesh.pp, p->virtual_stages);
  int *counts = calloc((size_t)S, sizeof *counts);
  if (!counts)
    return fail(err, n, p, "stages", "out of memory");
  if (p->stages_kind == PLAN_STAGES_EVEN) {
    for (int s = 0; s < S; s++) /* stage s holds layers [s·L/S, (s+1)·L/S) */
      counts[s] = (int)(((long long)(s + 1) * L) / S - ((long long)s * L) / S);
  } else {
    /* layers of equal cost: with model.moe, the mean of the sparse and dense ones */
    const struct plan_layer_flops lf = plan_layer_flops(p);
    const double unit = p->model.moe.experts > 0 ? (plan_model_flops(p) - plan_head_flops(p)) / L
                                                 : lf.attn_proj + lf.attn_core + lf.mlp;
    balance(L, S, unit, 0.0, plan_head_flops(p), counts);
  }
  int layer = 0;
  for (int s = 0; s < S; s++)
    for (int i = 0; i < counts[s]; i++)
      p->layers[layer++].stage = s;
  free(counts);
  return 0;
}

/* Fills p->stages from the per-layer stage indices, and checks order and coverage. */
static int build_stages(struct plan *p, char *err, size_t n)
{
  int S = p->n_stages;
  free(p->stages);
  p->stages = calloc((size_t)S, sizeof *p->stages);
  if (!p->stages)
    return fail(err, n, p, "stages", "out of memory");
  for (int s = 0; s < S; s++) {
    p->stages[s].index = s;
    p->stages[s].pp_rank = s % p->mesh.pp;
    p->stages[s].chunk = s / p->mesh.pp;
    p->stages[s].first_layer = -1;
  }
  p->stages[0].has_embed = 1;
  p->stages[S - 1].has_head = 1;
  for (int l = 0; l < p->model.n_layers; l++) {
    int s = p->layers[l].stage;
    if (s < 0 || s >= S)
      return fail(err, n, p, "stages", "stages: layer %d is in stage %d, but stages are 0..%d "
                  "(pp %d × virtual_stages %d)", l, s, S - 1, p->mesh.pp, p->virtual_stages);
    if (l > 0 && s < p->layers[l - 1].stage)
      return fail(err, n, p, "stages", "stages: layer %d is in stage %d after layer %d in stage %d; "
                  "layers must go to stages in order", l, s, l - 1, p->layers[l - 1].stage);
    if (p->stages[s].first_layer < 0)
      p->stages[s].first_layer = l;
    p->stages[s].n_layers++;
  }
  for (int s = 0; s < S; s++) {
    struct plan_stage *st = &p->stages[s];
    if (st->n_layers == 0 && !st->has_embed && !st->has_head)
      return fail(err, n, p, "stages", "stages: stage %d holds no layer (pp %d × virtual_stages %d "
                  "= %d stages for %d layers); every stage needs at least one layer",
                  s, p->mesh.pp, p->virtual_stages, S, p->model.n_layers);
  }
  return 0;
}

/* Column/row splits must cut whole heads and whole ffn/dim slices. */
static int validate_splits(struct plan *p, char *err, size_t n)
{
  const struct plan_model *m = &p->model;
  int tp = p->mesh.tp;
  char d[256];
  const char *fpath = p->tp_split_is_function ? "tp_split" : NULL;
  if (tp > 1 && m->tie_embeddings && p->embed_split != p->head_split)
    return fail(err, n, p, fpath ? fpath : "tp_split.head", "tp_split.head = \"%s\" with tp_split.embed = "
                "\"%s\": model.tie_embeddings = true makes them one tensor, split one way; give both "
                "\"vocab\" or both \"replicate\"", plan_split_name(p->head_split),
                plan_split_name(p->embed_split));
  for (int l = 0; l < m->n_layers; l++) {
    for (int mod = PLAN_LAYER_MOD_FIRST; mod <= PLAN_LAYER_MOD_LAST; mod++) {
      enum plan_split s = p->layers[l].split[mod];
      char path[64];
      snprintf(path, sizeof path, "tp_split.%s", plan_module_name(mod));
      const char *at = fpath ? fpath : path;
      char ctx[96] = "";
      if (fpath)
        snprintf(ctx, sizeof ctx, " (returned by the tp_split function for layer %d)", l);
      if (s == PLAN_SPLIT_REPLICATE || tp == 1)
        continue;
      int out_dim = 0, in_dim = 0; /* the dimension a column / row split cuts */
      const char *out_what = "", *in_what = "";
      switch (mod) {
      case PLAN_MOD_Q: out_dim = m->n_heads; out_what = "model.n_heads"; in_dim = m->dim; in_what = "model.dim"; break;
      case PLAN_MOD_K:
      case PLAN_MOD_V: out_dim = m->n_kv_heads; out_what = "model.n_kv_heads"; in_dim = m->dim; in_what = "model.dim"; break;
      case PLAN_MOD_O: out_dim = m->dim; out_what = "model.dim"; in_dim = m->n_heads; in_what = "model.n_heads"; break;
      case PLAN_MOD_GATE:
      case PLAN_MOD_UP: out_dim = m->ffn_dim; out_what = "model.ffn_dim"; in_dim = m->dim; in_what = "model.dim"; break;
      case PLAN_MOD_DOWN: out_dim = m->dim; out_what = "model.dim"; in_dim = m->ffn_dim; in_what = "model.ffn_dim"; break;
      default: break;
      }
      int cut = s == PLAN_SPLIT_COLUMN ? out_dim : in_dim;
      const char *what = s == PLAN_SPLIT_COLUMN ? out_what : in_what;
      if (cut % tp == 0)
        continue;
      if ((mod == PLAN_MOD_K || mod == PLAN_MOD_V) && s == PLAN_SPLIT_COLUMN)
        return fail(err, n, p, at, "%s = \"column\"%s: mesh.tp = %d does not divide %s = %d; use tp "
                    "in {%s} or set tp_split.k and tp_split.v to \"replicate\" (every rank then "
                    "holds all key/value heads)", path, ctx, tp, what, cut, divisors(cut, d, sizeof d));
      return fail(err, n, p, at, "%s = \"%s\"%s: mesh.tp = %d does not divide %s = %d; use tp in {%s} "
                  "or another split", path, plan_split_name(s), ctx, tp, what, cut,
                  divisors(cut, d, sizeof d));
    }
  }
  return 0;
}

static int validate_batch(struct plan *p, char *err, size_t n)
{
  int dp = p->mesh.dp, micro = p->batch.micro;
  long long per_step = (long long)micro * dp;
  if (p->batch.seq > p->model.max_seq)
    return fail(err, n, p, "batch.seq", "batch.seq = %d: longer than model.max_seq = %d",
                p->batch.seq, p->model.max_seq);
  /* context parallelism cuts each sequence into 2·cp chunks (two per cp rank, runtime/parallel/
   * cp.h), each of at least one token */
  if (p->mesh.cp > 1 && p->batch.seq < 2 * p->mesh.cp)
    return fail(err, n, p, "mesh.cp", "mesh.cp = %d: batch.seq = %d is shorter than the 2 × cp = %d chunks "
                "context parallelism cuts each sequence into (each of at least one token); use cp ≤ %d",
                p->mesh.cp, p->batch.seq, 2 * p->mesh.cp, p->batch.seq / 2);
  if (p->batch.global % per_step)
    return fail(err, n, p, "batch.global", "batch.global = %d: not a multiple of batch.micro × dp = "
                "%d × %d = %lld; use a multiple of %lld (e.g. %lld) or change batch.micro",
                p->batch.global, micro, dp, per_step, per_step,
                ((p->batch.global + per_step - 1) / per_step) * per_step);
  p->batch.microbatches = (int)(p->batch.global / per_step);
  if (p->sequence_parallel && p->batch.seq % p->mesh.tp)
    return fail(err, n, p, "sequence_parallel", "sequence_parallel = true: batch.seq = %d is not a "
                "multiple of mesh.tp = %d (each rank holds seq / tp positions)", p->batch.seq, p->mesh.tp);
  /* with context parallelism a tp rank holds tp-th of its cp rank's two chunks: equal chunks of a
   * multiple of tp tokens each, so every cp rank's rows split evenly */
  const long long sp_cp = 2LL * p->mesh.cp * p->mesh.tp;
  if (p->sequence_parallel && p->mesh.tp > 1 && p->mesh.cp > 1 && p->batch.seq % sp_cp)
    return fail(err, n, p, "sequence_parallel", "sequence_parallel = true with mesh.cp = %d: batch.seq = %d is "
                "not a multiple of 2 × cp × tp = %lld (each of the 2 × cp chunks splits over the %d tp ranks); "
                "use a multiple of %lld or sequence_parallel = false", p->mesh.cp, p->batch.seq, sp_cp, p->mesh.tp,
                sp_cp);
  return 0;
}

static int validate_schedule(struct plan *p, char *err, size_t n)
{
  int pp = p->mesh.pp, vs = p->virtual_stages;
  if (p->schedule == PLAN_SCHED_INTERLEAVED) {
    if (vs < 2)
      return fail(err, n, p, "schedule.kind", "schedule.kind = \"interleaved\": needs virtual_stages "
                  "≥ 2 (it is %d); set virtual_stages or use \"1f1b\"", vs);
    if (pp < 2)
      return fail(err, n, p, "schedule.kind", "schedule.kind = \"interleaved\": needs mesh.pp ≥ 2 "
                  "(it is %d); use \"1f1b\"", pp);
    if (p->batch.microbatches % pp)
      return fail(err, n, p, "batch.global", "batch.global = %d: the interleaved schedule needs the "
                  "micro-batches per step (%d = global / (micro × dp)) to be a multiple of mesh.pp = %d",
                  p->batch.global, p->batch.microbatches, pp);
  } else if (p->schedule == PLAN_SCHED_ZB_H1 && p->batch.microbatches < pp) {
    return fail(err, n, p, "batch.global", "batch.global = %d: schedule.kind = \"zb-h1\" needs at least "
                "mesh.pp = %d micro-batches per step (it has %d = global / (micro × dp)); use \"1f1b\" or "
                "more micro-batches", p->batch.global, pp, p->batch.microbatches);
  } else if (vs > 1) {
    return fail(err, n, p, "virtual_stages", "virtual_stages = %d: only the \"interleaved\" schedule "
                "runs virtual stages (schedule.kind is \"%s\"); set schedule = { kind = \"interleaved\" } "
                "or virtual_stages = 1", vs, plan_schedule_name(p->schedule));
  }
  return 0;
}

/* zero_every (plan.h, docs/plans.md): the gradients' choice is zero 2 and 3's, the parameters'
 * zero 3's; anything else would be a field that changes nothing, so it is refused. Defaults: with
 * pipeline stages "step" for both (each stage keeps its whole gradients until its last
 * micro-batch's backward and its gathered parameters for the step, as PyTorch's pipeline
 * schedules run FSDP and torchtitan configures it), without them "micro_batch" (every backward
 * reduce-scatters, every forward and backward gathers: DeepSpeed's and FSDP's default). */
static int validate_zero_every(struct plan *p, char *err, size_t n)
{
  if (p->zero_every.grads_set && p->zero < 2)
    return fail(err, n, p, "zero_every.grads", "zero_every.grads = \"%s\" with zero = %d: zero 0 and 1 keep "
                "whole gradients and reduce them once per step; the choice is for zero = 2 and 3 (or leave "
                "zero_every.grads unset)", plan_zero_every_name(p->zero_every.grads), p->zero);
  if (p->zero_every.params_set && p->zero < 3)
    return fail(err, n, p, "zero_every.params", "zero_every.params = \"%s\" with zero = %d: only zero = 3 "
                "shards the parameters and gathers them; set zero = 3 or leave zero_every.params unset",
                plan_zero_every_name(p->zero_every.params), p->zero);
  const enum plan_zero_every dflt = p->mesh.pp > 1 ? PLAN_ZERO_EVERY_STEP : PLAN_ZERO_EVERY_MICRO_BATCH;
  if (!p->zero_every.grads_set)
    p->zero_every.grads = dflt;
  if (!p->zero_every.params_set)
    p->zero_every.params = dflt;
  return 0;
}

static int validate_training(struct plan *p, char *err, size_t n)
{
  if (p->precision.master != PLAN_FP32)
    return fail(err, n, p, "precision.master", "precision.master = \"%s\": master weights are kept "
                "in fp32 only", plan_dtype_name(p->precision.master));
  if (p->precision.compute == PLAN_FP32 && p->precision.grads != PLAN_FP32)
    return fail(err, n, p, "precision.grads", "precision.grads = \"%s\": gradients are fp32 when "
                "compute is fp32", plan_dtype_name(p->precision.grads));
  if (p->lr_schedule.decay_steps == 0) {
    p->lr_schedule.decay_steps = p->train.steps;
    p->lr_schedule.decay_steps_derived = 1;
  }
  if (p->lr_schedule.decay != PLAN_DECAY_CONSTANT && p->lr_schedule.decay_steps < p->lr_schedule.warmup)
    return fail(err, n, p, "lr_schedule.decay_steps", "lr_schedule.decay_steps = %lld: shorter than "
                "lr_schedule.warmup = %d", p->lr_schedule.decay_steps, p->lr_schedule.warmup);
  if (p->lr_schedule.min_lr > p->optimizer.lr)
    return fail(err, n, p, "lr_schedule.min_lr", "lr_schedule.min_lr = %g: larger than optimizer.lr = %g",
                p->lr_schedule.min_lr, p->optimizer.lr);
  if (strcmp(p->data.synthetic, "addition") == 0 && p->model.vocab < 62)
    return fail(err, n, p, "model.vocab", "model.vocab = %d: the byte-level \"addition\" corpus "
                "needs vocab ≥ 62 (token id = byte value)", p->model.vocab);
  /* Evaluation asked for with nothing to evaluate on would be skipped without a word: a token
   * file has no held-out part, so eval needs data.val (the synthetic corpus has its own). */
  if (p->train.eval_every > 0 && p->train.eval_batches > 0 && !p->data.synthetic[0] && p->data.train[0] &&
      !p->data.val[0])
    return fail(err, n, p, "train.eval_every", "train.eval_every = %d: evaluation needs a validation set, "
                "and data.train = \"%s\" comes without data.val; give data.val (a held-out token file) "
                "or set train.eval_every = 0", p->train.eval_every, p->data.train);
  if (p->train.eval_every > 0 && p->train.eval_batches > 0 && p->data.n_text && p->data.val_fraction == 0)
    return fail(err, n, p, "data.val_fraction", "data.val_fraction = 0: train.eval_every = %d asks for evaluation, "
                "and data.text then has no validation set; give data.val_fraction > 0 (e.g. 0.05) or set "
                "train.eval_every = 0", p->train.eval_every);
  if (p->train.sample.given && !p->data.tokenizer[0])
    return fail(err, n, p, "train.sample", "train.sample: the prompt is encoded with data.tokenizer, and the plan "
                "gives none (train.sample goes with data.text)");
  if (p->train.max_loss_jump != 0 && p->train.max_loss_jump <= 1)
    return fail(err, n, p, "train.max_loss_jump", "train.max_loss_jump = %g: must be above 1 (a step whose "
                "loss is more than this many times the mean of the recent steps is skipped), or 0 for off",
                p->train.max_loss_jump);
  for (int s = 0; s < PLAN_N_SEEDS; s++)
    if (p->seeds.derived[s])
      p->seeds.value[s] = plan_derive_seed(p->seeds.global, plan_seed_name(s));
  return 0;
}

/* model.moe (docs/moe.md): what the sparse MLP cannot be combined with yet. Each refusal names
 * the field to change. */
static int validate_moe(struct plan *p, char *err, size_t n)
{
  const struct plan_moe *e = &p->model.moe;
  if (e->experts <= 0)
    return 0;
  char moe_at[PLAN_PATH_MAX + 32];
  snprintf(moe_at, sizeof moe_at, "%s", plan_where(p, "model.moe"));
  if (p->mesh.tp > 1 && p->sequence_parallel)
    return fail(err, n, p, "sequence_parallel", "sequence_parallel = true with model.moe (%s) and mesh.tp = %d: a "
                "sparse layer routes whole sequences (its capacity is per sequence), and sequence parallelism "
                "leaves a tp rank part of each; set sequence_parallel = false", moe_at, p->mesh.tp);
  /* tensor parallelism: a sparse layer's MLP (its router and experts) is not split; it is whole on
   * every tp rank, which computes it for all of the layer's tokens (replicated in, replicated out:
   * the "replicate" split of the layout algebra) */
  for (int l = 0; p->mesh.tp > 1 && l < p->model.n_layers; l++)
    if (p->layers[l].moe)
      p->layers[l].split[PLAN_MOD_GATE] = p->layers[l].split[PLAN_MOD_UP] = p->layers[l].split[PLAN_MOD_DOWN] =
        PLAN_SPLIT_REPLICATE;
  const uint8_t mlp_parts = PLAN_RC_MLP_NORM | PLAN_RC_MLP_ACT | PLAN_RC_MLP;
  for (int l = 0; l < p->model.n_layers; l++) {
    const uint8_t mask = p->layers[l].recompute;
    if (!p->layers[l].moe || !(mask & mlp_parts))
      continue;
    char text[96], ctx[96] = "";
    if (p->recompute_is_function)
      snprintf(ctx, sizeof ctx, " (returned by the recompute function for layer %d)", l);
    plan_recompute_text(mask, text, sizeof text);
    return fail(err, n, p, "recompute", "recompute = \"%s\"%s: layer %d is sparse (model.moe, %s), and "
                "recompute of the sparse MLP is not supported yet; recompute attention parts only "
                "(\"attn_norm\", \"attn_core\", \"attn\") on sparse layers", text, ctx, l, moe_at);
  }
  return 0;
}

int plan_validate(struct plan *p, char *err, size_t n)
{
  if (validate_finite(p, err, n) || validate_model(p, err, n) || validate_mesh(p, err, n) ||
      validate_ep(p, err, n))
    return -1;
  p->n_stages = p->mesh.pp * p->virtual_stages;
  int vocab_split = p->embed_split == PLAN_SPLIT_VOCAB || p->head_split == PLAN_SPLIT_VOCAB;
  int tp = p->mesh.tp;
  p->model.vocab_padded = vocab_split ? (p->model.vocab + tp - 1) / tp * tp : p->model.vocab;
  if (validate_batch(p, err, n) || validate_schedule(p, err, n) || validate_zero_every(p, err, n))
    return -1;
  if (plan_assign_stages(p, err, n) || build_stages(p, err, n))
    return -1;
  if (validate_splits(p, err, n) || validate_training(p, err, n) || validate_moe(p, err, n))
    return -1;
  return 0;
}
