/* The step-time model (host/check/cost.h) against figures worked out by hand from its own
 * definitions, on a cluster made up so the numbers are easy: 1 TFLOP/s per GPU at efficiency 1,
 * links of 1 GB/s without latency, 4 GPUs per node.
 *   - one rank: the step is 3 × forward FLOPs × tokens / rate, nothing else, and MFU is 1;
 *   - recompute adds its parts' forward FLOPs and lowers MFU below 1 (MFU counts model FLOPs);
 *   - pipeline stages with equal costs: the bubble is (p − 1) / m of the busy time (1F1B);
 *   - data parallelism without stages: the all-reduce of the gradients is 2(n−1)/n · bytes / bw,
 *     hidden up to one micro-batch's backward;
 *   - groups are placed on the intra- or inter-node link by the mesh order;
 *   - a cluster's overheads (what `tycho calibrate` measures): the attention core at its own rate,
 *     pointwise work per token · layer · (dim + ffn_dim) element with dim and ffn_dim split by tp
 *     as the plan splits them, the optimizer per parameter element updated (a 1/dp shard from
 *     zero 1), and shared devices (more ranks than nodes × gpus_per_node) slowing compute and
 *     optimizer by ranks per device but not the collectives.
 * The model is double arithmetic in both builds; "by hand" here is the same sums in another
 * order, a few roundings of 1.1e-16 apart: relative 1e-9 (1e-12 where nothing but the same
 * terms is summed) leaves orders of magnitude of room, and a term left out or counted twice is
 * ≥ 1e-3 of the step. The dp figure is held to 2% because the runtime pads each tensor to 16
 * floats, which the hand count leaves out. */
#define _POSIX_C_SOURCE 200809L /* fmemopen */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "check/cost.h"
#include "check/tune.h"
#include "plan/compile.h"
#include "layout/bill.h"

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
  double bytes = (double)plan_param_count(&p) * check_element_bytes(&p, p.precision.grads); /* 8 in the float64 build */
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
  /* the link's own all-reduce figures (calibrate's per-op fit) replace its bandwidth for the
   * all-reduce only: twice the bandwidth, half the time; an all-gather figure changes nothing */
  c.gpus_per_node = 4;
  c.intra.op_bandwidth[0] = 2e9;
  c.intra.op_bandwidth[1] = 0.1e9;
  c.intra.op_latency[1] = 1.0;
  struct cost own;
  CHECK(cost_predict(&p, &c, &own, err, sizeof err) == 0);
  CHECK_MSG(rel(own.dp.total, 0.5 * k.dp.total) < 1e-9, "all-reduce at its own 2 GB/s: %.6g s, the link's %.6g s",
            own.dp.total, k.dp.total);
  plan_free(&p);
}

