/* The predicted memory bill (bill.h). */
#include "layout/bill.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "ops.h"
#include "real.h"
#include "comm/comm.h"
#include "layout/acts.h"
#include "layout/dp_buckets.h"
#include "layout/params.h"
#include "layout/pieces.h"
#include "layout/tp_layout.h"
#include "sched/sched.h"
#include "util/err.h"
#ifdef TYCHO_HAVE_CUDA_BACKEND
#include "cuda/cuda_backend.h"
#endif

/* The ranks the data-parallel layer reduces and shards over: dp, times cp under context
 * parallelism (the cp ranks of a dp rank hold the same parameters and sum their gradients as its
 * dp peers do: the runtime's "dpcp" group, train.c). */
static int dp_ranks(const struct plan *p)
{
  return p->mesh.dp * (p->mesh.cp > 1 ? p->mesh.cp : 1);
}

/* Floats of unit u's buckets. */
static size_t unit_elems(const struct dp_layout *l, int u)
{
  const struct dp_unit *k = &l->units[u];
  if (k->first_bucket < 0)
    return 0;
  const struct dp_bucket *a = &l->buckets[k->first_bucket], *b = &l->buckets[k->last_bucket];
  return b->start + b->n_elems - a->start;
}

/* Zero ≥ 2 over a pipeline rank's list of the schedule, as dp_passes.c runs it: which units each
 * backward piece writes gradients to (the head: also a tied embedding's) and which are final
 * after it (the head's; a tied embedding's on a last stage without the embedding; a layer's; the
 * embedding's), so which buckets reduce where. zero_every.grads = "micro_batch": every piece gives
 * its units' buckets gradients (a bucket still reducing from the micro-batch before finished
 * first); once units are final the reductions in flight finish, freeing their buckets and
 * outputs, and theirs start into outputs allocated then. "step": the whole gradients (n_elems)
 * from the step's first backward to the end of its reductions, each stage's last backward
 * reduce-scattering straight into the shard. Out: the most gradient elements held besides the
 * shard (*grads) and reduce-scatter output elements (*comm) at once, the reduce-scatters of a
 * step and the elements they are given. 0, or nonzero with a message. */
struct zero_grads {
  size_t grads, comm;
  unsigned long long calls, elems;
  unsigned long long expert_calls, expert_elems; /* of them, the expert buckets' (dp.h) */
};

static void zero_finish(const struct dp_layout *l, int *inflight, int *n_in, char *has, size_t *g, size_t *c,
                        int n)
{
  for (int i = 0; i < n; i++) {
    const int b = inflight[i];
    has[b] = 0;
    *g -= l->buckets[b].n_elems;
    *c -= l->buckets[b].share;
  }
  memmove(inflight, inflight + n, (size_t)(*n_in - n) * sizeof *inflight);
  *n_in -= n;
}

static int zero_grads_replay(const struct plan *p, const struct sched_list *list, const struct dp_layout *l,
                             int grads_step, struct zero_grads *out, char *err, size_t err_size)
{
  memset(out, 0, sizeof *out);
  const int L = p->model.n_layers, tied = p->model.tie_embeddings, nb = l->n_buckets;
  int max_layers = 0;
  for (int s = 0; s < p->n_stages; s++)
    max_layers = p->stages[s].n_layers > max_layers ? p->stages[s].n_layers : max_layers;
  struct piece *pcs = malloc((size_t)(max_layers + 2) * sizeof *pcs);
  int *inflight = malloc((size_t)nb * sizeof *inflight);
  char *has = calloc((size_t)nb, 1);
  int *last_bwd = malloc((size_t)p->n_stages * sizeof *last_bwd);
  if (!pcs || !inflight || !has || !last_bwd) {
    free(pcs);
    free(inflight);
    free(has);
    free(last_bwd);
    return errf(err, err_size, "out of memory");
  }
  pieces_last_backwards(list, p->n_stages, last_bwd);
  int n_in = 0, last_reduce = -1;
  size_t g = 0, c = 0;
  for (int i = 0; i < list->n; i++)
    if (list->instr[i].op == SCHED_REDUCE_GRADS)
      last_reduce = i;
  for (int i = 0; i < list->n; i++) {
    const struct sched_instr *in = &list->instr[i];
    if (i == last_reduce) { /* the executor acts on the rank's last REDUCE_GRADS only (dp_reduce_rest) */
      zero_finish(l, inflight, &n_in, has, &g, &c, n_in);
      continue;
    }
    /* a split list's B and W (only under "step", bill_split_runs) each run the stage's backward
     * pieces; the stage's last W is where its gradients are final */
    if (in->op != SCHED_BWD && in->op != SCHED_BWD_B && in->op != SCHED_BWD_W)
      continue;
    const struct plan_stage *st = &p->stages[in->stage];
    const int last = last_bwd[in->stage] == i;
    const int n = pieces_of_stage(st, 1, pcs);
    for (int k = 0; k < n; k++) {
      int w[2], nw = 0, f[2], nf = 0;
      switch (pcs[k].kind) {
      case PIECE_HEAD_BWD:
        w[nw++] = f[nf++] = L + 1;
        if (tied)
          w[nw++] = 0;
        if (tied && !st->has_embed)
          f[nf++] = 0;
        break;
      case PIECE_LAYER_BWD: w[nw++] = f[nf++] = 1 + pcs[k].layer; break;
      case PIECE_EMBED_BWD: w[nw++] = f[nf++] = 0; break;
      default: break;
      }
      if (!grads_step)
        for (int a = 0; a < nw; a++)
          for (int b = l->units[w[a]].first_bucket; b >= 0 && b <= l->units[w[a]].last_bucket; b++) {
            for (int q = 0; q < n_in; q++)
              if (inflight[q] == b) {
                zero_finish(l, inflight, &n_in, has, &g, &c, q + 1);
                break;
              }
            if (!has[b]) {
              has[b] = 1;
              g += l->buckets[b].n_elems;
            }
          }
      out->grads = g > out->grads ? g : out->grads;
      if (grads_step && !last)
        continue;
      if (!grads_step) {
        zero_finish(l, inflight, &n_in, has, &g, &c, n_in);
        for (int a = 0; a < nf; a++)
          for (int b = l->units[f[a]].first_bucket; b >= 0 && b <= l->units[f[a]].last_bucket; b++)
            c += l->buckets[b].share;
        out->comm = c > out->comm ? c : out->comm;
      }
      for (int a = 0; a < nf; a++)
        for (int b = l->units[f[a]].last_bucket; b >= 0 && b >= l->units[f[a]].first_bucket; b--) {
          out->calls++;
          out->elems += l->buckets[b].n_elems;
          out->expert_calls += (unsigned long long)l->buckets[b].expert;
          out->expert_elems += l->buckets[b].expert ? l->buckets[b].n_elems : 0;
          if (!grads_step)
            inflight[n_in++] = b;
        }
    }
  }
  if (grads_step)
    out->grads = l->n_elems; /* the step's whole gradients, from its first backward on */
  free(pcs);
  free(inflight);
  free(has);
  free(last_bwd);
  return 0;
}

