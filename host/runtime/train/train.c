/* The trainer object (train.h): set-up from a compiled plan, one training step, evaluation. */
#include "runtime/train/train.h"

#include <float.h>
#include <omp.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "data/text_cache.h"
#include "mesh/mesh.h"
#include "kernels.h"
#include "ops.h"
#include "layout/supported.h"
#include "runtime/model/alloc.h"
#include "runtime/model/backend.h"
#include "layout/bill.h"
#include "runtime/state/ckpt.h"
#include "runtime/train/threads_adapt.h"
#include "runtime/model/model_cp.h"
#include "runtime/model/weights.h"
#include "runtime/parallel/dcomm.h"
#include "util/err.h"

/* The backend's pending failure (its status entry), recorded as the trainer's: asked before a
 * result leaves the device, so nothing read back after a failed call is handed out. 1 when the
 * trainer holds a failure (this one or an earlier). */
static int backend_failed(struct trainer *t)
{
  char why[FAULT_MSG_MAX];
  if (t->model.k && t->model.k->status(t->model.kctx, why, sizeof why))
    fault_set(&t->fault, FAULT_LEVEL_EXEC, "%s", why);
  return trainer_failed(t) != NULL;
}

/* The executor's way to a micro-batch (exec_env). */
static void fill_micro_batch(void *ctx, int mb, int *inputs, int *targets, uint64_t *samples)
{
  trainer_micro_batch(ctx, mb, inputs, targets, samples);
}

static int open_on_device(struct trainer *t, const struct plan *p, struct comm_group *const *groups,
                          char *err, size_t err_size);

/* The plan's comm resolved for this trainer's kernel table (dcomm_choose). Whether any rank shares
 * its GPU with another is agreed over the world, so every rank chooses alike. 0, or −1 with the
 * refusal in err. */
static int choose_comm(struct trainer *t, const struct plan *p, enum dcomm_mode *mode, char *err, size_t err_size)
{
  const struct kernel_ops *ops = kernels_active();
  struct dcomm_facts f = { ops->name, ops->host_visible, t->device.cuda, comm_stream_built(), 1 };
  if (t->device.cuda) {
    const int local = comm_world() ? comm_local_size() : 1, n = t->device.count > 0 ? t->device.count : 1;
    f.ranks_per_gpu = (local + n - 1) / n;
    int first = INT_MAX;
    if (t->world && t->world->size > 1 &&
        comm_world_first_failed(f.ranks_per_gpu > 1, "ranks per GPU", &first, err, err_size))
      return -1;
    if (first != INT_MAX && f.ranks_per_gpu < 2)
      f.ranks_per_gpu = 2; /* another node's ranks share one */
  }
  return dcomm_choose(p, &f, mode, err, err_size) ? -1 : 0;
}

/* An NCCL communicator for g (NULL: none to open), remembered for close. Collective over g. */
static int open_nccl(struct trainer *t, struct comm_group *g, char *err, size_t err_size)
{
  if (!g)
    return 0;
  if (t->n_nccl == (int)(sizeof t->nccl / sizeof t->nccl[0]))
    return errf(err, err_size, "NCCL: more groups than the trainer keeps");
  if (comm_stream_open(g, err, err_size))
    return -1;
  t->nccl[t->n_nccl++] = g;
  return 0;
}

/* The selection (kernel table, context, allocator device) is put back as it was on return:
 * a CUDA trainer's model keeps its own (m->k, m->kctx, m->device). */
int trainer_open(struct trainer *t, const struct plan *p, struct comm_group *const *groups,
                 char *err, size_t err_size)
{
  const struct kernel_ops *ops = kernels_active();
  void *ctx = kernels_active_context();
  const int current = alloc_current_device();
  const int rc = open_on_device(t, p, groups, err, err_size);
  kernels_use(ops, ctx);
  alloc_use_device(current);
  return rc;
}