static void test_overheads(void)
{
  struct plan p;
  if (compile(&p, 1, NULL, 0))
    return;
  struct cluster c = easy();
  c.attention_flops = 0.5e12;
  c.pointwise_s = 1e-9;
  c.optimizer_s = 2e-9;
  struct cost k;
  char err[256];
  CHECK(cost_predict(&p, &c, &k, err, sizeof err) == 0);
  const double tokens = (double)p.batch.global * p.batch.seq, n = (double)plan_param_count(&p);
  /* by hand: the attention core (2048 FLOPs per token and layer forward, ×3 with backward) at
   * half the rate, the rest of the FLOPs at 1 TFLOP/s, 1 ns × (32 + 64) per token and layer,
   * 2 ns per parameter */
  const double matmul = 3.0 * (MODEL_FLOPS - 2 * 2048) * tokens / 1e12, attention = 3.0 * 2 * 2048 * tokens / 0.5e12;
  const double pointwise = 1e-9 * 96 * 2 * tokens, optimizer = 2e-9 * n;
  CHECK_MSG(rel(k.pointwise, pointwise) < 1e-9, "pointwise %.9g s, by hand %.9g s", k.pointwise, pointwise);
  CHECK_MSG(rel(k.optimizer, optimizer) < 0.02, "optimizer %.9g s, by hand %.9g s (16-float alignment apart)",
            k.optimizer, optimizer);
  CHECK_MSG(rel(k.step - k.optimizer, matmul + attention + pointwise) < 1e-9, "step less optimizer %.9g s, by hand %.9g s",
            k.step - k.optimizer, matmul + attention + pointwise);
  CHECK(k.share == 1.0 && rel(k.compute, matmul + attention + pointwise) < 1e-9);

  /* recompute = full: each layer's forward again, its attention core at the attention rate and a
   * third of its pointwise work */
  const char *rc[] = { "recompute=full" };
  struct plan q;
  if (compile(&q, 1, rc, 1) == 0) {
    struct cost r;
    CHECK(cost_predict(&q, &c, &r, err, sizeof err) == 0);
    double extra = 2.0 * ((LAYER_FLOPS - 2048) / 1e12 + 2048 / 0.5e12) * tokens + pointwise / 3;
    CHECK_MSG(rel(r.step - k.step, extra) < 1e-9, "recompute adds %.9g s, by hand %.9g s", r.step - k.step, extra);
    plan_free(&q);
  }
  /* tp 2: the pointwise charge per token is 32 + 64/2 without sequence parallelism, 32/2 + 64/2
   * with it */
  const char *tp[] = { "mesh.tp=2" }, *sp[] = { "mesh.tp=2", "sequence_parallel=true" };
  struct plan t, u;
  if (compile(&t, 2, tp, 1) == 0) {
    CHECK(cost_pointwise_elems(&t) == 64.0);
    struct cost r;
    CHECK(cost_predict(&t, &c, &r, err, sizeof err) == 0);
    CHECK_MSG(rel(r.pointwise, 1e-9 * 64 * 2 * tokens) < 1e-9, "tp 2 pointwise %.9g s", r.pointwise);
    plan_free(&t);
  }
  if (compile(&u, 2, sp, 2) == 0) {
    CHECK(cost_pointwise_elems(&u) == 48.0);
    plan_free(&u);
  }
  plan_free(&p);

  /* dp 4, zero 1: the optimizer updates a quarter of the parameters; on a 1-node cluster of 2
   * devices the 4 ranks share them: compute and optimizer twice as long, the dp collectives as on
   * a node of 4 */
  const char *z1[] = { "zero=1", "bucket_mb=1000" };
  if (compile(&p, 4, z1, 2))
    return;
  struct cluster big = c, shared = c;
  big.nodes = 1;
  shared.nodes = 1;
  shared.gpus_per_node = 2;
  struct cost kb, ks;
  CHECK(cost_predict(&p, &big, &kb, err, sizeof err) == 0 && cost_predict(&p, &shared, &ks, err, sizeof err) == 0);
  CHECK_MSG(rel(kb.optimizer, 2e-9 * n / 4) < 0.02, "zero 1 optimizer %.9g s, by hand %.9g s", kb.optimizer, 2e-9 * n / 4);
  CHECK(kb.share == 1.0 && ks.share == 2.0);
  CHECK(rel(ks.compute, 2 * kb.compute) < 1e-12 && rel(ks.optimizer, 2 * kb.optimizer) < 1e-12);
  CHECK(ks.dp.intra && kb.dp.intra && rel(ks.dp.total, kb.dp.total) < 1e-12);
  /* without `nodes` the same 2-device nodes are two nodes: no sharing, the inter-node link */
  shared.nodes = 0;
  struct cost kn;
  CHECK(cost_predict(&p, &shared, &kn, err, sizeof err) == 0);
  CHECK(kn.share == 1.0 && !kn.dp.intra && rel(kn.compute, kb.compute) < 1e-12);
  plan_free(&p);

  /* overlap = false: the dp all-reduce (zero 0) and zero 3's gathers and reduce-scatters are
   * exposed whole; with overlap the all-reduce hides behind a micro-batch's backward */
  const char *z0[] = { "bucket_mb=1000" }, *z3[] = { "zero=3", "bucket_mb=1000" };
  for (int z = 0; z < 2; z++) {
    if (compile(&p, 4, z ? z3 : z0, 2 - !z))
      return;
    struct cluster ov = easy(), no = easy();
    no.no_overlap = 1;
    struct cost ko, kx;
    CHECK(cost_predict(&p, &ov, &ko, err, sizeof err) == 0 && cost_predict(&p, &no, &kx, err, sizeof err) == 0);
    CHECK_MSG(rel(kx.dp.exposed, kx.dp.total) < 1e-12 && rel(kx.dp.total, ko.dp.total) < 1e-12,
              "zero %d: exposed %.6g of %.6g s", 3 * z, kx.dp.exposed, kx.dp.total);
    CHECK(ko.dp.exposed < ko.dp.total && rel(kx.step - ko.step, kx.dp.total - ko.dp.exposed) < 1e-9);
    plan_free(&p);
  }
}