/* ZeRO-3 over a pipeline rank's list of the schedule, piece by piece as the executor runs it
 * (pieces_zero3_replay): the all-gathers of a step, the elements they move (of the buckets with
 * `expert` equal to this, or of all where it is −1), and the most bytes gathered at once: each
 * unit's elements of elem_bytes, or with table t of a bf16 plan its parameters' bf16 copies
 * only, which the runtime gathers in place of the fp32 weights and frees with the unit (t NULL:
 * elem_bytes). 0, or nonzero with a message. */
static int zero3_replay(const struct plan *p, const struct sched_list *list, const struct dp_layout *l,
                        const struct layout_params *t, size_t elem_bytes, int expert, unsigned long long *calls,
                        unsigned long long *moved, size_t *peak, char *err, size_t err_size)
{
  const int U = l->n_units;
  size_t *held = calloc((size_t)U, sizeof *held), *gathered = calloc((size_t)U, sizeof *gathered);
  int *n_calls = calloc((size_t)U, sizeof *n_calls);
  int rc = !held || !gathered || !n_calls ? errf(err, err_size, "out of memory") : 0;
  for (int u = 0; !rc && u < U; u++) {
    const struct dp_unit *k = &l->units[u];
    size_t bf16_start;
    held[u] = t && t->n_bf16 ? pieces_unit_bf16(t, k->first_param, k->last_param, &bf16_start) * sizeof(bf16)
                             : unit_elems(l, u) * elem_bytes;
    for (int b = k->first_bucket; k->first_bucket >= 0 && b <= k->last_bucket; b++) {
      if (expert >= 0 && l->buckets[b].expert != expert)
        continue;
      n_calls[u]++;
      gathered[u] += l->buckets[b].n_elems;
    }
  }
  const int keep = p->zero_every.params == PLAN_ZERO_EVERY_STEP; /* "step": kept to the last backward */
  if (!rc && pieces_zero3_replay(p, list, keep, held, n_calls, gathered, calls, moved, peak))
    rc = errf(err, err_size, "out of memory");
  free(held);
  free(gathered);
  free(n_calls);
  return rc;
}

int bill_split_runs_zero(int zero, int grads_step, int params_step)
{
  return zero < 2 || (grads_step && (zero < 3 || params_step));
}

int bill_split_runs(const struct plan *p)
{
  return bill_split_runs_zero(p->zero, p->zero_every.grads == PLAN_ZERO_EVERY_STEP,
                              p->zero_every.params == PLAN_ZERO_EVERY_STEP);
}

static int outline_table(const struct plan *p, int pp_rank, struct layout_rank *rank, struct layout_params *t,
                         char *err, size_t err_size);

double bill_split_held_bytes(const struct plan *p, const struct sched_list *list, int pp_rank, int *areas)
{
  /* at tp > 1 the widths come from the layouts of the pipeline rank's layers (tp rank 0's: every
   * tp rank's are the same) */
  struct layout_rank rank;
  struct layout_params t;
  char err[256];
  const int outline = p->mesh.tp > 1;
  if (outline && outline_table(p, pp_rank, &rank, &t, err, sizeof err)) {
    *areas = 0;
    return -1;
  }
  double elems = 0;
  for (int k = 0; k < p->n_stages; k++) {
    const double e = p->stages[k].pp_rank == pp_rank ? layout_split_held_elems(p, k, outline ? &rank : NULL) : 0;
    elems = e > elems ? e : elems;
  }
  if (outline) {
    layout_params_free(&t);
    layout_rank_free(&rank);
  }
  const int cpu = plan_on_cpu(p);
  const double elem = p->precision.compute == PLAN_BF16 ? (double)sizeof(bf16)
                      : cpu ? (double)sizeof(real) : bill_element_bytes(p, PLAN_FP32);
  *areas = pieces_split_held(list);
  return elems * elem;
}

