/* The executor (exec.h): runs this rank's list of the plan's schedule. */
#include "runtime/parallel/exec.h"

#include <stdlib.h>
#include <string.h>

#include "kernels.h" /* attention_cp_rank_tokens */
#include "comm/comm.h"
#include "runtime/parallel/dcomm.h"
#include "runtime/model/alloc.h"
#include "runtime/parallel/dp.h"
#include "runtime/model/model.h"
#include "layout/acts.h"
#include "layout/bill.h"
#include "layout/pieces.h"
#include "util/err.h"

static void failed(struct exec *pp, const char *what)
{
  fault_set(FAULT_OF(pp), FAULT_LEVEL_EXEC, "pipeline %s: %s", what, comm_error());
}

/* Floats of a stage boundary's activation (or its gradient): B × Th × C, Th the home rows of this
 * rank's tokens (under mesh.cp its chunks of the T-long sequence). */
static size_t boundary_elems(const struct exec_env *t, int B, int T)
{
  const struct model *m = t->model;
  if (m->cp.size > 1)
    T = attention_cp_rank_tokens(T, m->cp.size, m->cp.rank); /* a pp peer has the same cp rank */
  return (size_t)B * model_home_T(m, T) * m->config.dim;
}

/* A split list's held areas (struct exec_split): as many as micro-batches past B at once, each
 * sized for the largest of this rank's stages, as the bill counts them (bill_split_held_bytes:
 * layout_split_held_elems in the products' operand dtype). */
static int split_open(struct exec *pp, const struct sched_list *list, char *err, size_t err_size)
{
  const struct plan *p = pp->env.plan;
  const struct model *m = pp->env.model;
  int products = 0;
  for (int s = 0; s < p->n_stages; s++)
    if (p->stages[s].pp_rank == pp->rank && layout_split_products(p, s) > products)
      products = layout_split_products(p, s);
  const double held = bill_split_held_bytes(p, list, pp->rank, &pp->n_splits);
  if (held < 0)
    return errf(err, err_size, "out of memory for the executor");
  const size_t bytes = (size_t)held;
  pp->splits = calloc((size_t)pp->n_splits + 1, sizeof *pp->splits);
  if (!pp->splits)
    return errf(err, err_size, "out of memory for the executor");
  for (int k = 0; k < pp->n_splits; k++) {
    pp->splits[k].stage = pp->splits[k].mb = -1;
    if (model_split_open(&pp->splits[k].s, m, bytes, products))
      return errf(err, err_size, "out of memory for a split backward's held output gradients (%zu bytes)", bytes);
  }
  return 0;
}

/* The held area of (stage, mb): a free one for its B (take), its own for its W. */
static struct exec_split *split_of(struct exec *pp, int stage, int mb, int take)
{
  for (int k = 0; k < pp->n_splits; k++) {
    struct exec_split *h = &pp->splits[k];
    if (take ? h->stage < 0 : h->stage == stage && h->mb == mb) {
      h->stage = stage;
      h->mb = mb;
      return h;
    }
  }
  fault_set(FAULT_OF(pp), FAULT_LEVEL_EXEC, "executor: %s of stage %d at micro-batch %d",
            take ? "every split backward's held area is in use" : "no held area for the W", stage, mb);
  return NULL;
}