static int open_on_device(struct trainer *t, const struct plan *p, struct comm_group *const *groups,
                          char *err, size_t err_size)
{
  memset(t, 0, sizeof *t);
  if (plan_copy(&t->own_plan, p))
    return errf(err, err_size, "out of memory for a copy of the plan"), TRAIN_RUNTIME_ERROR;
  t->plan = p = &t->own_plan; /* the trainer's own: the caller's may go */
  struct comm_group *dp = groups ? groups[PLAN_AXIS_DP] : NULL;
  struct comm_group *tp = groups ? groups[PLAN_AXIS_TP] : NULL;
  struct comm_group *pp = groups ? groups[PLAN_AXIS_PP] : NULL;
  struct comm_group *cp = groups ? groups[PLAN_AXIS_CP] : NULL;
  t->world = groups ? comm_world() : NULL;
  t->dropout_seed = (uint64_t)p->seeds.value[PLAN_SEED_DROPOUT];
  const int micro = p->batch.micro, S = p->batch.seq;
  /* refusals of the plan: what this build cannot run, groups that are not the plan's mesh */
  static const char *const axis_what[PLAN_N_AXES] = { "tensor-parallel", "data-parallel", "pipeline",
                                                       "context-parallel" };
  const int have[PLAN_N_AXES] = { tp ? tp->size : 1, dp ? dp->size : 1, pp ? pp->size : 1, cp ? cp->size : 1 };
  const int want[PLAN_N_AXES] = { p->mesh.tp, p->mesh.dp, p->mesh.pp, p->mesh.cp > 1 ? p->mesh.cp : 1 };
  int refused = trainer_plan_supported(p, err, err_size);
  if (!refused && runtime_device_open(&t->device, p->device, runtime_local_rank(), err, err_size)) {
    plan_free(&t->own_plan);
    memset(t, 0, sizeof *t);
    return TRAIN_RUNTIME_ERROR;
  }
  if (t->device.cuda) /* "auto" is cuda here: the bill and check's rules for the GPU runtime */
    t->own_plan.device = PLAN_DEVICE_CUDA;
  /* comm (plan.h, dcomm_choose): how collectives on the model's memory travel */
  enum dcomm_mode comm_mode = DCOMM_DIRECT;
  if (!refused && choose_comm(t, p, &comm_mode, err, err_size))
    refused = 1;
  for (int a = 0; a < PLAN_N_AXES && !refused; a++) {
    static const int order[PLAN_N_AXES] = { PLAN_AXIS_DP, PLAN_AXIS_TP, PLAN_AXIS_PP, PLAN_AXIS_CP };
    const int x = order[a];
    char field[16];
    snprintf(field, sizeof field, "mesh.%s", plan_axis_name((enum plan_axis)x));
    if (have[x] != want[x])
      refused = errf(err, err_size, "%s: %s = %d, but the %s group has %d rank%s", plan_where(p, field), field,
                     want[x], axis_what[x], have[x], have[x] == 1 ? "" : "s");
  }
  if (refused) {
    runtime_device_close(&t->device);
    plan_free(&t->own_plan);
    memset(t, 0, sizeof *t);
    return TRAIN_PLAN_ERROR;
  }
  /* expert parallelism: ep groups of ep consecutive dp ranks (mesh.ep); the dp ranks holding the
   * same experts (one in every ep group) share their state as a dp group shares the rest */
  const int ep = p->model.moe.experts > 0 ? plan_ep(p) : 1;
  if (ep > 1 && (!dp || dp->size % ep)) {
    errf(err, err_size, "%s: mesh.ep = %d, but the data-parallel group has %d rank%s", plan_where(p, "mesh.ep"),
         ep, dp ? dp->size : 1, dp && dp->size == 1 ? "" : "s");
    goto fail;
  }
  if (model_create_table_tp(&t->model, p, tp, pp ? pp->rank : 0, ep > 1 ? dp->rank % ep : 0, err, err_size))
    goto fail;
  t->model.tp.fault = &t->fault; /* one record of the first failure, for every part */
  if (comm_mode == DCOMM_NCCL && (open_nccl(t, tp, err, err_size) || open_nccl(t, dp, err, err_size) ||
                                  open_nccl(t, pp, err, err_size)))
    goto fail;
  t->model.comm_mode = t->model.tp.comm_mode = (int)comm_mode;
  t->model.comm_stream = t->model.tp.comm_stream = comm_mode == DCOMM_NCCL ? runtime_device_stream(&t->device) : NULL;
  if (ep > 1) {
    if (comm_group_split(dp, dp->rank / ep, dp->rank, "ep", &t->ep, err, err_size) ||
        comm_group_split(dp, dp->rank % ep, dp->rank, "edp", &t->edp, err, err_size))
      goto fail;
    t->model.ep.group = t->ep;
    if (comm_mode == DCOMM_NCCL && (open_nccl(t, t->ep, err, err_size) || open_nccl(t, t->edp, err, err_size)))
      goto fail;
  }
  /* context parallelism: the gradients of a dp rank's cp ranks are summed as those of its dp
   * peers, so the dp layer's group is dp × cp (each parameter's tp and pp coordinates) */
  t->data_rank = dp ? dp->rank : 0;
  t->data_size = dp ? dp->size : 1;
  if (cp && cp->size > 1) {
    int c[PLAN_N_AXES];
    mesh_coords(&p->mesh, t->world->rank, c);
    if (comm_group_split(t->world, c[PLAN_AXIS_TP] + p->mesh.tp * c[PLAN_AXIS_PP], t->world->rank, "dpcp", &t->dpcp,
                         err, err_size))
      goto fail;
  }
  if (dp_open(&t->dp, &t->model, t->dpcp ? t->dpcp : dp, t->edp, p->zero, p->bucket_mb, err, err_size))
    goto fail;
  t->dp.fault = &t->fault;
  if (dp_init_params(&t->dp, p, err, err_size) ||
      model_acts_create(&t->acts, &t->model, micro, cp && cp->size > 1 ? model_cp_max_rows(S, cp->size) : S, err,
                        err_size) ||
      model_cp_open(&t->model, cp, micro, S, err, err_size) ||
      optimizer_create_sized(&t->opt, p, dp_state_elems(&t->dp), err, err_size) ||
      data_source_open(&t->data, p, err, err_size))
    goto fail;
  if (t->data.prompt_tokens + t->data.answer_tokens > TRAIN_MAX_PROBLEM_TOKENS) {
    errf(err, err_size, "data (%s): held-out problems of %d tokens; the evaluator takes at most %d",
         t->data.ops->kind, t->data.prompt_tokens + t->data.answer_tokens, TRAIN_MAX_PROBLEM_TOKENS);
    goto fail;
  }
  t->dp.pp_group = pp;
  t->dp.grads_step = p->zero >= 2 && p->zero_every.grads == PLAN_ZERO_EVERY_STEP;
  t->dp.params_step = p->zero == 3 && p->zero_every.params == PLAN_ZERO_EVERY_STEP;
  /* The step's allocation rounds (dp_passes.c) span the ranks that run the same list: every rank
   * with one pipeline rank; with more, that rank's tp × dp ranks (pipeline ranks reach their
   * rounds at different times, waiting for each other's activations in between). ZeRO 2, 3 and
   * bf16 gradients (each backward piece's unit areas) have rounds. */
  t->dp.agree = t->world;
  if (pp && pp->size > 1 && (p->zero >= 2 || t->model.grads_bf16)) {
    if (comm_group_split(t->world, pp->rank, t->world->rank, "stage", &t->stage, err, err_size))
      goto fail;
    t->dp.agree = t->stage;
  }
  /* host memory: the data source writes them, the passes copy them to the backend */
  t->inputs = alloc_host_bytes(ALLOC_WORKSPACE, (size_t)micro * S * sizeof(int));
  t->targets = alloc_host_bytes(ALLOC_WORKSPACE, (size_t)micro * S * sizeof(int));
  t->samples = alloc_host_bytes(ALLOC_WORKSPACE, (size_t)micro * sizeof(uint64_t));
  if (!t->inputs || !t->targets || !t->samples) {
    errf(err, err_size, "out of memory for the batch buffers");
    goto fail;
  }
  const struct exec_env env = { p, &t->model, &t->dp, &t->acts, t->inputs, t->targets, t->samples,
                                t->dropout_seed, &t->step, fill_micro_batch, t };
  if (exec_open(&t->exec, &env, pp, err, err_size))
    goto fail;
  t->exec.fault = &t->fault;
  if (comm_mode == DCOMM_NCCL && open_nccl(t, t->exec.embed, err, err_size))
    goto fail;
  /* The step's memory, reserved now: the bill is the run's peaks (tests/mpi/mpi_dp_equiv.c). */
  struct bill bill;
  if (bill_predict(p, t->exec.rank, &bill, err, err_size))
    goto fail;
  size_t reserve[ALLOC_N_CATEGORIES];
  /* on the model's device: a cuda plan's host memory (bill.host) is not the device's to reserve */
  for (int k = 0; k < ALLOC_N_CATEGORIES; k++) reserve[k] = (size_t)(bill.bytes[k] - bill.host[k]);
  int over = 0;
  if (alloc_reserve(reserve, &over)) {
    const double mib = 1024.0 * 1024.0;
    errf(err, err_size, "out of memory for the step's %s: the plan's memory bill needs %.2f MiB of them "
         "(%.2f MiB in all), more than the allocator's cap leaves", alloc_category_name(over),
         bill.bytes[over] / mib, bill.total / mib);
    goto fail;
  }
  memcpy(t->reserved, reserve, sizeof reserve);
  return TRAIN_OK;

fail:
  trainer_close(t);
  return TRAIN_RUNTIME_ERROR;
}