void bill_shared_open(struct bill_shared *sh, const struct plan *p)
{
  memset(sh, 0, sizeof *sh);
  sh->failed = sched_from_plan(p, &sh->s, sh->err, sizeof sh->err) != 0;
  /* a zero-bubble list: walked as the executor runs it (split backwards) where it runs them
   * (bill_split_runs); under ZeRO 2 and 3 with zero_every "micro_batch", which the runtime does
   * not split, as whole backwards in the same order, what its W's hold beyond that billed apart
   * by `tycho check` (check_zb.c) */
  if (!sh->failed && sh->s.split && !bill_split_runs(p))
    sh->failed = sched_merge_split(&sh->s, sh->err, sizeof sh->err) != 0;
}

void bill_shared_close(struct bill_shared *sh)
{
  sched_free(&sh->s);
  memset(sh, 0, sizeof *sh);
}

/* What pipeline rank pp_rank builds: its parameter table (in outline: layout_rank_of_plan), its
 * data-parallel layout and the plan's schedule (whose list pp_rank runs is r->list, s that
 * schedule: sh's, or own's). */
struct rank_view {
  struct layout_rank rank;
  struct layout_params t;
  struct dp_layout l;
  struct bill_shared own;
  const struct sched *s;
  const struct sched_list *list;
};

/* precision.grads = "bf16" under ZeRO 0 and 1: the most unit areas (fp32 elements) alive at once,
 * as the runtime's backward pieces hold them (dp_passes.c, unit_grads_ready / unit_grads_fold):
 * the piece's unit, and a tied embedding's from the head's backward to the embedding's when one
 * stage has both (else it is final with the head). Passes run one at a time; -1 out of memory. */
static long long fold_peak(const struct plan *p, const struct rank_view *r, int pp_rank)
{
  const int L = p->model.n_layers, tied = p->model.tie_embeddings;
  struct piece *pcs = malloc((size_t)(L + 2) * sizeof *pcs);
  if (!pcs)
    return -1;
  size_t peak = 0, start;
  const size_t embed = dp_unit_span(&r->l, &r->t, 0, &start), head = dp_unit_span(&r->l, &r->t, L + 1, &start);
  for (int s = 0; s < p->n_stages; s++) {
    const struct plan_stage *st = &p->stages[s];
    if (st->pp_rank != pp_rank)
      continue;
    const int n = pieces_of_stage(st, 1, pcs);
    size_t held0 = 0; /* the tied embedding's area, alive past the head's backward */
    for (int k = 0; k < n; k++) {
      size_t now = 0;
      if (pcs[k].kind == PIECE_HEAD_BWD) {
        now = head + (tied ? embed : 0);
        held0 = tied && st->has_embed ? embed : 0;
      } else if (pcs[k].kind == PIECE_LAYER_BWD) {
        now = dp_unit_span(&r->l, &r->t, 1 + pcs[k].layer, &start) + held0;
      } else if (pcs[k].kind == PIECE_EMBED_BWD) {
        now = embed;
        held0 = 0;
      }
      peak = now > peak ? now : peak;
    }
  }
  free(pcs);
  return (long long)peak;
}

static void rank_view_free(struct rank_view *r)
{
  bill_shared_close(&r->own);
  dp_layout_free(&r->l);
  layout_params_free(&r->t);
  layout_rank_free(&r->rank);
}

/* The outline table of pipeline rank pp_rank (TP rank 0, ep rank 0). 0, or −1 with a message,
 * nothing left to free. */
static int outline_table(const struct plan *p, int pp_rank, struct layout_rank *rank, struct layout_params *t,
                         char *err, size_t err_size)
{
  memset(t, 0, sizeof *t);
  if (layout_rank_of_plan(rank, p, 0, pp_rank, 0, 1, err, err_size))
    return -1;
  if (layout_params_build(t, rank, err, err_size)) {
    layout_rank_free(rank);
    return -1;
  }
  return 0;
}

/* sh: the plan's shared schedule, or NULL to build one. 0 ok; nonzero with a message, nothing
 * left to free. */
static int rank_view(const struct plan *p, const struct bill_shared *sh, int pp_rank, struct rank_view *r,
                     char *err, size_t err_size)
{
  memset(r, 0, sizeof *r);
  if (outline_table(p, pp_rank, &r->rank, &r->t, err, err_size))
    return 1;
  if (dp_buckets_build(&r->l, &r->t, r->rank.config.n_layers, r->rank.ep_size, dp_ranks(p), p->zero, p->bucket_mb,
                       err, err_size)) {
    rank_view_free(r);
    return 1;
  }
  if (!sh) {
    bill_shared_open(&r->own, p);
    sh = &r->own;
  }
  if (sh->failed) {
    errf(err, err_size, "%s", sh->err);
    rank_view_free(r);
    return 1;
  }
  r->s = &sh->s;
  r->list = &sh->s.ranks[pp_rank];
  return 0;
}

/* Elements of rank r's activation areas over `scope` (NULL: all): counts[0] saved activations
 * (one slot), [1] the recompute area, [2] the workspace; [3] the part of [0] that holds ids.
 * 0, or −1 out of memory. */
