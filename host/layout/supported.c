/* Whether this build's runtime can run a plan (supported.h). */
#include "layout/supported.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "ops.h"
#include "util/devices.h"
#include "util/err.h"

/* precision.compute = "bf16" (runtime/model/model.h): what the model's bf16 mode runs, and what it
 * refuses by name. On a CPU without bf16 products the products run widened (kernels/bf16.h). */
static int bf16_refused(const struct plan *p, int cuda, char *err, size_t n)
{
  const char *where = plan_where(p, "precision.compute");
  const char *dt = plan_dtype_name(p->precision.compute);
  const char *on = cuda ? "the GPU" : "the CPU";
  if (p->precision.compute != PLAN_BF16)
    return errf(err, n, "%s: precision.compute = \"%s\": the %s backend computes in fp32 or bf16; set "
                "precision = { compute = \"fp32\", grads = \"fp32\", master = \"fp32\" }", where, dt,
                cuda ? "CUDA" : "CPU");
  /* the CUDA table has its bf16 entries in every build that has it (fp32 builds only) */
  if (!cuda && (kernels_active()->compute_dtype != TENSOR_F32 || !kernels_active()->linear_forward_bf16))
    return errf(err, n, "%s: precision.compute = \"bf16\": this build's %s kernels have no bf16 compute "
                "(the float64 build has none); use an fp32 build, or compute = \"fp32\"", where,
                kernels_active()->name);
  if (p->precision.master != PLAN_FP32)
    return errf(err, n, "%s: precision.master = \"%s\": the master weights are fp32 (AdamW's state); set "
                "master = \"fp32\"", plan_where(p, "precision.master"), plan_dtype_name(p->precision.master));
  if (p->precision.grads != PLAN_FP32 && p->precision.grads != PLAN_BF16)
    return errf(err, n, "%s: precision.grads = \"%s\": gradients are kept in fp32 or bf16 on %s; set grads = "
                "\"bf16\" or \"fp32\"", plan_where(p, "precision.grads"), plan_dtype_name(p->precision.grads), on);
  /* grads bf16 (runtime/parallel/dp.h) runs under every ZeRO stage and zero_every.grads */
  return 0; /* ZeRO 3 included: each gathered unit's copies are made as it arrives (dp_passes.c) */
}

int trainer_auto_device(char *why, size_t n)
{
  const int count = devices_cuda_count();
  if (!devices_cuda_built())
    snprintf(why, n, "no CUDA backend in this build");
  else if (count < 1)
    snprintf(why, n, "no CUDA device visible");
  else
    snprintf(why, n, "%d CUDA device%s visible", count, count == 1 ? "" : "s");
  return devices_cuda_built() && count > 0;
}

/* A cuda plan on this build and machine: the backend built and a device visible. */
static int cuda_refused(const struct plan *p, char *err, size_t n)
{
  if (!devices_cuda_built())
    return errf(err, n, "%s: device = \"cuda\": this build of tycho has no CUDA backend; run it on the "
                "CPU with --set device=cpu (or device = \"auto\")", plan_where(p, "device"));
  if (devices_cuda_count() < 1)
    return errf(err, n, "%s: device = \"cuda\": no CUDA device visible (the driver reports none%s); run it "
                "on the CPU with --set device=cpu (or device = \"auto\")", plan_where(p, "device"),
                getenv("CUDA_VISIBLE_DEVICES") ? ", CUDA_VISIBLE_DEVICES is set" : "");
  return p->precision.compute != PLAN_FP32 && bf16_refused(p, 1, err, n) ? -1 : 0;
}

/* schedule.kind = "zb-h1": the executor splits each backward (model.h, struct model_split) of a
 * dense model (at tp > 1 holding the products' inputs too) under ZeRO 0 and 1, and under ZeRO 2
 * and 3 where the step keeps the whole gradients (and ZeRO 3 the gathered parameters) until the
 * stage's last W (bill_split_runs_zero); the rest is refused by name. */
