/* The step-time model (host/check/cost.h) against figures worked out by hand from its own
 * definitions, on a cluster made up so the numbers are easy: 1 TFLOP/s per GPU at efficiency 1,
 * links of 1 GB/s without latency, 4 GPUs per node.
 *   - one rank: the step is 3 × forward FLOPs × tokens / rate, nothing else, and MFU is 1;
 *   - recompute adds its parts' forward FLOPs and lowers MFU below 1 (MFU counts model FLOPs);
 *   - pipeline stages with equal costs: the bubble is (p − 1) / m of the busy time (1F1B);
 *   - data parallelism without stages: the all-reduce of the gradients is 2(n−1)/n · bytes / bw,
 *     hidden up to one micro-batch's backward;
 *   - groups are placed on the intra- or inter-node link by the mesh order.
 * The model is double arithmetic in both builds; "by hand" here is the same sums in another
 * order, a few roundings of 1.1e-16 apart: relative 1e-9 (1e-12 where nothing but the same
 * terms is summed) leaves orders of magnitude of room, and a term left out or counted twice is
 * ≥ 1e-3 of the step. The dp figure is held to 2% because the runtime pads each tensor to 16
 * floats, which the hand count leaves out. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check/cost.h"
#include "plan/compile.h"

static char plan_path[1200];

static int compile(struct plan *p, int world, const char *const *sets, int n_sets)
{
  char err[1024];
  struct plan_compile_options opt = { 0 };
  opt.world = world;
  opt.sets = sets;
  opt.n_sets = n_sets;
  plan_init(p);
  int rc = plan_compile(plan_path, &opt, p, err, sizeof err);
  CHECK_MSG(rc == 0, "%s", err);
  return rc;
}

static struct cluster easy(void)
{
  struct cluster c;
  memset(&c, 0, sizeof c);
  snprintf(c.name, sizeof c.name, "easy");
  c.gpus_per_node = 4;
  c.device_memory = 80e9;
  c.peak_flops = 1e12;
  c.intra.bandwidth = 1e9;
  c.inter.bandwidth = 0.5e9;
  c.compute_efficiency = 1.0;
  c.comm_efficiency = 1.0;
  return c;
}

static double rel(double a, double b) { return fabs(a - b) / fabs(b); }

/* Forward FLOPs per token of tests/plans/good/dp_small.lua, worked by hand (a multiply-add is
 * 2 FLOPs; C = 32, 4 heads and 2 KV heads of HS = 8, F = 64, V = 64, T = 32, 2 layers):
 *   q, k, v: 2 · C · (4 + 2 + 2) · HS = 4096;  o: 2 · (4 · HS) · C = 2048       → 6144
 *   attention core, causal (half of T·T): q·kᵀ and ·v, 2 · 2 · (T/2) · 4 · HS  → 2048
 *   gate, up, down: 3 · 2 · C · F                                              → 12288
 *   a layer 20480; two layers and the head (2 · C · V = 4096): 45056. */
enum { LAYER_FLOPS = 6144 + 2048 + 12288, MODEL_FLOPS = 2 * LAYER_FLOPS + 4096 };

static void test_one_rank_is_three_forwards(void)
{
  struct plan p;
  if (compile(&p, 1, NULL, 0))
    return;
  struct cluster c = easy();
  struct cost k;
  char err[256];
  CHECK(cost_predict(&p, &c, &k, err, sizeof err) == 0);
  double tokens = (double)p.batch.global * p.batch.seq;
  CHECK(p.model.n_layers == 2 && p.model.dim == 32 && p.model.ffn_dim == 64 && p.batch.seq == 32);
  double want = 3.0 * MODEL_FLOPS * tokens / c.peak_flops;
  CHECK_MSG(rel(k.step, want) < 1e-9, "step %.9g s, by hand %.9g s", k.step, want);
  CHECK_MSG(rel(k.mfu, 1.0) < 1e-9, "MFU %.9g", k.mfu);
  CHECK(k.bubble < 1e-12 && k.tp.total == 0 && k.dp.total == 0);

  const char *rc[] = { "recompute=full" };
  struct plan q;
  if (compile(&q, 1, rc, 1) == 0) {
    struct cost r;
    CHECK(cost_predict(&q, &c, &r, err, sizeof err) == 0);
    double extra = 2.0 * LAYER_FLOPS * tokens / c.peak_flops; /* full: both layers' forward again */
    CHECK_MSG(rel(r.step, want + extra) < 1e-9, "recompute full: %.9g s, by hand %.9g s", r.step, want + extra);
    CHECK(r.mfu < 1.0 && rel(r.model_flops, k.model_flops) < 1e-12);
    plan_free(&q);
  }
  plan_free(&p);
}