/* The kernel table whose sizes (the attention's scratch) a plan's bill uses: the one selected
 * when it is a device's (a trainer on its device, a test's device table); else, for a cuda plan
 * in a build with the CUDA backend, the CUDA table (a size needs no device); else the selected
 * one (the CPU's). */
static const struct kernel_ops *sizing_table(const struct plan *p, void **ctx)
{
  *ctx = kernels_active_context();
#ifdef TYCHO_HAVE_CUDA_BACKEND
  if (!plan_on_cpu(p) && kernels_active()->host_visible) {
    *ctx = NULL;
    return &kernel_ops_cuda;
  }
#else
  (void)p;
#endif
  return kernels_active();
}

/* The bytes of one of the bill's compute elements: the runtime's real on the CPU (float64 in the
 * proof build), the GPU runtime's fp32 for a GPU plan. */
static double compute_elem_bytes(const struct plan *p)
{
  return plan_on_cpu(p) ? (double)sizeof(real) : bill_element_bytes(p, PLAN_FP32);
}

static int acts_count(const struct plan *p, const struct rank_view *r, int B, int T,
                      const struct model_acts_scope *scope, size_t counts[4])
{
  struct acts_layout y;
  void *kctx;
  /* the workspace holds the attention scratch of the kernel table the runtime would select */
  const struct kernel_ops *kt = sizing_table(p, &kctx);
  if (layout_acts_build(&y, &r->rank, &r->t, kt, kctx, B, T, scope, 0, (size_t)compute_elem_bytes(p)))
    return -1;
  counts[0] = y.n[ACTS_SAVED];
  counts[1] = y.n[ACTS_RECOMPUTE];
  counts[2] = y.n[ACTS_WORK];
  counts[3] = y.ids;
  layout_acts_free(&y);
  return 0;
}

/* bill.held: what dp_open allocates for the parameters and gradients and what the optimizer and
 * the executor allocate at open, in the element sizes of bill_predict (c the compute type's, g the
 * gradients'); held_comm the comm buffers allocated at open (the pipeline's slot gradients, the
 * cp ring's transfer buffers) in compute elements. Zero 3's gathered
 * units, zero ≥ 2's buckets and reduce-scatter outputs are freed inside each step (dp_passes.c). */
static void bill_held_between_steps(const struct plan *p, const struct rank_view *r, double c, double g,
                                    double held_comm, struct bill *out)
{
  const int zero = p->zero, is_bf16 = r->t.n_bf16 > 0;
  /* the fp32 weights: the flat layout, or the shard (dp_master_is_sharded); a bf16 model's are
   * its master, optimizer state */
  const double weights = (double)(dp_master_is_sharded(zero, is_bf16, dp_ranks(p)) ? r->l.n_shard : r->l.n_elems);
  const double grads = (double)(zero < 2 ? r->l.n_elems : r->l.n_shard);
  /* a bf16 model's copies: whole (zero 0-2), or the shard's (zero 3) */
  const double copies = (double)(zero < 3 ? r->t.n_bf16 : is_bf16 ? r->l.n_shard : 0) * sizeof(bf16);
  out->held[ALLOC_PARAMS] = (is_bf16 ? 0.0 : weights * c) + copies;
  out->held[ALLOC_GRADS] = grads * g;
  out->held[ALLOC_OPTIMIZER] = out->bytes[ALLOC_OPTIMIZER]; /* AdamW's m, v (and master): from open on */
  out->held[ALLOC_ACTIVATIONS] = out->bytes[ALLOC_ACTIVATIONS]; /* every slot allocated at open */
  out->held[ALLOC_WORKSPACE] = out->bytes[ALLOC_WORKSPACE];
  out->held[ALLOC_COMM] = held_comm * c;
  out->held[ALLOC_CHECKPOINT] = 0;
}

int bill_predict(const struct plan *p, int pp_rank, struct bill *out, char *err, size_t err_size)
{
  return bill_predict_shared(p, NULL, pp_rank, out, err, err_size);
}

