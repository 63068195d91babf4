/* The compiled plan as JSON (the "plan" object of `tycho check --json`, docs/check-json.md)
 * and the plan hash, which is FNV-1a 64 over exactly that JSON: same plan, same bytes, same
 * hash on every machine; any field changed, a different hash. The plan file's path is not
 * part of it, so the same plan checked out in two folders has one hash. */
#include <stdio.h>
#include <string.h>

#include "plan.h"
#include "plan_json.h"
#include "util/hash.h"

static void layer_ranges_json(const struct plan *p, struct json *j)
{
  /* Runs of identical layers (same stage excluded: that is in "stages") keep the JSON small
   * for 80-layer models while listing every layer exactly once. */
  json_begin_array(j);
  int L = p->model.n_layers;
  for (int l = 0; l < L;) {
    int e = l + 1;
    while (e < L && memcmp(p->layers[e].split, p->layers[l].split, sizeof p->layers[l].split) == 0 &&
           p->layers[e].recompute == p->layers[l].recompute)
      e++;
    json_begin_object(j);
    json_key(j, "first");
    json_int(j, l);
    json_key(j, "last");
    json_int(j, e - 1);
    json_key(j, "split");
    json_begin_object(j);
    for (int m = PLAN_LAYER_MOD_FIRST; m <= PLAN_LAYER_MOD_LAST; m++) {
      json_key(j, plan_module_name(m));
      json_string(j, plan_split_name(p->layers[l].split[m]));
    }
    json_end_object(j);
    json_key(j, "recompute");
    json_begin_array(j);
    for (int b = 0; b < PLAN_RC_N_PARTS; b++)
      if (p->layers[l].recompute & (1 << b))
        json_string(j, plan_recompute_part_name(b));
    json_end_array(j);
    json_end_object(j);
    l = e;
  }
  json_end_array(j);
}

/* model.moe (docs/moe.md), with the sparse layers listed by index. */
static void moe_json(const struct plan *p, struct json *j)
{
  const struct plan_moe *e = &p->model.moe;
  json_key(j, "moe");
  json_begin_object(j);
  json_key(j, "experts"); json_int(j, e->experts);
  json_key(j, "top_k"); json_int(j, e->top_k);
  json_key(j, "ffn_dim"); json_int(j, e->ffn_dim);
  json_key(j, "aux_loss"); json_number(j, e->aux_loss);
  json_key(j, "z_loss"); json_number(j, e->z_loss);
  json_key(j, "capacity_factor"); json_number(j, e->capacity_factor);
  json_key(j, "layers_from"); json_string(j, e->layers_is_function ? "function" : "value");
  json_key(j, "n_layers"); json_int(j, e->n_layers);
  json_key(j, "layers");
  json_begin_array(j);
  for (int l = 0; l < p->model.n_layers; l++)
    if (p->layers && p->layers[l].moe)
      json_int(j, l);
  json_end_array(j);
  json_key(j, "active_params"); json_int(j, plan_active_param_count(p));
  json_end_object(j);
}

static void opt_string(struct json *j, const char *key, const char *value)
{
  json_key(j, key);
  if (value[0])
    json_string(j, value);
  else
    json_null(j);
}

