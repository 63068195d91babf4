/* The step-time model (cost.h). */
#include "check/cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layout/tp_layout.h"
#include "layout/bill.h"
#include "mesh/mesh.h"
#include "sched/sched.h"
#include "util/err.h"

/* Whether the group of axis `a` fits in one node: its members are stride apart, stride the
 * product of the sizes of the axes before it in the mesh order. */
static int group_intra(const struct plan_mesh *m, enum plan_axis a, int gpus_per_node)
{
  return (long long)mesh_axis_stride(m, a) * mesh_axis_size(m, a) <= gpus_per_node;
}

static const struct cluster_link *link_of(const struct cluster *c, int intra)
{
  return intra ? &c->intra : &c->inter;
}

/* The link's latency for collective `comm` (enum comm_op: its own where the file states it). */
static double op_latency(const struct cluster_link *l, int comm)
{
  return comm >= 0 && comm < 3 && l->op_bandwidth[comm] > 0 ? l->op_latency[comm] : l->latency;
}

/* Whether an ep group fits in one node: ep consecutive dp ranks, dp's stride apart. */
static int ep_group_intra(const struct plan_mesh *m, int gpus_per_node)
{
  return (long long)mesh_axis_stride(m, PLAN_AXIS_DP) * (m->ep > 1 ? m->ep : 1) <= gpus_per_node;
}

/* One all-to-all of `bytes` from each of n ranks (cost.h: nccl-tests' bus bandwidth for it). */
static double all_to_all(double bytes, int n, const struct cluster_link *l, double eff)
{
  return n <= 1 ? 0.0 : (double)(n - 1) / n * bytes / (l->bandwidth * eff) + (n - 1) * l->latency;
}

/* Ring cost of one collective of `bytes` (the whole buffer) over n ranks. */
static double ring(int comm, double bytes, int n, const struct cluster_link *l, double eff)
{
  if (n <= 1)
    return 0.0;
  const int own = comm >= 0 && comm < 3 && l->op_bandwidth[comm] > 0;
  const double bw = (own ? l->op_bandwidth[comm] : l->bandwidth) * eff;
  const double steps = comm == 0 ? 2.0 * (n - 1) : (double)(n - 1);
  return steps / n * bytes / bw + steps * op_latency(l, comm);
}

double cost_pointwise_elems(const struct plan *p)
{
  const int tp = p->mesh.tp;
  const double C = p->model.dim, F = p->model.ffn_dim;
  return (tp > 1 && p->sequence_parallel ? C / tp : C) + F / tp;
}

double check_element_bytes(const struct plan *p, enum plan_dtype d)
{
  return plan_on_cpu(p) ? bill_element_bytes(p, d) : plan_dtype_bytes(d);
}