int bill_predict_shared(const struct plan *p, const struct bill_shared *sh, int pp_rank, struct bill *out,
                        char *err, size_t err_size)
{
  memset(out, 0, sizeof *out);
  struct rank_view r;
  if (rank_view(p, sh, pp_rank, &r, err, err_size))
    return 1;
  const int micro = p->batch.micro, zero = p->zero, cp = p->mesh.cp > 1 ? p->mesh.cp : 1;
  /* a cp rank's rows: the most any holds (layout_cp_rows), as the runtime sizes its activations */
  const int seq = layout_cp_rows(p->batch.seq, cp);
  size_t acts[4];
  int *per_stage = calloc((size_t)p->n_stages, sizeof *per_stage);
  if (!per_stage || acts_count(p, &r, micro, seq, NULL, acts)) {
    free(per_stage);
    rank_view_free(&r);
    return errf(err, err_size, "out of memory counting activations");
  }
  /* activation slots (pieces_stage_slots, as the executor allocates them): the trainer's set (all
   * of this rank's layers) is the first stage's first; every other slot has room for its stage
   * only */
  int slots = 0, first_here = 1;
  double slot_floats = 0, id_reals = (double)acts[3];
  pieces_stage_slots(p, r.s, pp_rank, per_stage);
  for (int k = 0; k < p->n_stages; k++) {
    if (!per_stage[k])
      continue;
    const struct plan_stage *st = &p->stages[k];
    struct model_acts_scope scope = { st->first_layer, st->n_layers, st->has_embed, st->has_head };
    size_t c[4];
    if (acts_count(p, &r, micro, seq, &scope, c)) {
      free(per_stage);
      rank_view_free(&r);
      return errf(err, err_size, "out of memory counting activations");
    }
    slot_floats += (double)(c[0] - c[3]) * (per_stage[k] - first_here);
    id_reals += (double)c[3] * (per_stage[k] - first_here);
    first_here = 0;
    slots += per_stage[k];
  }
  free(per_stage);

  /* Every buffer is counted in the runtime's reals as it carves them (a bf16 model's bf16
   * activations as half as many reals), its fp32 weights are the master, and a bf16 model adds
   * a bf16 copy of every parameter it holds (model.h): the CPU's and the GPU's bf16 modes are one. The
   * reals are this build's on the CPU (float64 in the proof build) and fp32 on a GPU. */
  const int cpu = plan_on_cpu(p);
  const double c = compute_elem_bytes(p);
  /* elements (reals) as the runtime allocates them; zero 3's gathered units in bytes, their bf16
   * copies with them (whole copies under zero 0-2) */
  double params = 0, grads = 0, comm = 0, gathered = 0, activations, workspace;
  double grads_bytes = -1, comm_grads_bytes = 0; /* bf16 gradients: bytes, not elements */
  const int is_bf16 = r.t.n_bf16 > 0, sharded = dp_master_is_sharded(zero, is_bf16, dp_ranks(p));
  /* the fp32 weights (a bf16 model's master: optimizer state), whole or the shard */
  const double weights = (double)(sharded ? r.l.n_shard : r.l.n_elems);
  if (!is_bf16)
    params = weights;
  if (zero < 2)
    grads = (double)r.l.n_elems;
  if (zero < 2 && bill_grads_bf16(p)) { /* the whole gradients in bf16; each unit's fp32 sums with their
                                         * bf16 image, or later the widened bucket or share, in bytes */
    const long long areas = fold_peak(p, &r, pp_rank);
    if (areas < 0) {
      rank_view_free(&r);
      return errf(err, err_size, "out of memory");
    }
    size_t most = 0;
    for (int b = 0; b < r.l.n_buckets; b++) {
      const size_t n = zero == 0 ? r.l.buckets[b].n_elems : r.l.buckets[b].share;
      most = n > most ? n : most;
    }
    const double fill = (double)areas * (c + sizeof(bf16)), widen = (double)most * c;
    grads_bytes = (double)r.l.n_elems * sizeof(bf16) + (fill > widen ? fill : widen);
  }
  if (zero >= 2) {
    size_t pz = 0;
    unsigned long long calls, moved;
    struct zero_grads zg;
    if (zero_grads_replay(p, r.list, &r.l, p->zero_every.grads == PLAN_ZERO_EVERY_STEP, &zg, err, err_size) ||
        (zero == 3 && zero3_replay(p, r.list, &r.l, &r.t, (size_t)c, -1, &calls, &moved, &pz, err, err_size))) {
      rank_view_free(&r);
      return 1;
    }
    grads = (double)(r.l.n_shard + zg.grads);
    comm = (double)zg.comm;
    if (bill_grads_bf16(p)) { /* bf16 gradients: the shard and the reduce-scatter outputs in bf16, each bucket's
                               * fp32 sums with their bf16 image, or later the norm's and AdamW's widened
                               * share (the largest), in bytes */
      size_t most = 0;
      for (int b = 0; b < r.l.n_buckets; b++)
        most = r.l.buckets[b].share > most ? r.l.buckets[b].share : most;
      /* "step": the step's whole gradients in bf16 and the backward's unit areas (fp32 with their
       * image) above them; "micro_batch": the buckets in flight */
      double fill = (double)zg.grads * (c + sizeof(bf16));
      if (p->zero_every.grads == PLAN_ZERO_EVERY_STEP) {
        const long long areas = fold_peak(p, &r, pp_rank);
        if (areas < 0) {
          rank_view_free(&r);
          return errf(err, err_size, "out of memory");
        }
        fill = (double)r.l.n_elems * sizeof(bf16) + (double)areas * (c + sizeof(bf16));
      }
      const double widen = (double)most * c;
      grads_bytes = (double)r.l.n_shard * sizeof(bf16) + (fill > widen ? fill : widen);
      comm_grads_bytes = (double)zg.comm * sizeof(bf16);
      comm = 0;
    }
    if (zero == 3)
      gathered = (double)pz;
  }
  const double state = (double)(zero == 0 ? r.l.n_elems : r.l.n_shard);
  activations = (double)(acts[0] - acts[3]) + slot_floats + (double)acts[1];
  /* a split list's held areas (the executor's struct exec_split): the output gradients of each
   * micro-batch past B, one area per micro-batch at once, allocated at open */
  double split_bytes = 0;
  if (r.s->split) {
    int areas;
    const double one = bill_split_held_bytes(p, r.list, pp_rank, &areas);
    if (one < 0) {
      rank_view_free(&r);
      return errf(err, err_size, "out of memory counting the split backward's held areas");
    }
    split_bytes = one * areas;
  }
  workspace = (double)acts[2];
  const double boundary = (double)micro * (p->sequence_parallel && p->mesh.tp > 1 ? seq / p->mesh.tp : seq) *
                          p->model.dim;
  const double slot_grads = p->n_stages > 1 ? boundary * slots : 0.0; /* a gradient buffer per slot */
  comm += slot_grads;
  /* a bf16 model's pp wire (exec.c): per slot a send image and a receive image of the boundary in
   * bf16, counted in this runtime's elements (c bytes each) like the rest of comm */
  const double slot_wire = p->n_stages > 1 && p->precision.compute == PLAN_BF16
                           ? 2.0 * boundary * slots * (double)sizeof(bf16) / (double)c : 0.0;
  comm += slot_wire;
  /* the trainer's batch: inputs and targets (ints) of whole sequences, each row's window index (8
   * bytes) */
  double batch_bytes = 2.0 * micro * p->batch.seq * sizeof(int) + (double)micro * sizeof(uint64_t);
  /* context parallelism: the ring's buffers (layout_cp_ring: the transfers' as comm, the blocks'
   * as workspace, sized for the most heads a layer runs on here) and the ids of the rank's rows
   * cut from the batch (host memory, with the batch) */
  double ring_comm = 0;
  if (cp > 1) {
    void *kctx;
    const struct kernel_ops *kt = sizing_table(p, &kctx);
    struct layout_cp_ring z;
    int NH, NKV;
    layout_cp_heads(&r.rank, &NH, &NKV);
    layout_cp_ring(&z, kt, kctx, micro, p->batch.seq, cp, NH, NKV, r.rank.config.head_dim);
    ring_comm = (double)z.comm;
    comm += ring_comm;
    workspace += (double)z.work;
    batch_bytes += (double)z.rows * sizeof(int);
  }

  const double g = bill_element_bytes(p, p->precision.grads);
  const double fp32 = bill_element_bytes(p, PLAN_FP32); /* AdamW's moments */
  /* a bf16 model's copies: whole (zero 0-2), or the shard's (zero 3; each gathered unit's in
   * `gathered`) */
  const double copies = (double)(zero < 3 ? r.t.n_bf16 : is_bf16 ? r.l.n_shard : 0) * sizeof(bf16);
  out->bytes[ALLOC_PARAMS] = params * c + copies + gathered;
  out->bytes[ALLOC_GRADS] = grads_bytes >= 0 ? grads_bytes : grads * g;
  out->bytes[ALLOC_OPTIMIZER] = state * 2.0 * fp32 + (is_bf16 ? weights * c : 0.0);
  /* each slot's token and target ids: ints carved from this runtime's reals */
  out->bytes[ALLOC_ACTIVATIONS] = activations * c + id_reals * (double)sizeof(real) + split_bytes;
  out->bytes[ALLOC_COMM] = comm * c + comm_grads_bytes;
  out->bytes[ALLOC_WORKSPACE] = workspace * c + batch_bytes;
  /* checkpoint.async: the snapshot of the rank's parameters and moments (ckpt.h) */
  if (p->checkpoint.async && p->checkpoint.dir[0])
    out->bytes[ALLOC_CHECKPOINT] = (double)dp_snapshot_elems(r.l.n_elems, r.l.n_shard, zero, is_bf16, dp_ranks(p)) * fp32;
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++) out->total += out->bytes[k];
  if (!cpu) { /* a device of its own: what stays in host memory (bill.host) */
    out->host[ALLOC_WORKSPACE] = batch_bytes;
    out->host[ALLOC_CHECKPOINT] = out->bytes[ALLOC_CHECKPOINT];
    for (int k = 0; k < ALLOC_N_CATEGORIES; k++) out->host_total += out->host[k];
  }
  bill_held_between_steps(p, &r, c, g, slot_grads + slot_wire + ring_comm, out);
  out->n_slots = slots;
  for (int i = 0; i < r.t.n; i++) out->n_params += (long long)r.t.p[i].n_elems;
  rank_view_free(&r);
  return 0;
}