void plan_json(const struct plan *p, struct json *j)
{
  const struct plan_model *m = &p->model;
  json_begin_object(j);
  json_key(j, "name");
  json_string(j, p->name);

  json_key(j, "model");
  json_begin_object(j);
  json_key(j, "family"); json_string(j, m->family);
  json_key(j, "n_layers"); json_int(j, m->n_layers);
  json_key(j, "dim"); json_int(j, m->dim);
  json_key(j, "n_heads"); json_int(j, m->n_heads);
  json_key(j, "n_kv_heads"); json_int(j, m->n_kv_heads);
  json_key(j, "head_dim"); json_int(j, m->head_dim);
  json_key(j, "ffn_dim"); json_int(j, m->ffn_dim);
  json_key(j, "vocab"); json_int(j, m->vocab);
  json_key(j, "vocab_padded"); json_int(j, m->vocab_padded);
  json_key(j, "max_seq"); json_int(j, m->max_seq);
  json_key(j, "norm_eps"); json_number(j, m->norm_eps);
  json_key(j, "rope_theta"); json_number(j, m->rope_theta);
  json_key(j, "dropout"); json_number(j, m->dropout);
  json_key(j, "tie_embeddings"); json_bool(j, m->tie_embeddings);
  json_key(j, "params"); json_int(j, plan_param_count(p));
  if (m->moe.experts > 0) /* only with experts: dense plans keep their hash */
    moe_json(p, j);
  json_end_object(j);

  json_key(j, "mesh");
  json_begin_object(j);
  json_key(j, "world"); json_int(j, p->mesh.world);
  json_key(j, "tp"); json_int(j, p->mesh.tp);
  json_key(j, "pp"); json_int(j, p->mesh.pp);
  json_key(j, "dp"); json_int(j, p->mesh.dp);
  json_key(j, "dp_auto"); json_bool(j, p->mesh.dp_auto);
  if (plan_ep(p) > 1) { /* only with expert parallelism: other plans keep their hash */
    json_key(j, "ep"); json_int(j, plan_ep(p));
  }
  json_key(j, "order");
  json_begin_array(j);
  for (int i = 0; i < PLAN_N_AXES; i++)
    json_string(j, plan_axis_name(p->mesh.order[i]));
  json_end_array(j);
  json_end_object(j);

  static const char *const stage_kinds[] = { "even", "balanced", "list", "function" };
  json_key(j, "stages_from"); json_string(j, stage_kinds[p->stages_kind]);
  json_key(j, "virtual_stages"); json_int(j, p->virtual_stages);
  json_key(j, "stages");
  json_begin_array(j);
  for (int s = 0; s < p->n_stages; s++) {
    const struct plan_stage *st = &p->stages[s];
    json_begin_object(j);
    json_key(j, "index"); json_int(j, st->index);
    json_key(j, "pp_rank"); json_int(j, st->pp_rank);
    json_key(j, "chunk"); json_int(j, st->chunk);
    json_key(j, "embed"); json_bool(j, st->has_embed);
    json_key(j, "head"); json_bool(j, st->has_head);
    json_key(j, "layers");
    json_begin_array(j);
    if (st->n_layers) {
      json_int(j, st->first_layer);
      json_int(j, st->first_layer + st->n_layers - 1);
    }
    json_end_array(j);
    json_end_object(j);
  }
  json_end_array(j);

  json_key(j, "tp_split");
  json_begin_object(j);
  json_key(j, "from"); json_string(j, p->tp_split_is_function ? "function" : "table");
  json_key(j, "embed"); json_string(j, plan_split_name(p->embed_split));
  json_key(j, "head"); json_string(j, plan_split_name(p->head_split));
  json_end_object(j);
  json_key(j, "layers");
  layer_ranges_json(p, j);
  json_key(j, "sequence_parallel"); json_bool(j, p->sequence_parallel);
  json_key(j, "zero"); json_int(j, p->zero);
  /* what ZeRO 2 and 3 do across a step's micro-batches (zero_every): shown when written or with
   * pipeline stages (the default then is "step"); a plan with neither runs as before the field
   * existed and keeps its hash */
  if (p->zero >= 2 && (p->zero_every.grads_set || p->zero_every.params_set || p->mesh.pp > 1)) {
    json_key(j, "zero_every");
    json_begin_object(j);
    json_key(j, "grads"); json_string(j, plan_zero_every_name(p->zero_every.grads));
    if (p->zero == 3) {
      json_key(j, "params"); json_string(j, plan_zero_every_name(p->zero_every.params));
    }
    json_end_object(j);
  }
  json_key(j, "bucket_mb"); json_number(j, p->bucket_mb);

  json_key(j, "schedule");
  json_begin_object(j);
  json_key(j, "kind"); json_string(j, plan_schedule_name(p->schedule));
  json_key(j, "microbatches"); json_int(j, p->batch.microbatches);
  json_end_object(j);

  json_key(j, "batch");
  json_begin_object(j);
  json_key(j, "global"); json_int(j, p->batch.global);
  json_key(j, "micro"); json_int(j, p->batch.micro);
  json_key(j, "seq"); json_int(j, p->batch.seq);
  json_key(j, "microbatches"); json_int(j, p->batch.microbatches);
  json_key(j, "dp"); json_int(j, p->mesh.dp);
  json_key(j, "tokens_per_step"); json_int(j, (long long)p->batch.global * p->batch.seq);
  json_end_object(j);

  json_key(j, "precision");
  json_begin_object(j);
  json_key(j, "compute"); json_string(j, plan_dtype_name(p->precision.compute));
  json_key(j, "grads"); json_string(j, plan_dtype_name(p->precision.grads));
  json_key(j, "master"); json_string(j, plan_dtype_name(p->precision.master));
  json_end_object(j);
  if (p->device != PLAN_DEVICE_AUTO) { /* only when given: plans without it keep their hash */
    json_key(j, "device"); json_string(j, plan_device_name(p->device));
  }

  json_key(j, "optimizer");
  json_begin_object(j);
  json_key(j, "kind"); json_string(j, p->optimizer.kind);
  json_key(j, "lr"); json_number(j, p->optimizer.lr);
  json_key(j, "beta1"); json_number(j, p->optimizer.beta1);
  json_key(j, "beta2"); json_number(j, p->optimizer.beta2);
  json_key(j, "eps"); json_number(j, p->optimizer.eps);
  json_key(j, "weight_decay"); json_number(j, p->optimizer.weight_decay);
  json_key(j, "grad_clip"); json_number(j, p->optimizer.grad_clip);
  json_end_object(j);

  json_key(j, "lr_schedule");
  json_begin_object(j);
  json_key(j, "warmup"); json_int(j, p->lr_schedule.warmup);
  json_key(j, "decay"); json_string(j, plan_decay_name(p->lr_schedule.decay));
  json_key(j, "decay_steps"); json_int(j, p->lr_schedule.decay_steps);
  json_key(j, "min_lr"); json_number(j, p->lr_schedule.min_lr);
  json_end_object(j);

  json_key(j, "seeds");
  json_begin_object(j);
  json_key(j, "global"); json_int(j, p->seeds.global);
  for (int s = 0; s < PLAN_N_SEEDS; s++) {
    json_key(j, plan_seed_name(s));
    json_begin_object(j);
    json_key(j, "value"); json_int(j, p->seeds.value[s]);
    json_key(j, "derived"); json_bool(j, p->seeds.derived[s]);
    json_key(j, "from");
    if (p->seeds.derived[s])
      json_string(j, "global");
    else
      json_null(j);
    json_end_object(j);
  }
  json_end_object(j);

  json_key(j, "data");
  json_begin_object(j);
  opt_string(j, "train", p->data.train);
  opt_string(j, "val", p->data.val);
  opt_string(j, "synthetic", p->data.synthetic);
  json_key(j, "shuffle"); json_bool(j, p->data.shuffle);
  json_end_object(j);
  json_key(j, "init");
  json_begin_object(j);
  opt_string(j, "from", p->init.from);
  json_end_object(j);
  json_key(j, "export");
  json_begin_object(j);
  opt_string(j, "path", p->export_.path);
  json_key(j, "every"); json_int(j, p->export_.every);
  json_end_object(j);
  json_key(j, "train");
  json_begin_object(j);
  json_key(j, "steps"); json_int(j, p->train.steps);
  json_key(j, "eval_every"); json_int(j, p->train.eval_every);
  json_key(j, "eval_batches"); json_int(j, p->train.eval_batches);
  if (p->train.max_loss_jump > 0) { /* only when set: plans without it keep their hash */
    json_key(j, "max_loss_jump"); json_number(j, p->train.max_loss_jump);
  }
  json_end_object(j);
  json_key(j, "checkpoint");
  json_begin_object(j);
  opt_string(j, "dir", p->checkpoint.dir);
  json_key(j, "every"); json_int(j, p->checkpoint.every);
  json_key(j, "keep"); json_int(j, p->checkpoint.keep);
  json_key(j, "async"); json_bool(j, p->checkpoint.async);
  if (p->checkpoint.allow_changes) { /* only when given: plans without it keep their hash */
    json_key(j, "allow_changes");
    json_begin_array(j);
    for (int i = 0; i < PLAN_N_RESUME_NAMES; i++)
      if (p->checkpoint.allow_changes >> i & 1)
        json_string(j, plan_resume_field_name(i));
    json_end_array(j);
  }
  json_end_object(j);
  json_key(j, "log");
  json_begin_object(j);
  json_key(j, "every"); json_int(j, p->log.every);
  opt_string(j, "metrics", p->log.metrics);
  opt_string(j, "trace", p->log.trace);
  if (p->log.trace[0]) { /* only with a trace: plans without one keep their hash */
    json_key(j, "trace_steps"); json_int(j, p->log.trace_steps);
  }
  json_end_object(j);
  json_end_object(j);
}

uint64_t plan_hash(const struct plan *p)
{
  struct strbuf b;
  struct json j;
  sb_init(&b);
  json_init(&j, &b);
  plan_json(p, &j);
  uint64_t h = hash_fnv1a64_bytes(b.s, b.n);
  if (b.failed)
    h = 0; /* out of memory: a hash no real plan has */
  sb_free(&b);
  return h;
}