static int zb_refused(const struct plan *p, char *err, size_t n)
{
  const char *where = plan_where(p, "schedule.kind");
  for (int l = 0; p->layers && l < p->model.n_layers; l++)
    if (p->layers[l].moe)
      return errf(err, n, "%s: schedule.kind = \"zb-h1\" with model.moe (layer %d is sparse): the split "
                  "backward runs dense layers only (the experts' products are not split); use 1f1b", where, l);
  if (p->zero >= 2 && p->zero_every.grads != PLAN_ZERO_EVERY_STEP)
    return errf(err, n, "%s: schedule.kind = \"zb-h1\" with zero = %d and zero_every.grads = \"micro_batch\": "
                "a unit's gradients are final only after its W, micro-batches after its B, and a "
                "micro-batch's buckets are reduced and freed within its backward; set zero_every.grads = "
                "\"step\" (the default with pipeline stages), or use 1f1b", where, p->zero);
  if (p->zero == 3 && p->zero_every.params != PLAN_ZERO_EVERY_STEP)
    return errf(err, n, "%s: schedule.kind = \"zb-h1\" with zero = 3 and zero_every.params = \"micro_batch\": "
                "every piece gathers the units it reads, so each W would gather its stage's parameters "
                "again, though its products read none; set zero_every.params = \"step\" (the default "
                "with pipeline stages), or use 1f1b", where);
  return 0;
}

/* mesh.cp > 1 (context parallelism, runtime/model/model_cp.c): what the ring's attention composes
 * with so far, each other axis or mode refused by name. */
static int cp_refused(const struct plan *p, char *err, size_t n)
{
  const int cp = p->mesh.cp;
  const char *where = plan_where(p, "mesh.cp");
  const char *not_yet = "context parallelism composes with dp (ZeRO 0-3), tp (with sequence parallelism), pp, dropout and "
                        "recompute so far";
  if (p->model.moe.experts > 0)
    return errf(err, n, "%s: mesh.cp = %d with model.moe (%d experts): %s; the routing's capacity counts a rank's "
                "tokens, so a sparse model is not run under it yet; set mesh.cp = 1", where, cp,
                p->model.moe.experts, not_yet);
  if (p->precision.compute != PLAN_FP32)
    return errf(err, n, "%s: mesh.cp = %d with precision.compute = \"%s\": the ring's attention computes in fp32 "
                "only; set precision.compute = \"fp32\" or mesh.cp = 1", where, cp,
                plan_dtype_name(p->precision.compute));
  if (p->device == PLAN_DEVICE_CUDA)
    return errf(err, n, "%s: mesh.cp = %d with device = \"cuda\": the ring's transfers run on host memory only "
                "(no NCCL ring yet); set device = \"cpu\" or mesh.cp = 1", where, cp);
  if (p->schedule == PLAN_SCHED_ZB_H1)
    return errf(err, n, "%s: mesh.cp = %d with schedule.kind = \"zb-h1\": %s, under whole backwards (the split "
                "backward is not run with the ring yet); use schedule.kind = \"1f1b\" or mesh.cp = 1", where, cp,
                not_yet);
  return 0;
}

int plan_cp_refused(const struct plan *p, char *err, size_t n)
{
  return p->mesh.cp > 1 && cp_refused(p, err, n) ? -1 : 0;
}

int trainer_plan_supported(const struct plan *p, char *err, size_t n)
{
  if (p->mesh.cp > 1 && cp_refused(p, err, n))
    return -1;
  if (p->schedule == PLAN_SCHED_ZB_H1 && zb_refused(p, err, n))
    return -1;
  if (p->device == PLAN_DEVICE_CUDA) {
    if (cuda_refused(p, err, n))
      return -1;
  } else if (p->precision.compute != PLAN_FP32 && bf16_refused(p, 0, err, n)) {
    return -1;
  }
  if (strcmp(p->optimizer.kind, "adamw") != 0)
    return errf(err, n, "%s: optimizer.kind = \"%s\": only \"adamw\" is implemented",
                plan_where(p, "optimizer.kind"), p->optimizer.kind);
  if (!p->data.train[0] && !p->data.synthetic[0] && !p->data.n_text)
    return errf(err, n, "%s: data: nothing to train on; give data.train (a token file), data.text or "
                "data.synthetic = \"addition\"", plan_where(p, "data"));
  return 0;
}