/* ---- the traffic of a step ---- */

const char *traffic_group_name(enum traffic_group g)
{
  static const char *const names[] = { "tp", "dp", "pp", "embed", "ep", "edp", "cp" };
  return g < TRAFFIC_N_GROUPS ? names[g] : "?";
}

static void count(struct traffic *t, enum traffic_group g, enum comm_op op, unsigned long long calls,
                  unsigned long long bytes)
{
  t->calls[g][op] += calls;
  t->bytes[g][op] += bytes;
}

int bill_rank_params(const struct plan *p, int pp_rank, double *n_elems, double *expert_elems, char *err,
                     size_t err_size)
{
  struct layout_rank rank;
  struct layout_params t;
  *n_elems = *expert_elems = 0;
  if (outline_table(p, pp_rank, &rank, &t, err, err_size))
    return 1;
  for (int i = 0; i < t.n; i++) {
    *n_elems += (double)t.p[i].n_elems;
    *expert_elems += t.p[i].expert >= 0 ? (double)t.p[i].n_elems : 0.0;
  }
  layout_params_free(&t);
  layout_rank_free(&rank);
  return 0;
}

int bill_grads_bf16(const struct plan *p)
{
  return p->precision.compute == PLAN_BF16 && p->precision.grads == PLAN_BF16;
}

double bill_element_bytes(const struct plan *p, enum plan_dtype d)
{
  const int this_runtime = plan_on_cpu(p); /* the CPU's reals; a cuda plan's sizes as written */
  return d == PLAN_FP32 && this_runtime ? (double)sizeof(real) : plan_dtype_bytes(d);
}