/* Expert parallelism (cost.h, docs/moe.md): dp_small made sparse (2 sparse layers of 4 experts,
 * top 2, C = 32, micro 4, seq 32, dp 4 so one micro-batch per step) with ep 2.
 *   at capacity factor 1.25: capacity ceil(1.25 · 32 · 2 / 4) = 20, each all-to-all sends
 *     4 experts × 4 sequences × 20 rows × 32 = 10240 elements from a rank; 4 per sparse layer
 *     and micro-batch, so a step's ep traffic is 2 · 4 = 8 calls of 10240 elements;
 *   dropless: 4 · 32 tokens × 2 · 32 = 8192 elements each, and a row-count exchange of one int32
 *     per expert of each peer, 4 · 4 = 16 bytes, first: 5 calls per layer, 2 · (4 · 8192 · eb + 16) bytes a step;
 *   the cost: each all-to-all (n−1)/n · bytes / bandwidth + (n−1) · latency, blocking, on the
 *     intra-node link while the ep group (2 consecutive ranks) fits in a node; FLOPs (and so
 *     model FLOPs and compute) those of ep 1;
 *   the experts' state: half of it on a rank, its gradients reduced over dp / ep = 2 ranks. */
static void test_expert_parallel_all_to_all(void)
{
  const double eb = REAL_IS_DOUBLE ? 8 : 4; /* the CPU comm layer's reals */
  const char *cap_sets[] = { "model.moe.experts=4", "model.moe.top_k=2", "model.moe.capacity_factor=1.25",
                             "mesh.ep=2" };
  struct plan p, p1;
  if (compile(&p, 4, cap_sets, 4) || compile(&p1, 4, cap_sets, 3))
    return;
  struct plan_ep_exchange x = plan_ep_exchange(&p), none = plan_ep_exchange(&p1);
  CHECK(p.batch.microbatches == 1 && plan_moe_capacity(&p.model, 32) == 20);
  CHECK(x.row_calls == 4 && x.row_elems == 10240 && x.count_calls == 0 && x.count_bytes == 0 && x.padded);
  CHECK(none.row_calls == 0 && none.row_elems == 0 && none.count_calls == 0); /* ep 1: no exchange */
  unsigned long long calls, bytes;
  plan_ep_step_traffic(&p, 0, eb, &calls, &bytes);
  CHECK_MSG(calls == 8 && bytes == (unsigned long long)(8 * 10240 * eb), "%llu calls, %llu bytes", calls, bytes);
  plan_ep_step_traffic(&p1, 0, eb, &calls, &bytes);
  CHECK(calls == 0 && bytes == 0);

  struct cluster c = easy();
  c.intra.latency = 1e-3;
  c.optimizer_s = 1e-9; /* per element updated */
  struct cost k, k1;
  char err[256];
  CHECK(cost_predict(&p, &c, &k, err, sizeof err) == 0 && cost_predict(&p1, &c, &k1, err, sizeof err) == 0);
  const double a2a = 0.5 * 10240 * eb / c.intra.bandwidth + 1 * c.intra.latency;
  CHECK_MSG(k.ep.intra && rel(k.ep.total, 8 * a2a) < 1e-12 && k.ep.exposed == k.ep.total,
            "ep comm %.9g s, by hand %.9g s", k.ep.total, 8 * a2a);
  CHECK(rel(k.ep.bytes, 0.5 * 8 * 10240 * eb) < 1e-12);
  CHECK(k1.ep.total == 0 && k1.ep.bytes == 0);
  /* the experts' state is sharded over ep: a rank holds half of them at ep 2, the dense part whole;
   * the dense gradients all-reduce over the 4 dp ranks, the experts' over the 2 holding the same */
  double n1, e1, n2, e2;
  CHECK(bill_rank_params(&p1, 0, &n1, &e1, err, sizeof err) == 0 && bill_rank_params(&p, 0, &n2, &e2, err, sizeof err) == 0);
  CHECK_MSG(e1 > 0 && rel(e2, e1 / 2) < 1e-12 && rel(n1 - e1, n2 - e2) < 1e-12,
            "ep 1: %.0f elements (%.0f experts'), ep 2: %.0f (%.0f)", n1, e1, n2, e2);
  CHECK_MSG(p.zero == 0 && rel(k.dp.bytes, (1.5 * (n2 - e2) + 1.0 * e2) * eb) < 1e-12 &&
            rel(k1.dp.bytes, 1.5 * n1 * eb) < 1e-12, "dp bytes %.9g at ep 2, %.9g at ep 1", k.dp.bytes, k1.dp.bytes);
  CHECK_MSG(k1.optimizer > 0 && rel(k.optimizer, k1.optimizer * n2 / n1) < 1e-12, "optimizer %.9g s at ep 2, %.9g at ep 1",
            k.optimizer, k1.optimizer);
  CHECK_MSG(rel(k.step - k1.step, k.ep.total + (k.dp.exposed - k1.dp.exposed) + (k.optimizer - k1.optimizer)) < 1e-9,
            "step %.9g s at ep 2, %.9g s at ep 1, ep comm %.9g s", k.step, k1.step, k.ep.total);
  CHECK(k.model_flops == k1.model_flops && rel(k.compute, k1.compute) < 1e-12);
  /* one GPU per node: the ep group spans two nodes, at the inter-node link's half bandwidth */
  c.gpus_per_node = 1;
  c.inter.latency = 0;
  struct cost far;
  CHECK(cost_predict(&p, &c, &far, err, sizeof err) == 0);
  CHECK_MSG(!far.ep.intra && rel(far.ep.total, 8 * 0.5 * 10240 * eb / c.inter.bandwidth) < 1e-12,
            "inter-node ep comm %.9g s", far.ep.total);
  plan_free(&p);
  plan_free(&p1);

  const char *dropless_sets[] = { "model.moe.experts=4", "model.moe.top_k=2", "mesh.ep=2" };
  if (compile(&p, 4, dropless_sets, 3))
    return;
  x = plan_ep_exchange(&p);
  CHECK(x.row_calls == 4 && x.row_elems == 8192 && x.count_calls == 1 && x.count_bytes == 16 && !x.padded);
  plan_ep_step_traffic(&p, 0, eb, &calls, &bytes);
  CHECK_MSG(calls == 10 && bytes == (unsigned long long)(2 * (4 * 8192 * eb + 16)), "%llu calls, %llu bytes",
            calls, bytes);
  c = easy();
  c.intra.latency = 1e-3;
  CHECK(cost_predict(&p, &c, &k, err, sizeof err) == 0);
  const double rows = 0.5 * 8192 * eb / c.intra.bandwidth + c.intra.latency;
  const double counts = 0.5 * 16 / c.intra.bandwidth + c.intra.latency;
  CHECK_MSG(rel(k.ep.total, 2 * (4 * rows + counts)) < 1e-12, "dropless ep comm %.9g s, by hand %.9g s", k.ep.total,
            2 * (4 * rows + counts));
  plan_free(&p);
}