int trainer_open_on_world(struct trainer *t, const struct plan *p, char *err, size_t err_size)
{
  struct comm_group *groups[PLAN_N_AXES];
  memset(t, 0, sizeof *t);
  if (comm_build_mesh_groups(&p->mesh, groups, err, err_size))
    return TRAIN_RUNTIME_ERROR;
  int rc = trainer_open(t, p, groups, err, err_size);
  if (rc != TRAIN_OK) {
    char why[256];
    comm_free_mesh_groups(groups, why, sizeof why);
    return rc;
  }
  memcpy(t->own_groups, groups, sizeof groups);
  return TRAIN_OK;
}

int trainer_prepare_text(const struct plan *p, struct comm_group *w, FILE *out, char *err, size_t err_size)
{
  int rc = TRAIN_OK;
  err[0] = '\0';
  if (p->data.n_text && (!w || w->rank == 0)) {
    err_class_reset();
    if (text_cache_prepare(p, out, err, err_size))
      rc = err_class_is_input() ? TRAIN_PLAN_ERROR : TRAIN_RUNTIME_ERROR;
  }
  return comm_agree_err(w, rc, err, err_size, COMM_AGREE_NAME_RANK);
}

/* ---- trainer_replan ----------------------------------------------------------------------- */

/* A replan keeps the model: every field of model = { ... } but the derived ones. */
static int same_model(const struct plan *now, const struct plan *p, char *err, size_t n)
{
  const struct plan_model *a = &now->model, *b = &p->model;
  static const char *const tail = "a replan moves the training state to another layout of the same model";
  if (strcmp(a->family, b->family))
    return errf(err, n, "%s: model.family = \"%s\", but the trainer's model has family \"%s\": %s",
                plan_where(p, "model.family"), b->family, a->family, tail);
  const char *const ints[] = { "n_layers", "dim", "n_heads", "n_kv_heads", "ffn_dim", "vocab", "max_seq",
                               "tie_embeddings" };
  const int ia[] = { a->n_layers, a->dim, a->n_heads, a->n_kv_heads, a->ffn_dim, a->vocab, a->max_seq, a->tie_embeddings };
  const int ib[] = { b->n_layers, b->dim, b->n_heads, b->n_kv_heads, b->ffn_dim, b->vocab, b->max_seq, b->tie_embeddings };
  char field[48];
  for (int i = 0; i < 8; i++)
    if (ia[i] != ib[i]) {
      snprintf(field, sizeof field, "model.%s", ints[i]);
      return errf(err, n, "%s: %s = %d, but the trainer's model has %s = %d: %s", plan_where(p, field), field,
                  ib[i], ints[i], ia[i], tail);
    }
  const char *const moe_ints[] = { "moe.experts", "moe.top_k", "moe.ffn_dim" };
  const int ma[] = { a->moe.experts, a->moe.top_k, a->moe.ffn_dim }, mb[] = { b->moe.experts, b->moe.top_k, b->moe.ffn_dim };
  for (int i = 0; i < 3; i++)
    if (ma[i] != mb[i]) {
      snprintf(field, sizeof field, "model.%s", moe_ints[i]);
      return errf(err, n, "%s: %s = %d, but the trainer's model has %s = %d: %s", plan_where(p, field), field,
                  mb[i], moe_ints[i], ma[i], tail);
    }
  for (int l = 0; l < a->n_layers && now->layers && p->layers; l++)
    if (now->layers[l].moe != p->layers[l].moe)
      return errf(err, n, "%s: layer %d is %s, but the trainer's is %s: %s", plan_where(p, "model.moe.layers"), l,
                  p->layers[l].moe ? "sparse" : "dense", now->layers[l].moe ? "sparse" : "dense", tail);
  const char *const reals[] = { "norm_eps", "rope_theta", "dropout", "moe.aux_loss", "moe.z_loss",
                                "moe.capacity_factor" };
  const double ra[] = { a->norm_eps, a->rope_theta, a->dropout, a->moe.aux_loss, a->moe.z_loss, a->moe.capacity_factor };
  const double rb[] = { b->norm_eps, b->rope_theta, b->dropout, b->moe.aux_loss, b->moe.z_loss, b->moe.capacity_factor };
  for (int i = 0; i < 6; i++)
    if (ra[i] != rb[i]) {
      snprintf(field, sizeof field, "model.%s", reals[i]);
      return errf(err, n, "%s: %s = %.17g, but the trainer's model has %s = %.17g: %s", plan_where(p, field),
                  field, rb[i], reals[i], ra[i], tail);
    }
  return 0;
}