double traffic_element_bytes(const struct plan *p, enum plan_dtype d)
{
  (void)d; /* the runtime's tensors move as its reals (COMM_REAL), whatever the plan computes in: this
            * build's on the CPU, fp32 on a GPU (its bf16 mode keeps fp32 activations and gradients) */
  return plan_on_cpu(p) ? (double)sizeof(real) : plan_dtype_bytes(PLAN_FP32);
}

double traffic_wire_element_bytes(const struct plan *p)
{
  return p->precision.compute == PLAN_BF16 ? (double)sizeof(bf16) : traffic_element_bytes(p, p->precision.compute);
}

double traffic_tp_element_bytes(const struct plan *p, const struct tp_comm *c)
{
  return c->act ? traffic_wire_element_bytes(p) : traffic_element_bytes(p, p->precision.compute);
}

int traffic_predict(const struct plan *p, int pp_rank, struct traffic *out, char *err, size_t err_size)
{
  return traffic_predict_shared(p, NULL, pp_rank, out, err, err_size);
}

int traffic_predict_shared(const struct plan *p, const struct bill_shared *sh, int pp_rank, struct traffic *out,
                           char *err, size_t err_size)
{
  return traffic_predict_cp(p, sh, pp_rank, 0, out, err, err_size);
}

/* The ring attention's messages of one layer's forward (backward 0) or backward (1) on cp rank
 * me (runtime/parallel/cp.c): cp − 1 hops, each sending the k and v of the pair held (rank
 * me − s's) and receiving the next (rank me − s − 1's); backward, besides, cp hops of the dk | dv
 * accumulator, one message each way. kv(x): B · (rank x's tokens) · NKV · HS elements. */
static void ring_traffic(struct traffic *t, int B, int T, int cp, int me, int NKV, int HS, unsigned long long eb,
                         int backward)
{
  for (int s = 0; s < cp; s++) {
    const unsigned long long held = (unsigned long long)B * attention_cp_rank_tokens(T, cp, (me - s + cp) % cp) *
                                    NKV * HS * eb;
    const unsigned long long next = (unsigned long long)B *
                                    attention_cp_rank_tokens(T, cp, (me - s - 1 + cp) % cp) * NKV * HS * eb;
    if (s < cp - 1) {
      count(t, TRAFFIC_CP, COMM_SEND, 2, 2 * held);
      count(t, TRAFFIC_CP, COMM_RECV, 2, 2 * next);
    }
    if (backward) {
      count(t, TRAFFIC_CP, COMM_SEND, 1, 2 * held);
      count(t, TRAFFIC_CP, COMM_RECV, 1, 2 * next);
    }
  }
}