/* tune considers mesh.ep for a MoE model: over the divisors of dp that divide the experts (here
 * 1, 2, 4 at dp 4 with 4 experts; never 3 or 8), and writes it into the plan it picks, at 1 too
 * (a base plan's ep would survive tycho.extend otherwise); a dense model's plan has none. */
static void test_tune_considers_ep(void)
{
  const char *sets[] = { "model.moe.experts=4", "model.moe.top_k=2", "model.moe.capacity_factor=1.25" };
  struct plan p;
  if (compile(&p, 4, sets, 3))
    return;
  struct cluster c = easy();
  struct tune_result r;
  char err[256];
  CHECK(tune_search(&p, 4, &c, 0.10, 400, &r, err, sizeof err) == 0);
  int seen[9] = { 0 };
  for (int i = 0; i < r.n_best; i++) {
    const struct tune_choice *t = &r.best[i];
    if (t->ep >= 1 && t->ep <= 8)
      seen[t->ep]++;
    CHECK(t->dp % t->ep == 0 && 4 % t->ep == 0 && t->moe);
  }
  CHECK_MSG(seen[1] && seen[2] && seen[4] && !seen[3] && !seen[8], "ep 1: %d, 2: %d, 4: %d layouts", seen[1],
            seen[2], seen[4]);
  char text[4096] = "", out[sizeof plan_path + 16];
  snprintf(out, sizeof out, "%s", plan_path); /* written beside the base: it requires it */
  snprintf(strrchr(out, '/') ? strrchr(out, '/') + 1 : out, 16, "tuned.lua");
  for (int want = 1; want <= 2; want++)
    for (int i = 0; i < r.n_best; i++) {
      if (r.best[i].ep != want)
        continue;
      FILE *f = fmemopen(text, sizeof text, "w");
      CHECK(f && tune_write_plan(f, plan_path, out, 0, NULL, &r.best[i], "tune", err, sizeof err) == 0);
      if (f)
        fclose(f);
      char line[96];
      snprintf(line, sizeof line, "  mesh = { tp = %d, pp = %d, dp = \"auto\", ep = %d },\n", r.best[i].tp,
               r.best[i].pp, want);
      CHECK_STR_CONTAINS(text, line);
      break;
    }
  tune_result_free(&r);
  plan_free(&p);
  if (compile(&p, 4, NULL, 0))
    return;
  CHECK(tune_search(&p, 4, &c, 0.10, 5, &r, err, sizeof err) == 0 && r.n_best > 0);
  if (r.n_best > 0) {
    CHECK(r.best[0].ep == 1 && !r.best[0].moe);
    FILE *f = fmemopen(text, sizeof text, "w");
    CHECK(f && tune_write_plan(f, plan_path, out, 0, NULL, &r.best[0], "tune", err, sizeof err) == 0);
    if (f)
      fclose(f);
    CHECK(strstr(text, "dp = \"auto\" },\n") && !strstr(text, "ep ="));
  }
  tune_result_free(&r);
  plan_free(&p);
}