int exec_open(struct exec *pp, const struct exec_env *env, struct comm_group *group, char *err, size_t err_size)
{
  memset(pp, 0, sizeof *pp);
  pp->env = *env;
  struct exec_env *t = &pp->env;
  const struct plan *p = t->plan;
  pp->group = group;
  pp->size = group ? group->size : 1;
  pp->rank = group ? group->rank : 0;
  if (pp->size != p->mesh.pp)
    return errf(err, err_size, "mesh.pp = %d, but the pipeline group has %d ranks", p->mesh.pp, pp->size);
  if (sched_from_plan(p, &pp->sched, err, err_size))
    return -1;
  const struct sched_list *list = &pp->sched.ranks[pp->rank];
  const int S = p->n_stages;
  pp->last_bwd = malloc((size_t)S * sizeof *pp->last_bwd);
  if (!pp->last_bwd)
    return errf(err, err_size, "out of memory for the executor");
  for (int s = 0; s < S; s++) pp->last_bwd[s] = -1;
  for (int i = 0; i < list->n; i++) {
    pp->n_reduce += list->instr[i].op == SCHED_REDUCE_GRADS;
    if (list->instr[i].op == SCHED_BWD || list->instr[i].op == SCHED_BWD_W) /* where gradients are final */
      pp->last_bwd[list->instr[i].stage] = list->instr[i].mb;
  }
  if (pp->sched.split && split_open(pp, list, err, err_size))
    return -1;

  pp->in_index = calloc((size_t)S, sizeof *pp->in_index);
  int *per_stage = calloc((size_t)S, sizeof *per_stage);
  if (!pp->in_index || !per_stage) {
    free(per_stage);
    return errf(err, err_size, "out of memory for the executor");
  }
  for (int s = 1; s < S; s++) pp->in_index[s] = pp->in_index[s - 1] + p->stages[s - 1].n_layers;
  pp->flops = malloc((size_t)S * 2 * sizeof *pp->flops);
  if (!pp->flops) {
    free(per_stage);
    return errf(err, err_size, "out of memory for the executor");
  }
  for (int s = 0; s < S; s++)
    for (int b = 0; b < 2; b++) pp->flops[2 * s + b] = plan_stage_micro_batch_flops(p, s, b);
  pieces_stage_slots(p, &pp->sched, pp->rank, per_stage);
  for (int s = 0; s < S; s++) pp->n_slots += per_stage[s];
  pp->slots = calloc((size_t)pp->n_slots, sizeof *pp->slots);
  if (!pp->slots) {
    free(per_stage);
    return errf(err, err_size, "out of memory for the executor");
  }

  const int micro = p->batch.micro, seq = p->batch.seq;
  int k = 0, first_here = 1;
  for (int s = 0; s < S; s++)
    for (int j = 0; j < per_stage[s]; j++, k++) {
      struct exec_slot *sl = &pp->slots[k];
      sl->pool = s;
      sl->stage = sl->mb = -1;
      const struct plan_stage *st = &p->stages[s];
      struct model_acts_scope scope = { st->first_layer, st->n_layers, st->has_embed, st->has_head };
      if (first_here) { /* the owner's own set: all of this rank's layers */
        first_here = 0;
        sl->acts = t->acts;
      } else {
        sl->acts = calloc(1, sizeof *sl->acts);
        if (!sl->acts || model_acts_create_slot(sl->acts, t->model, t->acts, &scope, err, err_size)) {
          free(per_stage);
          free(sl->acts);
          sl->acts = NULL;
          return err[0] ? -1 : errf(err, err_size, "out of memory for an activation slot");
        }
      }
      /* the boundary, sized for the most rows a cp rank holds (layout_cp_rows), as the activations
       * are: every cp rank allocates the same, the bill's figure; its gradient, and a bf16 model's
       * send and receive images of it (the pp wire) */
      const size_t n = (size_t)micro * model_home_T(t->model, layout_cp_rows(seq, t->model->cp.size)) *
                       t->model->config.dim;
      sl->grad = S > 1 ? alloc_reals_on(t->model->device, ALLOC_COMM, n) : NULL;
      if (S > 1 && t->model->bf16)
        sl->wire = alloc_bytes_on(t->model->device, ALLOC_COMM, 2 * n * sizeof(bf16));
      if (S > 1 && (!sl->grad || (t->model->bf16 && !sl->wire))) {
        free(per_stage);
        return errf(err, err_size, "out of memory for an activation slot");
      }
    }
  free(per_stage);

  if (p->model.tie_embeddings && pp->size > 1) {
    /* The embedding lives on the first stage and, as the head, on the last: their gradients are
     * summed between the two (every pp rank takes part in the split). */
    const int first = p->stages[0].pp_rank, last = p->stages[S - 1].pp_rank;
    int member = pp->rank == first || pp->rank == last;
    struct comm_group *g = NULL;
    if (comm_group_split(group, member ? 0 : 1, pp->rank, "embed", &g, err, err_size))
      return -1;
    pp->embed = member ? g : NULL;
  }
  return 0;
}

void exec_close(struct exec *pp)
{
  for (int k = 0; pp->slots && k < pp->n_slots; k++) {
    struct exec_slot *sl = &pp->slots[k];
    if (k > 0 && sl->acts) {
      model_acts_free(sl->acts);
      free(sl->acts);
    }
    alloc_free(sl->grad);
    alloc_free(sl->wire);
  }
  free(pp->slots);
  for (int k = 0; pp->splits && k < pp->n_splits; k++) model_split_close(&pp->splits[k].s);
  free(pp->splits);
  free(pp->in_index);
  free(pp->flops);
  free(pp->last_bwd);
  sched_free(&pp->sched);
  memset(pp, 0, sizeof *pp);
}