static void test_pipeline_bubble(void)
{
  /* 4 equal layers on 2 stages without a head of note: stage costs equal but for the head; with
   * 8 micro-batches the 1F1B bubble over busy time is about (p − 1) / m */
  const char *sets[] = { "mesh.pp=2", "batch.micro=1", "model.n_layers=4" };
  struct plan p;
  if (compile(&p, 2, sets, 3))
    return;
  struct cluster c = easy();
  c.intra.bandwidth = c.inter.bandwidth = 1e18; /* sends free: the bubble is the schedule's alone */
  struct cost k;
  char err[256];
  CHECK(cost_predict(&p, &c, &k, err, sizeof err) == 0);
  const int m = p.batch.microbatches;
  double ratio = k.bubble / k.compute;
  /* the head makes the last stage a little heavier: the bubble lies near (p − 1)/m */
  CHECK_MSG(ratio > 0.5 / m && ratio < 2.0 / m, "bubble / compute %.4f, (p−1)/m = %.4f", ratio, 1.0 / m);
  CHECK(k.pp.total > 0 && k.pp.intra);
  /* at 1 GB/s a send (4 KiB) outlasts a tiny stage's compute: the bubble grows, the model says so */
  struct cluster slow = easy();
  struct cost s;
  CHECK(cost_predict(&p, &slow, &s, err, sizeof err) == 0);
  CHECK(s.bubble > 5 * k.bubble && rel(s.compute, k.compute) < 1e-12);
  plan_free(&p);
}

static void test_data_parallel_reduction(void)
{
  /* dp 4 in one node (intra link), zero 0, one bucket: the all-reduce moves 2·3/4 of the
   * gradients at 1 GB/s, and one micro-batch's backward hides part of it */
  const char *sets[] = { "bucket_mb=1000" };
  struct plan p;
  if (compile(&p, 4, sets, 1))
    return;
  struct cluster c = easy();
  struct cost k;
  char err[256];
  CHECK(cost_predict(&p, &c, &k, err, sizeof err) == 0);
  double bytes = (double)plan_param_count(&p) * 4.0;
  double want = 2.0 * 3.0 / 4.0 * bytes / c.intra.bandwidth;
  CHECK_MSG(rel(k.dp.total, want) < 0.02, "dp all-reduce %.6g s, by hand %.6g s (16-float alignment apart)",
            k.dp.total, want);
  double bwd_mb = 2.0 / 3.0 * k.compute / p.batch.microbatches;
  CHECK(k.dp.intra && fabs(k.dp.exposed - fmax(0.0, k.dp.total - bwd_mb)) < 1e-12);
  /* the same on 2 GPUs per node: the dp group spans two nodes and takes the inter-node link */
  c.gpus_per_node = 2;
  struct cost far;
  CHECK(cost_predict(&p, &c, &far, err, sizeof err) == 0);
  CHECK(!far.dp.intra && rel(far.dp.total, 2.0 * k.dp.total) < 1e-9);
  plan_free(&p);
}

int main(void)
{
  const char *src = getenv("TYCHO_SOURCE_DIR");
  snprintf(plan_path, sizeof plan_path, "%s/tests/plans/good/dp_small.lua", src ? src : ".");
  static const struct test_case tests[] = { TEST(test_one_rank_is_three_forwards), TEST(test_pipeline_bubble),
                                            TEST(test_data_parallel_reduction) };
  return test_run_all(tests, 3);
}