/* TYCHO_REPLAN_LIMIT_MB (MiB; 0: no bound), else TRAINER_REPLAN_LIMIT_BYTES. */
static size_t replan_limit(void)
{
  const char *s = getenv("TYCHO_REPLAN_LIMIT_MB");
  char *end;
  double mb = s && *s ? strtod(s, &end) : -1.0;
  if (!s || !*s || *end || !(mb >= 0.0) || mb > 1e12)
    return TRAINER_REPLAN_LIMIT_BYTES;
  return mb == 0.0 ? 0 : (size_t)(mb * 1024.0 * 1024.0) + (mb * 1048576.0 < 1.0);
}

/* Opens t on p with mesh groups of its own (w NULL: one rank without the comm layer) and loads
 * cm into it. Collective over w and agreed; on failure t is closed (t->plan NULL) on every rank
 * and no group is left. */
static int open_and_load(struct trainer *t, const struct plan *p, struct comm_group *w, struct ckpt_mem *cm,
                         char *err, size_t n)
{
  struct comm_group *groups[PLAN_N_AXES] = { NULL };
  if (w && comm_build_mesh_groups(&p->mesh, groups, err, n)) /* agreed inside */
    return TRAIN_RUNTIME_ERROR;
  int rc = comm_agree_err(w, trainer_open(t, p, w ? groups : NULL, err, n), err, n, COMM_AGREE_NAME_RANK);
  if (rc) {
    if (t->plan) /* opened here, failed elsewhere: close it while the groups are not its own */
      trainer_close(t);
    char why[256];
    if (w)
      comm_free_mesh_groups(groups, why, sizeof why);
    return rc;
  }
  if (w)
    memcpy(t->own_groups, groups, sizeof groups); /* freed at trainer_close, as trainer_open_on_world's */
  if ((rc = comm_agree_err(w, ckpt_mem_load(t, cm, err, n) ? TRAIN_RUNTIME_ERROR : 0, err, n, COMM_AGREE_NAME_RANK)))
    trainer_close(t);
  return rc;
}