static struct exec_slot *slot_of(struct exec *pp, int stage, int mb)
{
  for (int k = 0; k < pp->n_slots; k++)
    if (pp->slots[k].stage == stage && pp->slots[k].mb == mb)
      return &pp->slots[k];
  return NULL;
}

/* A free slot for (stage, mb): one whose sends are done if there is one, else the first free one
 * once its sends are. */
static struct exec_slot *slot_take(struct exec *pp, int stage, int mb)
{
  struct exec_slot *pick = NULL;
  int used = 0;
  for (int k = 0; k < pp->n_slots; k++) {
    struct exec_slot *sl = &pp->slots[k];
    if (sl->stage >= 0) {
      used++;
      continue;
    }
    if (sl->pool != stage)
      continue;
    int done_act = 1, done_grad = 1;
    if (sl->send_act && comm_test(&sl->send_act, &done_act))
      failed(pp, "send");
    if (sl->send_grad && comm_test(&sl->send_grad, &done_grad))
      failed(pp, "send");
    if (!pick || (done_act && done_grad && (pick->send_act || pick->send_grad)))
      pick = sl;
  }
  if (!pick) { /* the slots are counted from this rank's list: a schedule that needs more is a bug */
    fault_set(FAULT_OF(pp), FAULT_LEVEL_EXEC, "executor: every activation slot of stage %d is in use at micro-batch %d", stage, mb);
    return NULL;
  }
  if (pick->send_act && comm_wait(&pick->send_act))
    failed(pp, "send of activations");
  if (pick->send_grad && comm_wait(&pick->send_grad))
    failed(pp, "send of gradients");
  pick->stage = stage;
  pick->mb = mb;
  used++;
  pp->peak_slots = used > pp->peak_slots ? used : pp->peak_slots;
  return pick;
}

static void slot_wait_recv(struct exec *pp, struct exec_slot *sl)
{
  if (sl->recv && comm_wait(&sl->recv))
    failed(pp, "receive");
  if (sl->recv_to) { /* the pp wire: what arrived, widened where the receive was for */
    const struct model *m = pp->env.model;
    m->k->widen_bf16(m->kctx, sl->recv_to, sl->wire + sl->recv_n, sl->recv_n);
    sl->recv_to = NULL;
  }
}

/* A boundary tensor of n elements sent from the slot: as it is, or on the pp wire (a bf16 model)
 * rounded to bf16 once into the slot's send image, whose previous send must be done first. */
static int slot_send(struct exec *pp, struct exec_slot *sl, const real *x, size_t n, int peer,
                     struct comm_request **req)
{
  const struct model *m = pp->env.model;
  if (!sl->wire)
    return dcomm_send(DCOMM_OF(m), pp->group, x, n, COMM_REAL, peer, req);
  struct comm_request **other = req == &sl->send_act ? &sl->send_grad : &sl->send_act;
  if (*other && comm_wait(other))
    failed(pp, "send");
  m->k->round_bf16(m->kctx, sl->wire, x, n);
  return dcomm_send(DCOMM_OF(m), pp->group, sl->wire, n, COMM_BF16, peer, req);
}

/* A boundary tensor of n elements received into x: directly, or on the pp wire into the slot's
 * receive image, widened into x by slot_wait_recv. */
static int slot_recv(struct exec *pp, struct exec_slot *sl, real *x, size_t n, int peer)
{
  const struct model *m = pp->env.model;
  if (!sl->wire)
    return dcomm_recv(DCOMM_OF(m), pp->group, x, n, COMM_REAL, peer, &sl->recv);
  sl->recv_to = x;
  sl->recv_n = n;
  return dcomm_recv(DCOMM_OF(m), pp->group, sl->wire + n, n, COMM_BF16, peer, &sl->recv);
}

/* Ends every send and receive in flight and frees the slots. */
static void drain(struct exec *pp)
{
  for (int k = 0; k < pp->n_slots; k++) {
    struct exec_slot *sl = &pp->slots[k];
    if ((sl->send_act && comm_wait(&sl->send_act)) || (sl->send_grad && comm_wait(&sl->send_grad)) ||
        (sl->recv && comm_wait(&sl->recv)))
      failed(pp, "send or receive");
    sl->stage = sl->mb = -1;
    sl->recv_to = NULL;
  }
}

/* The backend's pending failure (a GPU's asynchronous fault, which no kernel call returns),
 * asked once per step when its compute is done: recorded as the step's failure, so the
 * optimizer hook applies no update and the step fails with the backend's message. */
static void check_backend(struct exec *pp)
{
  const struct model *m = pp->env.model;
  char why[FAULT_MSG_MAX];
  if (m->k->status(m->kctx, why, sizeof why))
    fault_set(FAULT_OF(pp), FAULT_LEVEL_EXEC, "%s", why);
}