int cost_predict(const struct plan *p, const struct cluster *c, struct cost *out, char *err, size_t err_size)
{
  memset(out, 0, sizeof *out);
  const struct plan_mesh *me = &p->mesh;
  const int S = p->n_stages, L = p->model.n_layers, M = p->batch.microbatches, tp = me->tp;
  const int cp = me->cp > 1 ? me->cp : 1;
  /* per micro-batch and rank: a cp rank's share of each sequence (its two balanced chunks, so
   * also a 1/cp share of the causal attention's work) */
  const double tokens = (double)p->batch.micro * p->batch.seq / cp;
  const double rate = c->peak_flops * c->compute_efficiency;
  const double att_rate = c->attention_flops > 0 ? c->attention_flops : rate;
  /* devices shared: more ranks than the stated nodes hold devices */
  const double devices = c->nodes > 0 ? (double)c->nodes * c->gpus_per_node : 0;
  const double share = devices > 0 && me->world > devices ? me->world / devices : 1.0;
  const int per_node = share > 1 ? (int)ceil(me->world / (double)c->nodes) : c->gpus_per_node;
  out->share = share;
  /* what the comm layer moves (traffic_element_bytes): on the CPU its reals, whatever the plan computes in */
  const double eb = traffic_element_bytes(p, p->precision.compute), gb = traffic_element_bytes(p, p->precision.grads);
  out->tp.intra = group_intra(me, PLAN_AXIS_TP, per_node);
  /* under mesh.cp the dp layer's group is dp × cp: on the intra-node link when both spans fit */
  out->dp.intra = group_intra(me, PLAN_AXIS_DP, per_node) && (cp <= 1 || group_intra(me, PLAN_AXIS_CP, per_node));
  out->pp.intra = group_intra(me, PLAN_AXIS_PP, per_node);
  out->ep.intra = ep_group_intra(me, per_node);
  out->cp.intra = group_intra(me, PLAN_AXIS_CP, per_node);
  /* expert parallelism: one sparse layer's all-to-alls per micro-batch, forward and backward */
  const int ep = plan_ep(p);
  const struct plan_ep_exchange x = plan_ep_exchange(p);
  const struct cluster_link *epl = link_of(c, out->ep.intra);
  const double a2a = all_to_all((double)x.row_elems * traffic_wire_element_bytes(p), ep, epl, c->comm_efficiency);
  const double ep_fwd = x.row_calls / 2 * a2a + x.count_calls * all_to_all((double)x.count_bytes, ep, epl,
                                                                             c->comm_efficiency);
  const double ep_bwd = x.row_calls / 2 * a2a;

  /* per stage: forward, backward and recompute seconds of one micro-batch, TP comm included */
  double *fwd = calloc((size_t)S, sizeof *fwd), *bwd = calloc((size_t)S, sizeof *bwd);
  double *rec = calloc((size_t)S, sizeof *rec), *tpc = calloc((size_t)S, sizeof *tpc);
  double *pw = calloc((size_t)S, sizeof *pw), *epc = calloc((size_t)S, sizeof *epc);
  double *wgt = calloc((size_t)S, sizeof *wgt); /* the weight-gradient products: a split backward's W */
  double *cpc = calloc((size_t)S, sizeof *cpc), *cpx = calloc((size_t)S, sizeof *cpx); /* the ring: exposed, all */
  int *stage_of_layer = calloc((size_t)L + 2, sizeof *stage_of_layer);
  const int rows = p->batch.seq / cp; /* a cp rank's tokens of a sequence (T % (2 · cp) = 0 assumed) */
  int n_tp = tp_comm_list(p, p->batch.micro, rows, NULL, 0);
  struct tp_comm *list = n_tp ? calloc((size_t)n_tp, sizeof *list) : NULL;
  if (!fwd || !bwd || !rec || !tpc || !pw || !epc || !wgt || !cpc || !cpx || !stage_of_layer || (n_tp && !list)) {
    free(wgt);
    free(fwd); free(bwd); free(rec); free(tpc); free(pw); free(epc); free(stage_of_layer); free(list);
    free(cpc); free(cpx);
    return errf(err, err_size, "out of memory for the cost model");
  }
  tp_comm_list(p, p->batch.micro, rows, list, n_tp);
  /* context parallelism's ring (runtime/parallel/cp.c), per layer and micro-batch: cp steps, each
   * computing the rank's blocks against the k, v pair held (a 1/cp share of its attention core)
   * while the next pair travels (one message of 2 · micro · rows · NKV · HS elements to the next
   * rank, NKV the rank's tp share of the kv heads). A step takes the longer of the two: the
   * forward exposes Σ over its cp − 1 hops of max(0, transfer − block); the backward computes
   * twice the block and sends the pair and the dk, dv accumulator (twice the bytes) a step,
   * exposing max(0, 2 · transfer − 2 · block) per hop and the accumulators' last hop home whole.
   * ring_fwd and ring_bwd: those exposed seconds of one layer (its blocks' time is the core's, in
   * compute already); cp.total every transfer's time. */
  double ring_fwd = 0, ring_bwd = 0, ring_xfer = 0;
  if (cp > 1) {
    const int nkv = p->model.n_kv_heads % tp == 0 ? p->model.n_kv_heads / tp : p->model.n_heads / tp;
    const double pair = 2.0 * p->batch.micro * rows * (nkv > 0 ? nkv : 1) * p->model.head_dim * eb;
    const struct cluster_link *cpl = link_of(c, out->cp.intra);
    const double t_pair = pair / (cpl->bandwidth * c->comm_efficiency) + cpl->latency;
    const double block = plan_layer_flops(p).attn_core * tokens / tp / att_rate * share / cp;
    const double hop_f = c->no_overlap ? t_pair : fmax(0.0, t_pair - block);
    const double hop_b = c->no_overlap ? 2 * t_pair : fmax(0.0, 2 * t_pair - 2 * block);
    ring_fwd = (cp - 1) * hop_f;
    ring_bwd = (cp - 1) * hop_b + t_pair;
    ring_xfer = t_pair; /* per hop; counted below */
  }
  const struct plan_layer_flops lf = plan_layer_flops(p);
  double model_fwd_per_token = plan_model_flops(p); /* with model.moe: the active experts */
  for (int s = 0; s < S; s++) {
    const struct plan_stage *st = &p->stages[s];
    const struct plan_stage_flops sf = plan_stage_flops(p, s);
    double f = sf.forward, r = sf.recompute, f_att = 0, r_att = 0, n_rc = 0, n_sparse = 0;
    for (int l = st->first_layer; st->first_layer >= 0 && l < st->first_layer + st->n_layers; l++) {
      stage_of_layer[l + 1] = s;
      n_sparse += p->layers && p->layers[l].moe ? 1 : 0;
      const uint8_t mask = p->layers ? p->layers[l].recompute : 0;
      f_att += lf.attn_core;
      r_att += mask & (PLAN_RC_ATTN | PLAN_RC_ATTN_CORE) ? lf.attn_core : 0;
      n_rc += mask ? 1 : 0;
    }
    f -= f_att;
    r -= r_att;
    if (st->has_embed)
      stage_of_layer[0] = s;
    if (st->has_head)
      stage_of_layer[L + 1] = s;
    const double n_layers = st->first_layer >= 0 ? st->n_layers : 0;
    const double pw_token = c->pointwise_s * cost_pointwise_elems(p) * tokens * share; /* per layer */
    fwd[s] = (f * tokens / tp / rate + f_att * tokens / tp / att_rate) * share;
    bwd[s] = 2 * fwd[s];
    wgt[s] = f * tokens / tp / rate * share; /* every linear's product again, for its weights */
    rec[s] = (r * tokens / tp / rate + r_att * tokens / tp / att_rate) * share;
    fwd[s] += pw_token * n_layers / 3;
    bwd[s] += pw_token * n_layers * 2 / 3;
    rec[s] += pw_token * n_rc / 3;
    pw[s] = pw_token * (n_layers + n_rc / 3);
    double n_here = 0, n_rc_core = 0; /* layers here; of them those whose recompute reruns the core */
    for (int l = st->first_layer; st->first_layer >= 0 && l < st->first_layer + st->n_layers; l++) {
      n_here++;
      n_rc_core += p->layers && p->layers[l].recompute & (PLAN_RC_ATTN | PLAN_RC_ATTN_CORE) ? 1 : 0;
    }
    fwd[s] += n_here * ring_fwd;
    bwd[s] += n_here * ring_bwd;
    rec[s] += n_rc_core * ring_fwd;
    cpc[s] = n_here * ring_fwd + n_here * ring_bwd + n_rc_core * ring_fwd;
    cpx[s] = (n_here + n_rc_core) * (cp - 1) * ring_xfer + n_here * (2.0 * cp - 1) * ring_xfer;
    fwd[s] += n_sparse * ep_fwd; /* blocking, as the tp collectives */
    bwd[s] += n_sparse * ep_bwd;
    epc[s] = n_sparse * (ep_fwd + ep_bwd);
  }
  const struct cluster_link *tpl = link_of(c, out->tp.intra);
  for (int i = 0; i < n_tp; i++) {
    int s = stage_of_layer[list[i].layer + 1];
    const double bytes = (double)list[i].n_elems * traffic_tp_element_bytes(p, &list[i]);
    const double t = ring(list[i].comm, bytes, tp, tpl, c->comm_efficiency);
    if (list[i].backward)
      bwd[s] += t;
    else
      fwd[s] += t;
    tpc[s] += t;
    out->tp.bytes += list[i].comm == 0 ? 2.0 * (tp - 1) / tp * bytes * M : (double)(tp - 1) / tp * bytes * M;
  }

  /* the pipeline: the simulator with these costs, sends at the pp link's cost */
  struct sched sch;
  struct sched_sim sim;
  if (sched_from_plan(p, &sch, err, err_size)) {
    sched_free(&sch);
    free(wgt);
    free(fwd); free(bwd); free(rec); free(tpc); free(pw); free(epc); free(stage_of_layer); free(list);
    free(cpc); free(cpx);
    return 1;
  }
  for (int s = 0; s < S; s++) {
    sch.costs.fwd[s] = fwd[s];
    sch.costs.bwd[s] = bwd[s];
    sch.costs.recompute[s] = rec[s];
    /* a split backward's W: the weight products alone; the attention core's backward, pointwise
     * work and the tp and ep collectives are B's (the input gradient waits for them) */
    sch.costs.w_share[s] = bwd[s] > 0 ? wgt[s] / bwd[s] : 0;
  }
  free(wgt);
  const double boundary = tokens / (tp > 1 && p->sequence_parallel ? tp : 1) * p->model.dim *
                          traffic_wire_element_bytes(p);
  const struct cluster_link *ppl = link_of(c, out->pp.intra);
  sch.costs.comm = me->pp > 1 ? boundary / (ppl->bandwidth * c->comm_efficiency) + ppl->latency : 0.0;
  if (sched_simulate(&sch, &sim, err, err_size)) {
    sched_free(&sch);
    free(fwd); free(bwd); free(rec); free(tpc); free(pw); free(epc); free(stage_of_layer); free(list);
    free(cpc); free(cpx);
    return 1;
  }
  double busiest = 0, makespan = sim.makespan, tp_time = 0, ep_time = 0, cp_time = 0;
  int busy_rank = 0;
  for (int r = 0; r < me->pp; r++)
    if (sim.ranks[r].busy > busiest) {
      busiest = sim.ranks[r].busy;
      busy_rank = r;
    }
  for (int s = 0; s < S; s++)
    if (p->stages[s].pp_rank == busy_rank) {
      tp_time += tpc[s] * M;
      ep_time += epc[s] * M;
      cp_time += cpc[s] * M;
      out->cp.total += cpx[s] * M;
      out->pointwise += pw[s] * M;
    }
  out->tp.total = out->tp.exposed = tp_time;
  out->ep.total = out->ep.exposed = ep_time;
  if (ep > 1) { /* what leaves the busiest rank: its send buffers less its own blocks */
    unsigned long long ep_calls, ep_bytes;
    plan_ep_step_traffic(p, busy_rank, traffic_wire_element_bytes(p), &ep_calls, &ep_bytes);
    out->ep.bytes = (double)(ep - 1) / ep * (double)ep_bytes;
  }
  out->cp.exposed = cp_time;
  if (cp > 1) { /* what leaves the busiest rank: its ring messages of a step (bill.h's traffic) */
    struct traffic tr;
    char why[256];
    if (!traffic_predict(p, busy_rank, &tr, why, sizeof why))
      out->cp.bytes = (double)tr.bytes[TRAFFIC_CP][COMM_SEND];
  }
  out->compute = busiest - tp_time - ep_time - cp_time;
  out->bubble = makespan - busiest;
  out->pp.bytes = me->pp > 1 ? 2.0 * boundary * M : 0.0; /* activations out, gradients back */
  out->pp.total = me->pp > 1 ? 2.0 * M * sch.costs.comm : 0.0;
  out->pp.exposed = 0.0; /* inside the makespan: the simulator waits for them */
  sched_sim_free(&sim);
  sched_free(&sch);

  /* data parallel, for the rank with the most parameters: the dense ones over dp, with expert
   * parallelism the experts (this rank's E/ep of them) over the dp / ep ranks holding the same
   * experts (dp.h), which span the dp group's nodes */
  double n_local = 0, n_expert = 0;
  for (int r = 0; r < me->pp; r++) {
    double n, ne;
    if (bill_rank_params(p, r, &n, &ne, err, err_size))
      break;
    if (n > n_local) {
      n_local = n;
      n_expert = ne;
    }
  }
  /* under mesh.cp the dp layer reduces and shards over dp × cp ranks (the "dpcp" group) */
  const int dp = me->dp * cp, edp = ep > 1 ? dp / ep : dp;
  const struct cluster_link *dpl = link_of(c, out->dp.intra);
  const double bwd_mb = busiest > 0 ? 2.0 / 3.0 * (out->compute / M) : 0.0; /* one micro-batch's backward */
  const double part_elems[2] = { ep > 1 ? n_local - n_expert : n_local, ep > 1 ? n_expert : 0.0 };
  const int part_size[2] = { dp, edp };
  for (int part = 0; part < 2; part++) {
    const int n = part_size[part];
    if (n <= 1 || part_elems[part] <= 0)
      continue;
    const double gbytes = part_elems[part] * gb, pbytes = part_elems[part] * eb;
    const double buckets = fmax(1.0, ceil(gbytes / (p->bucket_mb * 1048576.0)));
    double t_reduce, exposed;
    if (p->zero < 2) {
      t_reduce = ring(0, gbytes, n, dpl, c->comm_efficiency) + (buckets - 1) * 2.0 * (n - 1) * op_latency(dpl, 0);
      exposed = c->no_overlap ? t_reduce : fmax(0.0, t_reduce - bwd_mb); /* buckets start during the last backward */
      out->dp.bytes += 2.0 * (n - 1) / n * gbytes;
    } else { /* zero_every.grads: in every micro-batch's backward, or once in each stage's last */
      const double n_rs = p->zero_every.grads == PLAN_ZERO_EVERY_STEP ? 1.0 : M;
      double rs = ring(2, gbytes, n, dpl, c->comm_efficiency) + (buckets - 1) * (n - 1) * op_latency(dpl, 2);
      t_reduce = rs * n_rs;
      exposed = c->no_overlap ? t_reduce : n_rs * fmax(0.0, rs - bwd_mb);
      out->dp.bytes += (double)(n - 1) / n * gbytes * n_rs;
    }
    double t_gather = 0;
    if (p->zero >= 1 && p->zero < 3) { /* the new parameters after the update */
      t_gather = ring(1, pbytes, n, dpl, c->comm_efficiency);
      exposed += t_gather;
      out->dp.bytes += (double)(n - 1) / n * pbytes;
    }
    if (p->zero == 3) { /* gathered before each forward and backward, or once a step (zero_every.params), prefetched */
      const double n_ag = p->zero_every.params == PLAN_ZERO_EVERY_STEP ? 1.0 : 2.0 * M;
      double ag = ring(1, pbytes, n, dpl, c->comm_efficiency);
      t_gather = n_ag * ag;
      exposed += c->no_overlap ? t_gather : fmax(0.0, t_gather - out->compute);
      out->dp.bytes += n_ag * (double)(n - 1) / n * pbytes;
    }
    out->dp.total += t_reduce + t_gather;
    out->dp.exposed += exposed;
  }
  /* the optimizer on the elements this rank updates: its stage's, a 1/dp shard from zero 1 */
  out->optimizer = c->optimizer_s * (part_elems[0] / (p->zero >= 1 ? dp : 1) + part_elems[1] / (p->zero >= 1 ? edp : 1)) *
                   share;
  out->step = makespan + out->dp.exposed + out->optimizer;
  const double global_tokens = (double)p->batch.global * p->batch.seq;
  out->model_flops = 3.0 * model_fwd_per_token * global_tokens;
  out->tokens_per_s = out->step > 0 ? global_tokens / out->step : 0;
  out->mfu = out->step > 0 ? out->model_flops / (out->step * me->world * c->peak_flops) : 0;
  free(fwd); free(bwd); free(rec); free(tpc); free(pw); free(epc); free(stage_of_layer); free(list);
    free(cpc); free(cpx);
  return 0;
}