int trainer_replan(struct trainer *t, const struct plan *p, char *err, size_t err_size)
{
  err[0] = '\0';
  if (!t->plan)
    return errf(err, err_size, "replan: the trainer is not open"), TRAIN_RUNTIME_ERROR;
  struct comm_group *w = t->world;
  const int world = w ? w->size : 1;
  struct plan to, back;
  plan_init(&to);
  plan_init(&back);
  /* 1. Refusals, before anything moves: t stays as it is. */
  int rc = 0;
  if (trainer_failed(t))
    rc = (errf(err, err_size, "replan: the trainer holds an unhandled failure (%s); handle it and call "
               "trainer_clear_error first", trainer_failed(t)), TRAIN_RUNTIME_ERROR);
  else if (p->mesh.world != world)
    rc = (errf(err, err_size, "%s: mesh tp %d × pp %d × dp %d = %d ranks, but the trainer runs on %d: a "
               "replan keeps the job's world", plan_where(p, "mesh"), p->mesh.tp, p->mesh.pp, p->mesh.dp,
               p->mesh.world, world), TRAIN_PLAN_ERROR);
  else if (same_model(t->plan, p, err, err_size) || trainer_plan_supported(p, err, err_size))
    rc = TRAIN_PLAN_ERROR;
  else if (plan_copy(&to, p) || plan_copy(&back, t->plan)) /* p may be t->plan, which close frees */
    rc = (errf(err, err_size, "replan: out of memory for copies of the plans"), TRAIN_RUNTIME_ERROR);
  rc = comm_agree_err(w, rc, err, err_size, COMM_AGREE_NAME_RANK);
  if (!rc && w && comm_check_plan_hash(plan_hash(&to), err, err_size)) /* agreed: every rank the same p */
    rc = TRAIN_PLAN_ERROR;
  /* 2. The state, every rank's pieces, to every rank (agreed; t is left as it was). */
  struct ckpt_mem *cm = NULL;
  if (!rc) {
    comm_set_step(t->step, -1);
    if (ckpt_mem_gather(t, replan_limit(), &cm, err, err_size))
      rc = TRAIN_RUNTIME_ERROR;
  }
  if (rc) {
    plan_free(&to);
    plan_free(&back);
    return rc;
  }
  /* 3. The old trainer closed (its groups freed when it owned them), the new one opened on groups
   * of its own and loaded from memory; when that fails, the old layout again. */
  const long long step = t->step;
  trainer_close(t);
  rc = open_and_load(t, &to, w, cm, err, err_size);
  if (rc) {
    char first[1024], why[1024];
    snprintf(first, sizeof first, "%s", err);
    if (open_and_load(t, &back, w, cm, why, sizeof why) == 0)
      errf(err, err_size, "replan: %s; the trainer is back on its old layout, at step %lld", first, step);
    else
      errf(err, err_size, "replan: %s; reopening the old layout failed too (%s): the trainer is closed", first, why);
  }
  ckpt_mem_free(cm);
  plan_free(&to);
  plan_free(&back);
  return rc;
}

const char *trainer_failed(const struct trainer *t)
{
  return fault_msg(&t->fault);
}

void trainer_clear_error(struct trainer *t)
{
  fault_clear(&t->fault);
}

void trainer_close(struct trainer *t)
{
  ckpt_async_abandon(t); /* a save still being written: its writer joined, its .tmp left */
  for (int i = t->n_nccl - 1; i >= 0; i--) /* once the device has run their operations */
    comm_stream_close(t->nccl[i]);
  t->n_nccl = 0;
  const int current = alloc_current_device(); /* the reservation is on the model's device */
  if (alloc_use_device(t->model.device) == 0) {
    alloc_unreserve(t->reserved);
    alloc_use_device(current);
  }
  exec_close(&t->exec);
  alloc_free(t->inputs);
  alloc_free(t->targets);
  alloc_free(t->samples);
  data_source_close(&t->data);
  optimizer_free(&t->opt);
  model_acts_free(&t->acts);
  model_cp_close(&t->model);
  dp_close(&t->dp);
  model_free(&t->model);
  plan_free(&t->own_plan);
  char why[256];
  comm_group_free(t->stage, why, sizeof why); /* NULL: none */
  comm_group_free(t->ep, why, sizeof why);
  comm_group_free(t->edp, why, sizeof why);
  comm_group_free(t->dpcp, why, sizeof why);
  comm_free_mesh_groups(t->own_groups, why, sizeof why); /* NULL entries: not trainer_open_on_world's */
  runtime_device_close(&t->device); /* after every block on it is freed */
  dcomm_release(); /* the staging buffers no operation holds: a later trainer makes its own */
  memset(t, 0, sizeof *t);
}

static void fill_train_window(const struct trainer *t, uint64_t w, int *inputs, int *targets)
{
  t->data.ops->train_window(&t->data, w, inputs, targets);
}