/* The loss from the rank holding the last stage, as the same bits everywhere. */
static void share_loss(struct exec *pp, double *loss)
{
  const struct plan *p = pp->env.plan;
  if (pp->size > 1 && comm_broadcast(pp->group, loss, 1, COMM_INT64, p->stages[p->n_stages - 1].pp_rank, NULL))
    failed(pp, "broadcast of the loss");
}

double exec_step(struct exec *pp, int (*optimizer)(void *ctx, double loss), void *ctx, int *hook_rc)
{
  struct exec_env *t = &pp->env;
  const long long step = *t->step;
  const struct plan *p = t->plan;
  struct model *m = t->model;
  const int B = p->batch.micro, T = p->batch.seq;
  const size_t n_boundary = boundary_elems(t, B, T);
  const real loss_scale = (real)(1.0 / ((double)p->batch.global * T));
  const struct sched_list *list = &pp->sched.ranks[pp->rank];
  double loss = 0.0;
  int reduced = 0;
  if (hook_rc)
    *hook_rc = 0;
  pp->peak_slots = 0;
  dp_step_begin(t->dp, step);
  for (int i = 0; i < list->n; i++) {
    const struct sched_instr *in = &list->instr[i];
    struct exec_slot *sl;
    comm_set_step(step, in->mb);
    switch ((enum sched_op)in->op) {
    case SCHED_FWD:
    case SCHED_BWD:
    case SCHED_BWD_B:
    case SCHED_BWD_W: {
      /* a split backward's B is BWD's gradients less the weights', which its W computes later
       * from what B held (struct model_split); W needs no gradient received or sent */
      const int bwd = in->op != SCHED_FWD, w_half = in->op == SCHED_BWD_W;
      const struct plan_stage *st = &p->stages[in->stage];
      sl = slot_of(pp, in->stage, in->mb);
      if (!sl && (bwd || !(sl = slot_take(pp, in->stage, in->mb)))) {
        if (bwd) /* a list sched_check passed never does this */
          fault_set(FAULT_OF(pp), FAULT_LEVEL_EXEC, "executor: %s(stage %d, mb %d) has no activations",
                    sched_op_name(in->op), in->stage, in->mb);
        i = list->n; /* the list stops here; the step returns the failure */
        break;
      }
      struct exec_split *held = NULL;
      if (in->op == SCHED_BWD_B || w_half) {
        if (!(held = split_of(pp, in->stage, in->mb, !w_half))) {
          i = list->n;
          break;
        }
        held->s.phase = w_half ? MODEL_SPLIT_W : MODEL_SPLIT_B;
        if (!w_half) {
          held->s.used = 0;
          held->s.n_products = 0;
        }
        sl->acts->split = &held->s;
      }
      if (!w_half && (!bwd || !st->has_head))
        slot_wait_recv(pp, sl);
      struct model_dropout dropout = { (real)p->model.dropout, t->dropout_seed, (uint32_t)step, t->samples };
      if (!bwd)
        t->micro_batch(t->ctx, in->mb, t->inputs, t->targets, t->samples);
      else if (!w_half && !st->has_head)
        m->k->copy(m->kctx, sl->acts->dresidual, sl->grad, n_boundary * sizeof(real));
      const struct sched_instr *after = pieces_follower(list, i);
      struct piece then;
      if (after)
        then = pieces_first(p, after);
      /* the stage's gradients are final after its last BWD, or on a split list its last W */
      const int last = (in->op == SCHED_BWD || w_half) && in->mb == pp->last_bwd[in->stage];
      const struct dp_pass pass = { st, bwd, sl->acts, t->inputs, st->has_head ? t->targets : NULL, &dropout, B, T, loss_scale,
                                    last, pp->embed != NULL, 1 };
      const double t0 = comm_now();
      loss += dp_run_pass(t->dp, &pass, after ? &then : NULL);
      sl->acts->split = NULL;
      if (held && w_half)
        held->stage = held->mb = -1;
      if (t->dp->aborted) { /* a round of the step's buffers failed, on every rank alike */
        i = list->n;
        break;
      }
      if (w_half || (in->op == SCHED_BWD && st->has_embed))
        sl->stage = sl->mb = -1; /* nothing to send back, or (W) sent by now */
      else if (bwd && !st->has_embed)
        m->k->copy(m->kctx, sl->grad, sl->acts->dresidual, n_boundary * sizeof(real));
      const double share = pp->sched.costs.w_share ? pp->sched.costs.w_share[in->stage] : 0.5;
      const double flops = pp->flops[2 * in->stage + bwd] * (w_half ? share : in->op == SCHED_BWD_B ? 1 - share : 1);
      comm_trace_work(!bwd ? "forward" : w_half ? "backward W" : in->op == SCHED_BWD_B ? "backward B" : "backward",
                      in->stage, in->mb, flops, t0, comm_now());
      break;
    }
    case SCHED_RECOMPUTE: /* done layer by layer inside the BWD that follows */
      break;
    case SCHED_SEND_ACT:
      sl = slot_of(pp, in->stage, in->mb);
      if (slot_send(pp, sl, sl->acts->residual[pp->in_index[in->stage] + p->stages[in->stage].n_layers], n_boundary,
                    in->peer, &sl->send_act))
        failed(pp, "send of activations");
      break;
    case SCHED_RECV_ACT:
      if (!(sl = slot_take(pp, in->stage + 1, in->mb))) {
        i = list->n;
        break;
      }
      if (slot_recv(pp, sl, sl->acts->residual[pp->in_index[in->stage + 1]], n_boundary, in->peer))
        failed(pp, "receive of activations");
      break;
    case SCHED_SEND_GRAD:
      sl = slot_of(pp, in->stage, in->mb);
      if (slot_send(pp, sl, sl->grad, n_boundary, in->peer, &sl->send_grad))
        failed(pp, "send of gradients");
      if (!pp->sched.split) /* a split backward's W still reads the slot, and frees it */
        sl->stage = sl->mb = -1;
      break;
    case SCHED_RECV_GRAD:
      sl = slot_of(pp, in->stage - 1, in->mb);
      if (slot_recv(pp, sl, sl->grad, n_boundary, in->peer))
        failed(pp, "receive of gradients");
      break;
    case SCHED_REDUCE_GRADS:
      if (++reduced < pp->n_reduce)
        break;
      dp_reduce_rest(t->dp, pp->embed); /* with the tied embedding's sum between the stages */
      if (t->dp->aborted)
        i = list->n; /* no update after a failed round */
      break;
    case SCHED_OPTIMIZER:
      drain(pp);
      check_backend(pp);
      share_loss(pp, &loss);
      if (optimizer) {
        int rc = optimizer(ctx, loss);
        if (hook_rc)
          *hook_rc = rc;
      }
      break;
    case SCHED_N_ALL_OPS:
      break;
    }
  }
  drain(pp); /* after a list that stopped early; a no-op after OPTIMIZER */
  if (t->dp->aborted)
    dp_pass_abort(t->dp);
  return loss;
}