int traffic_predict_cp(const struct plan *p, const struct bill_shared *sh, int pp_rank, int cp_rank,
                       struct traffic *out, char *err, size_t err_size)
{
  /* traffic_element_bytes: activations and parameters in precision.compute, gradients in
   * precision.grads (on the CPU both the runtime's reals) */
  const unsigned long long eb = (unsigned long long)traffic_element_bytes(p, p->precision.compute);
  const unsigned long long egrad = bill_grads_bf16(p) ? sizeof(bf16)
                                                     : (unsigned long long)traffic_element_bytes(p, p->precision.grads);
  /* the weights' gathers after the update (zero 1, 2) and of ZeRO-3's units: a bf16 model's
   * copies, in bf16 */
  const unsigned long long ew = p->precision.compute == PLAN_BF16 ? sizeof(bf16) : eb;
  memset(out, 0, sizeof *out);
  struct rank_view r;
  if (rank_view(p, sh, pp_rank, &r, err, err_size))
    return 1;
  const int tp = p->mesh.tp, dp = dp_ranks(p), pp = p->mesh.pp, M = p->batch.microbatches;
  const int L = p->model.n_layers, cp = p->mesh.cp > 1 ? p->mesh.cp : 1;
  /* this cp rank's tokens of each sequence (its two chunks), every token without cp */
  const int T = cp > 1 ? attention_cp_rank_tokens(p->batch.seq, cp, cp_rank) : p->batch.seq;
  /* tp: the conversions of this rank's layers, per micro-batch; the norm's partial sums */
  if (tp > 1) {
    int n = tp_comm_list(p, p->batch.micro, T, NULL, 0);
    struct tp_comm *list = calloc((size_t)n, sizeof *list);
    if (!list) {
      rank_view_free(&r);
      return errf(err, err_size, "out of memory");
    }
    tp_comm_list(p, p->batch.micro, T, list, n);
    for (int i = 0; i < n; i++) {
      int ly = list[i].layer;
      if (ly < 0 ? !r.rank.embed_here : ly >= L ? !r.rank.head_here : !r.rank.layer_here[ly])
        continue;
      count(out, TRAFFIC_TP, (enum comm_op)list[i].comm, (unsigned long long)M,
            (unsigned long long)M * (unsigned long long)list[i].n_elems *
              (unsigned long long)traffic_tp_element_bytes(p, &list[i]));
    }
    free(list);
    count(out, TRAFFIC_TP, COMM_ALL_GATHER, 1, 8u * (unsigned long long)tp);
  }
  /* dp: the buckets, ZeRO's gathers, the loss and norm sums (doubles gathered); with expert
   * parallelism the expert buckets over the edp group (dp / ep ranks) instead (dp.h) */
  const int ep = p->model.moe.experts > 0 ? plan_ep(p) : 1;
  struct zero_grads zg = { 0 }; /* zero ≥ 2: the step's reduce-scatters, the expert buckets' counted apart */
  if (dp > 1 && p->zero >= 2 &&
      zero_grads_replay(p, r.list, &r.l, p->zero_every.grads == PLAN_ZERO_EVERY_STEP, &zg, err, err_size)) {
    rank_view_free(&r);
    return 1;
  }
  for (int expert = 0; expert <= (ep > 1); expert++) {
    const int size = expert ? dp / ep : dp;
    const enum traffic_group grp = expert ? TRAFFIC_EDP : TRAFFIC_DP;
    if (size <= 1)
      continue;
    unsigned long long nb = 0, all = 0;
    for (int b = 0; b < r.l.n_buckets; b++)
      if (r.l.buckets[b].expert == expert) {
        nb++;
        all += r.l.buckets[b].n_elems;
      }
    if (p->zero < 2) {
      count(out, grp, COMM_ALL_REDUCE, nb, all * egrad);
    } else { /* the units each backward (or each stage's last) finishes, bucket by bucket */
      const unsigned long long calls = expert ? zg.expert_calls : zg.calls - zg.expert_calls;
      const unsigned long long elems = expert ? zg.expert_elems : zg.elems - zg.expert_elems;
      count(out, grp, COMM_REDUCE_SCATTER, calls, elems * egrad);
    }
    if (p->zero == 1 || p->zero == 2)
      count(out, grp, COMM_ALL_GATHER, nb, all * ew);
    if (p->zero == 3) {
      unsigned long long calls = 0, elems = 0;
      size_t peak;
      if (zero3_replay(p, r.list, &r.l, NULL, 1, ep > 1 ? expert : -1, &calls, &elems, &peak, err, err_size)) {
        rank_view_free(&r);
        return 1;
      }
      count(out, grp, COMM_ALL_GATHER, calls, elems * ew);
    }
  }
  if (dp > 1)
    count(out, TRAFFIC_DP, COMM_ALL_GATHER, 2, 2u * 8u * (unsigned long long)dp);
  /* pp: the schedule's messages, the loss from the last stage, the norm's sums */
  if (pp > 1) {
    const unsigned long long boundary = (unsigned long long)p->batch.micro *
      (unsigned long long)(tp > 1 && p->sequence_parallel ? T / tp : T) *
      (unsigned long long)p->model.dim * (unsigned long long)traffic_wire_element_bytes(p);
    const struct sched_list *list = r.list;
    for (int i = 0; i < list->n; i++) {
      int op = list->instr[i].op;
      if (op == SCHED_SEND_ACT || op == SCHED_SEND_GRAD)
        count(out, TRAFFIC_PP, COMM_SEND, 1, boundary);
      else if (op == SCHED_RECV_ACT || op == SCHED_RECV_GRAD)
        count(out, TRAFFIC_PP, COMM_RECV, 1, boundary);
    }
    count(out, TRAFFIC_PP, COMM_BROADCAST, 1, 8);
    count(out, TRAFFIC_PP, COMM_ALL_GATHER, 1, 8u * (unsigned long long)pp);
    const int first = p->stages[0].pp_rank, last = p->stages[p->n_stages - 1].pp_rank;
    /* the tied embedding's gradient between the stages: whole (zero 0, 1), or the rank's share of
     * its bucket (zero 2, 3) */
    const unsigned long long tied = p->zero >= 2 ? r.l.buckets[r.l.param_bucket[0]].share : r.t.p[0].n_elems;
    if (p->model.tie_embeddings && (pp_rank == first || pp_rank == last))
      count(out, TRAFFIC_EMBED, COMM_ALL_REDUCE, 1, tied * egrad);
  }
  /* cp: the ring of every layer here, per micro-batch: its forward, again in backward where the
   * layer's recompute discards the attention's core (recompute_pieces, model_passes.c), and its
   * backward. With T % (2 · cp) ≠ 0 the cp ranks hold different counts of tokens, and each is
   * predicted for its own (cp_rank). */
  if (cp > 1)
    for (int l = 0; l < L; l++) {
      if (!r.rank.layer_here[l])
        continue;
      struct model_layer_dims d;
      layout_layer_dims(&r.rank, l, &d);
      const uint8_t rc = p->layers[l].recompute;
      const int forwards = 1 + ((rc & (PLAN_RC_ATTN | PLAN_RC_ATTN_CORE)) != 0);
      for (int m = 0; m < M; m++) {
        for (int f = 0; f < forwards; f++)
          ring_traffic(out, p->batch.micro, p->batch.seq, cp, cp_rank, d.NKVl, r.rank.config.head_dim, eb, 0);
        ring_traffic(out, p->batch.micro, p->batch.seq, cp, cp_rank, d.NKVl, r.rank.config.head_dim, eb, 1);
      }
    }
  /* ep: the sparse layers' all-to-alls (the runtime's model_moe.c), the row-count exchange included */
  unsigned long long ep_calls, ep_bytes;
  plan_ep_step_traffic(p, pp_rank, traffic_wire_element_bytes(p), &ep_calls, &ep_bytes);
  if (ep_calls) {
    count(out, TRAFFIC_EP, COMM_ALL_TO_ALL, ep_calls, ep_bytes);
    out->summed_only[TRAFFIC_EP] = !plan_ep_exchange(p).padded;
  }
  rank_view_free(&r);
  return 0;
}