void trainer_micro_batch(struct trainer *t, int mb, int *inputs, int *targets, uint64_t *samples)
{
  const struct plan *p = t->plan;
  const int G = p->batch.global, micro = p->batch.micro, S = p->batch.seq;
  const int first = t->data_rank * (G / t->data_size); /* this rank's slice of the step's windows */
  for (int b = 0; b < micro; b++) {
    samples[b] = (uint64_t)t->step * (uint64_t)G + (uint64_t)(first + mb * micro + b);
    fill_train_window(t, samples[b], inputs + (size_t)b * S, targets + (size_t)b * S);
  }
}

/* A forward alone, stage after stage. */
static double eval_forward(struct trainer *t, const int *tokens, const int *targets, int B, int T)
{
  dp_bf16_refresh(&t->dp);
  return exec_forward(&t->exec, tokens, targets, B, T);
}

static double global_loss(struct trainer *t, double loss_sum)
{
  const struct plan *p = t->plan;
  double total = 0.0;
  dp_sum(&t->dp, &loss_sum, &total, 1);
  return total / ((double)p->batch.global * p->batch.seq);
}

double trainer_forward_backward(struct trainer *t)
{
  kernels_compute_begin();
  dp_bf16_refresh(&t->dp);
  const double loss = global_loss(t, exec_step(&t->exec, NULL, NULL, NULL));
  kernels_compute_end();
  return backend_failed(t) ? NAN : loss;
}

/* The OPTIMIZER instruction's work (exec_step's hook): the loss of the global batch, the
 * gradient norm, clipping, AdamW. */
struct update {
  struct trainer *t;
  struct train_step_stats *stats;
  char *err;
  size_t err_size;
};

static int update(void *ctx, double loss_sum)
{
  struct update *u = ctx;
  struct trainer *t = u->t;
  struct train_step_stats *stats = u->stats;
  const struct plan *p = t->plan;
  const double loss = global_loss(t, loss_sum), grad_norm = dp_grad_norm(&t->dp);
  /* steps are named as the progress lines number them: step k is the k-th (t->step + 1); the
   * norm was read back after the executor's check: asked again before either is handed out */
  if (backend_failed(t))
    return errf(u->err, u->err_size, "step %lld: %s", t->step + 1, trainer_failed(t));
  stats->loss = loss;
  stats->lr = optimizer_lr(p, t->step);
  stats->grad_norm = grad_norm;
  if (!isfinite(stats->loss) || !isfinite(stats->grad_norm)) {
    char advice[160];
    if (p->optimizer.grad_clip > 0)
      snprintf(advice, sizeof advice, "lower optimizer.lr (optimizer.grad_clip = %g is set already)",
               p->optimizer.grad_clip);
    else
      snprintf(advice, sizeof advice, "lower optimizer.lr or set optimizer.grad_clip");
    return errf(u->err, u->err_size, "step %lld: the loss (%g) or the gradient norm (%g) is not finite, so the "
                "step is not applied; %s", t->step + 1, stats->loss, stats->grad_norm, advice);
  }
  /* Unclipped, a gradient element's square enters AdamW's second moment as it is: in fp32 it
   * overflows to inf once the element passes sqrt(FLT_MAX) ≈ 1.8e19, which only a norm that large
   * allows. The step would leave an infinite moment (and every later update NaN) with a finite
   * loss and norm, so it is refused as a non-finite one is. */
  if (!REAL_IS_DOUBLE && p->optimizer.grad_clip <= 0 && stats->grad_norm >= sqrt((double)FLT_MAX))
    return errf(u->err, u->err_size, "step %lld: the gradient norm (%g) is too large for fp32: the square of a "
                "gradient element could overflow AdamW's second moment, so the step is not applied; lower "
                "optimizer.lr or set optimizer.grad_clip", t->step + 1, stats->grad_norm);
  /* train.max_loss_jump: a loss far above the recent mean skips the step (the same verdict on
   * every rank: the loss is the global batch's) */
  struct train_loss_window *w = &t->recent;
  if (p->train.max_loss_jump > 0 && w->n >= TRAIN_LOSS_WINDOW_MIN) {
    double mean = 0.0;
    for (int i = 0; i < w->n; i++)
      mean += w->loss[i];
    mean /= w->n;
    if (stats->loss > p->train.max_loss_jump * mean) {
      if (++w->skipped_in_a_row > TRAIN_MAX_SKIPS)
        return errf(u->err, u->err_size, "step %lld: the loss (%g) has been above train.max_loss_jump = %g × the "
                    "recent mean (%g) for %d steps in a row; the run stops (the last %d were skipped): lower "
                    "optimizer.lr, or resume from an earlier checkpoint", t->step + 1, stats->loss,
                    p->train.max_loss_jump, mean, TRAIN_MAX_SKIPS + 1, TRAIN_MAX_SKIPS);
      stats->skipped = 1;
      stats->recent_loss = mean;
      comm_set_step(t->step, -1);
      return 0; /* weights and AdamW's moments unchanged; the step's batch is consumed */
    }
  }
  if (p->train.max_loss_jump > 0) {
    if (w->n == TRAIN_LOSS_WINDOW)
      memmove(w->loss, w->loss + 1, (TRAIN_LOSS_WINDOW - 1) * sizeof *w->loss);
    else
      w->n++;
    w->loss[w->n - 1] = stats->loss;
    w->skipped_in_a_row = 0;
  }
  const double t0 = comm_now();
  /* clipping: AdamW reads each gradient times the coefficient (one rounding, as scaling the
   * memory first did) */
  double coef = optimizer_clip_coef(stats->grad_norm, p->optimizer.grad_clip);
  if (dp_update(&t->dp, &t->opt, t->step, stats->lr, coef < 1.0 ? (real)coef : (real)1))
    return errf(u->err, u->err_size, "step %lld: %s", t->step + 1, FAULT_OF(&t->dp)->msg);
  comm_set_step(t->step, -1);
  comm_trace_work("optimizer", -1, -1, 0.0, t0, comm_now());
  return 0;
}