double exec_forward(struct exec *pp, const int *tokens, const int *targets, int B, int T)
{
  struct exec_env *t = &pp->env;
  const struct plan *p = t->plan;
  const int S = p->n_stages;
  const size_t n = boundary_elems(t, B, T);
  struct model_acts *a = t->acts;
  double loss = 0.0;
  for (int s = 0; s < S; s++) {
    const struct plan_stage *st = &p->stages[s];
    if (st->pp_rank != pp->rank)
      continue;
    if (s > 0 && dcomm_recv(DCOMM_OF(t->model), pp->group, a->residual[pp->in_index[s]], n, COMM_REAL,
                            p->stages[s - 1].pp_rank, NULL))
      failed(pp, "receive of activations");
    const struct dp_pass pass = { st, 0, a, tokens, targets, NULL, B, T, 0, 0, 0, 0 };
    loss += dp_run_pass(t->dp, &pass, NULL);
    if (t->dp->aborted) { /* every rank stops here (ZeRO-3 rounds span the world; no stages) */
      dp_pass_abort(t->dp);
      return 0.0;
    }
    if (s + 1 < S && dcomm_send(DCOMM_OF(t->model), pp->group, a->residual[pp->in_index[s] + st->n_layers], n, COMM_REAL,
                                p->stages[s + 1].pp_rank, NULL))
      failed(pp, "send of activations");
  }
  if (targets)
    share_loss(pp, &loss);
  return loss;
}

void exec_argmax(struct exec *pp, const int *rows, int n, int *out)
{
  struct exec_env *t = &pp->env;
  const struct plan *p = t->plan;
  const int last = p->stages[p->n_stages - 1].pp_rank;
  if (pp->rank == last)
    model_head_argmax(t->model, t->acts, rows, n, out);
  if (pp->size > 1 && comm_broadcast(pp->group, out, (size_t)n, COMM_INT32, last, NULL))
    failed(pp, "broadcast of the decoded tokens");
}