/* tune searches mesh.cp only where no layout without it fits: with the device's memory ample, no
 * layout it keeps has cp; with it just short of the leanest cp-less layout's peak (so none fits with
 * 10% headroom), the layouts it keeps all have cp (2 or 4: the divisors of the world whose 2 · cp
 * chunks divide batch.seq = 32), each fitting, dp = world / (tp · cp · pp), and the plan it writes
 * states mesh.cp. */
static void test_tune_searches_cp(void)
{
  struct plan p;
  if (compile(&p, 4, NULL, 0))
    return;
  struct cluster c = easy();
  struct tune_result r;
  char err[256];
  CHECK(tune_search(&p, 4, &c, 0.10, 400, &r, err, sizeof err) == 0 && r.n_best > 0);
  double leanest = 0;
  for (int i = 0; i < r.n_best; i++) {
    CHECK_MSG(r.best[i].cp <= 1, "layout %d has cp %d though layouts without it fit", i, r.best[i].cp);
    leanest = i == 0 || r.best[i].max_bytes < leanest ? r.best[i].max_bytes : leanest;
  }
  const int tried = r.n_tried;
  tune_result_free(&r);
  c.device_memory = leanest / 0.9 * 0.999;
  CHECK(tune_search(&p, 4, &c, 0.10, 400, &r, err, sizeof err) == 0);
  CHECK_MSG(r.n_best > 0 && r.n_tried > tried, "%d layouts fit, %d tried (%d without cp)", r.n_best, r.n_tried, tried);
  for (int i = 0; i < r.n_best; i++) {
    const struct tune_choice *t = &r.best[i];
    CHECK_MSG((t->cp == 2 || t->cp == 4) && t->tp * t->cp * t->pp * t->dp == 4 && !t->zb &&
                t->max_bytes <= 0.9 * c.device_memory,
              "layout %d: tp %d cp %d pp %d dp %d, %.0f B", i, t->tp, t->cp, t->pp, t->dp, t->max_bytes);
  }
  if (r.n_best > 0) {
    char text[4096] = "", out[sizeof plan_path + 16], line[96];
    snprintf(out, sizeof out, "%s", plan_path);
    snprintf(strrchr(out, '/') ? strrchr(out, '/') + 1 : out, 16, "tuned.lua");
    FILE *f = fmemopen(text, sizeof text, "w");
    CHECK(f && tune_write_plan(f, plan_path, out, 0, NULL, &r.best[0], "tune", err, sizeof err) == 0);
    if (f)
      fclose(f);
    snprintf(line, sizeof line, "  mesh = { tp = %d, pp = %d, dp = \"auto\", cp = %d },\n", r.best[0].tp, r.best[0].pp,
             r.best[0].cp);
    CHECK_STR_CONTAINS(text, line);
  }
  tune_result_free(&r);
  plan_free(&p);
}

int main(void)
{
  const char *src = getenv("TYCHO_SOURCE_DIR");
  snprintf(plan_path, sizeof plan_path, "%s/tests/plans/good/dp_small.lua", src ? src : ".");
  static const struct test_case tests[] = { TEST(test_one_rank_is_three_forwards), TEST(test_pipeline_bubble),
                                            TEST(test_data_parallel_reduction), TEST(test_overheads),
                                            TEST(test_expert_parallel_all_to_all), TEST(test_tune_considers_ep),
                                            TEST(test_tune_searches_cp) };
  return test_run_all(tests, 7);
}