static int step_once(struct trainer *t, struct train_step_stats *stats, char *err, size_t err_size);

int trainer_step(struct trainer *t, struct train_step_stats *stats, char *err, size_t err_size)
{
  kernels_compute_begin(); /* signals are handled elsewhere or after the step (kernels.h) */
  const int rc = step_once(t, stats, err, err_size);
  kernels_compute_end();
  return rc;
}

static int step_once(struct trainer *t, struct train_step_stats *stats, char *err, size_t err_size)
{
  struct update u = { t, stats, err, err_size };
  memset(stats, 0, sizeof *stats);
  stats->step = t->step;
  stats->threads = omp_get_max_threads();
  int rc = 0;
  model_moe_stats_reset(&t->model); /* the sparse layers' routing counts this step's forwards */
  dp_bf16_refresh(&t->dp); /* bf16 models: copies rounded after anything but AdamW wrote weights */
  exec_step(&t->exec, update, &u, &rc);
  if (!rc && trainer_failed(t)) /* a failure the list stopped at, before its OPTIMIZER */
    rc = errf(err, err_size, "step %lld: %s", t->step + 1, trainer_failed(t));
  if (rc)
    return rc;
  t->step++;
  /* the kernels' results do not depend on the thread count: fewer while other work holds the CPUs */
  stats->threads_next = threads_adapt_tick(&stats->others_cpus);
  return 0;
}

/* Round k of the rank's share of n chunks: chunk k·dp + rank, or −1 past the end (the rank then
 * repeats chunk 0 and drops the result, so every rank runs as many forwards). */
static long long chunk_of_round(const struct trainer *t, long long k, long long n_chunks)
{
  long long c = k * t->data_size + t->data_rank;
  return c < n_chunks ? c : -1;
}

static long long rounds(const struct trainer *t, long long n_chunks)
{
  return (n_chunks + t->data_size - 1) / t->data_size;
}

/* Whether the evaluation stops here: every rank of the world says whether it caught a signal
 * (*stop), and all leave at the same batch when any did. The compute block is lifted for a
 * moment first, so a signal held back by it (kernels.h) runs its handler on this thread between
 * two batches, never inside a product. Without stop (the REPL's t:eval), never. */
static int eval_stops(struct trainer *t, const volatile sig_atomic_t *stop)
{
  if (!stop)
    return 0;
  kernels_compute_end();
  kernels_compute_begin();
  const int sig = *stop;
  char msg[COMM_AGREE_MSG_MAX] = "";
  return comm_agree_err(t->world, sig ? 128 + sig : 0, msg, sizeof msg, COMM_AGREE_PLAIN) != 0;
}

/* Σ losses of this rank's share of the validation windows: chunks of `micro` windows; *stopped
 * when a signal ended it (eval_stops). */
static double val_loss_sum(struct trainer *t, const volatile sig_atomic_t *stop, int *stopped)
{
  const struct plan *p = t->plan;
  const int G = p->batch.global, micro = p->batch.micro, S = p->batch.seq;
  const long long n_chunks = (long long)p->train.eval_batches * G / micro;
  double sum = 0.0;
  for (long long k = 0; k < rounds(t, n_chunks); k++) {
    if ((*stopped = eval_stops(t, stop)) != 0)
      return 0.0;
    long long c = chunk_of_round(t, k, n_chunks);
    for (int b = 0; b < micro; b++)
      t->data.ops->val_window(&t->data, (uint64_t)(c < 0 ? 0 : c) * (uint64_t)micro + (uint64_t)b,
                              t->inputs + (size_t)b * S, t->targets + (size_t)b * S);
    double loss = eval_forward(t, t->inputs, t->targets, micro, S);
    sum += c < 0 ? 0.0 : loss;
  }
  return sum;
}

/* Greedy decoding of the data source's held-out problems [first, first + B): how many come out
 * exactly right. The forward reruns on the growing sequence (the model keeps no KV cache). */
static int solve_problems(struct trainer *t, uint64_t first, int B)
{
  const int P = t->data.prompt_tokens, A = t->data.answer_tokens;
  int text[TRAIN_MIN_EVAL_PROBLEMS][TRAIN_MAX_PROBLEM_TOKENS], answer[TRAIN_MIN_EVAL_PROBLEMS][TRAIN_MAX_PROBLEM_TOKENS];
  for (int b = 0; b < B; b++) t->data.ops->eval_problem(&t->data, first + (uint64_t)b, text[b], answer[b]);
  /* Under sequence parallelism the forward needs whole shards: the sequence is padded at the end
   * (the causal mask keeps padding out of the positions read). */
  const int tp = t->model.tp.size, sp = t->model.tp.io.home == TP_SEQ;
  /* Under context parallelism, at least the 2 · cp chunks of one token each; with sequence
   * parallelism too, 2 · cp equal chunks of whole tp shards (plan_validate's rule for batch.seq). */
  const int cp = t->model.cp.size > 1 ? t->model.cp.size : 1, T_min = cp > 1 ? 2 * cp : 1;
  const int multiple = sp ? (cp > 1 ? 2 * cp * tp : tp) : 1;
  int rows[TRAIN_MIN_EVAL_PROBLEMS], best[TRAIN_MIN_EVAL_PROBLEMS];
  for (int g = 0; g < A; g++) {
    const int T = P + g, Tp = T < T_min ? T_min : T, Tr = (Tp + multiple - 1) / multiple * multiple;
    for (int b = 0; b < B; b++) {
      memcpy(t->inputs + (size_t)b * Tr, text[b], (size_t)T * sizeof(int));
      for (int i = T; i < Tr; i++) t->inputs[(size_t)b * Tr + i] = 0;
      rows[b] = b * Tr + T - 1;
    }
    eval_forward(t, t->inputs, NULL, B, Tr);
    exec_argmax(&t->exec, rows, B, best);
    for (int b = 0; b < B; b++) text[b][T] = best[b];
  }
  int right = 0;
  for (int b = 0; b < B; b++) right += memcmp(text[b] + P, answer[b], (size_t)A * sizeof(int)) == 0;
  return right;
}

static void eval_once(struct trainer *t, struct train_eval_stats *stats, const volatile sig_atomic_t *stop);

void trainer_eval(struct trainer *t, struct train_eval_stats *stats)
{
  trainer_eval_until(t, stats, NULL);
}

void trainer_eval_until(struct trainer *t, struct train_eval_stats *stats, const volatile sig_atomic_t *stop)
{
  kernels_compute_begin();
  eval_once(t, stats, stop);
  kernels_compute_end();
}

static void eval_once(struct trainer *t, struct train_eval_stats *stats, const volatile sig_atomic_t *stop)
{
  const struct plan *p = t->plan;
  memset(stats, 0, sizeof *stats);
  stats->step = t->step;
  if (p->train.eval_batches <= 0)
    return;
  const int collect = t->model.moe_collect;
  t->model.moe_collect = 0; /* the routing statistics are the training forwards' */
  /* sums[0]: Σ validation losses, sums[1]: problems solved; summed over the group. */
  double sums[2] = { 0.0, 0.0 }, total[2];
  stats->has_val_loss = t->data.ops->val_window != NULL;
  int stopped = 0;
  if (stats->has_val_loss)
    sums[0] = val_loss_sum(t, stop, &stopped);
  /* Accuracy needs the prompt and all but the last answer token in one window. */
  stats->has_accuracy = t->data.ops->eval_problem && p->batch.seq >= t->data.prompt_tokens + t->data.answer_tokens - 1;
  long long n = (long long)p->train.eval_batches * p->batch.global;
  n = n < TRAIN_MIN_EVAL_PROBLEMS ? TRAIN_MIN_EVAL_PROBLEMS : n;
  const int chunk = p->batch.micro < TRAIN_MIN_EVAL_PROBLEMS ? p->batch.micro : TRAIN_MIN_EVAL_PROBLEMS;
  const long long n_chunks = (n + chunk - 1) / chunk;
  for (long long k = 0; !stopped && stats->has_accuracy && k < rounds(t, n_chunks); k++) {
    if ((stopped = eval_stops(t, stop)) != 0)
      break;
    long long c = chunk_of_round(t, k, n_chunks);
    long long first = (c < 0 ? 0 : c) * chunk;
    int B = n - first < chunk ? (int)(n - first) : chunk;
    int right = solve_problems(t, (uint64_t)first, B);
    /* the cp ranks of a dp rank solve the same problems (the sum runs over dp × cp): one counts */
    sums[1] += c < 0 || t->model.cp.rank != 0 ? 0 : right;
  }
  t->model.moe_collect = collect;
  if (stopped) { /* agreed: every rank leaves here, without the sums */
    memset(stats, 0, sizeof *stats);
    stats->step = t->step;
    stats->stopped = 1;
    return;
  }
  if (dp_sum(&t->dp, sums, total, 2))
    return;
  if (backend_failed(t)) { /* the sums were read back from a failed backend: none handed out */
    memset(stats, 0, sizeof *stats);
    stats->step = t->step;
    return;
  }
  stats->val_loss = total[0] / ((double)p->train.eval_batches * p->batch.global * p->batch.seq);
  if (stats->has_accuracy) {
    stats->n_problems = (int)n;
    stats->accuracy = total[1] / (double)n;
  }
}
