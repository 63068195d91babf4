/* The compiled plan as JSON (the "plan" object of `tycho check --json`, docs/check-json.md)
 * and the plan hash, which is FNV-1a 64 over exactly that JSON: same plan, same bytes, same
 * hash on every machine; any field changed, a different hash. The plan file's path is not
 * part of it, so the same plan checked out in two folders has one hash. The fields' values are
 * written as the plan-field table says (fields.h); the order of the keys is this file's. */
#include <stdio.h>
#include <string.h>

#include "fields.h"
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
  plan_fields_json("model.moe", p, j);
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

void plan_json(const struct plan *p, struct json *j)
{
  const struct plan_model *m = &p->model;
  json_begin_object(j);
  plan_field_json(plan_field_find("name"), p, j);

  json_key(j, "model");
  json_begin_object(j);
  /* the fields, with what plan_validate derives next to what it is derived from */
  static const char *const model_fields[] = { "family", "n_layers", "dim", "n_heads", "n_kv_heads", "head_dim",
                                              "ffn_dim", "vocab", "vocab_padded", "max_seq", "norm_eps",
                                              "rope_theta", "dropout", "tie_embeddings", NULL };
  for (int i = 0; model_fields[i]; i++) {
    char path[64];
    snprintf(path, sizeof path, "model.%s", model_fields[i]);
    const struct plan_field *f = plan_field_find(path);
    if (f) {
      plan_field_json(f, p, j);
    } else {
      json_key(j, model_fields[i]);
      json_int(j, strcmp(model_fields[i], "head_dim") == 0 ? m->head_dim : m->vocab_padded);
    }
  }
  json_key(j, "params"); json_int(j, plan_param_count(p));
  if (m->moe.experts > 0) /* only with experts: dense plans keep their hash */
    moe_json(p, j);
  json_end_object(j);

  json_key(j, "mesh");
  json_begin_object(j);
  json_key(j, "world"); json_int(j, p->mesh.world);
  plan_field_json(plan_field_find("mesh.tp"), p, j);
  plan_field_json(plan_field_find("mesh.pp"), p, j);
  json_key(j, "dp"); json_int(j, p->mesh.dp);
  json_key(j, "dp_auto"); json_bool(j, p->mesh.dp_auto);
  if (plan_ep(p) > 1) { /* only with expert parallelism: other plans keep their hash */
    json_key(j, "ep"); json_int(j, plan_ep(p));
  }
  if (p->mesh.cp > 1) { /* only with context parallelism: other plans keep their hash */
    json_key(j, "cp"); json_int(j, p->mesh.cp);
  }
  json_key(j, "order");
  json_begin_array(j);
  for (int i = 0; i < PLAN_N_AXES; i++)
    if (p->mesh.order[i] != PLAN_AXIS_CP || p->mesh.cp > 1)
      json_string(j, plan_axis_name(p->mesh.order[i]));
  json_end_array(j);
  json_end_object(j);

  static const char *const stage_kinds[] = { "even", "balanced", "list", "function" };
  json_key(j, "stages_from"); json_string(j, stage_kinds[p->stages_kind]);
  plan_field_json(plan_field_find("virtual_stages"), p, j);
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
  plan_field_json(plan_field_find("sequence_parallel"), p, j);
  plan_field_json(plan_field_find("zero"), p, j);
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
  plan_field_json(plan_field_find("bucket_mb"), p, j);

  json_key(j, "schedule");
  json_begin_object(j);
  plan_field_json(plan_field_find("schedule.kind"), p, j);
  json_key(j, "microbatches"); json_int(j, p->batch.microbatches);
  json_end_object(j);

  json_key(j, "batch");
  json_begin_object(j);
  plan_fields_json("batch", p, j);
  json_key(j, "microbatches"); json_int(j, p->batch.microbatches);
  json_key(j, "dp"); json_int(j, p->mesh.dp);
  json_key(j, "tokens_per_step"); json_int(j, (long long)p->batch.global * p->batch.seq);
  json_end_object(j);

  json_key(j, "precision");
  json_begin_object(j);
  plan_fields_json("precision", p, j);
  json_end_object(j);
  if (p->device != PLAN_DEVICE_AUTO) { /* only when given: plans without it keep their hash */
    plan_field_json(plan_field_find("device"), p, j);
  }
  if (p->comm != PLAN_COMM_AUTO) /* likewise */
    plan_field_json(plan_field_find("comm"), p, j);

  json_key(j, "optimizer");
  json_begin_object(j);
  plan_fields_json("optimizer", p, j);
  json_end_object(j);

  json_key(j, "lr_schedule");
  json_begin_object(j);
  plan_fields_json("lr_schedule", p, j);
  json_end_object(j);

  json_key(j, "seeds");
  json_begin_object(j);
  plan_field_json(plan_field_find("seeds.global"), p, j);
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
  for (int i = 0; i < plan_n_fields; i++) { /* data.text's fields only when given: other plans keep their hash */
    const char *path = plan_fields[i].path;
    const int text_field = !strcmp(path, "data.tokenizer") || !strcmp(path, "data.val_fraction") ||
                           !strcmp(path, "data.fetch");
    if (!strncmp(path, "data.", 5) && (p->data.n_text || !text_field))
      plan_field_json(&plan_fields[i], p, j);
  }
  if (p->data.n_text) {
    json_key(j, "text");
    json_begin_array(j);
    for (int i = 0; i < p->data.n_text; i++)
      json_string(j, p->data.text[i]);
    json_end_array(j);
  }
  json_end_object(j);
  json_key(j, "init");
  json_begin_object(j);
  plan_fields_json("init", p, j);
  json_end_object(j);
  json_key(j, "export");
  json_begin_object(j);
  plan_field_json(plan_field_find("export.path"), p, j);
  plan_field_json(plan_field_find("export.every"), p, j);
  if (strcmp(p->export_.format, "safetensors") != 0) { /* only when set: plans without it keep their hash */
    plan_field_json(plan_field_find("export.format"), p, j);
    plan_field_json(plan_field_find("export.shard_mb"), p, j);
  }
  json_end_object(j);
  json_key(j, "train");
  json_begin_object(j);
  plan_field_json(plan_field_find("train.steps"), p, j);
  plan_field_json(plan_field_find("train.eval_every"), p, j);
  plan_field_json(plan_field_find("train.eval_batches"), p, j);
  if (p->train.max_loss_jump > 0) /* only when set: plans without it keep their hash */
    plan_field_json(plan_field_find("train.max_loss_jump"), p, j);
  json_end_object(j);
  json_key(j, "checkpoint");
  json_begin_object(j);
  plan_fields_json("checkpoint", p, j);
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
  plan_field_json(plan_field_find("log.every"), p, j);
  plan_field_json(plan_field_find("log.metrics"), p, j);
  plan_field_json(plan_field_find("log.trace"), p, j);
  if (p->log.trace[0]) /* only with a trace: plans without one keep their hash */
    plan_field_json(plan_field_find("log.trace_steps"), p, j);
  if (p->log.tensorboard[0]) { /* only when given: plans without it keep their hash */
    plan_field_json(plan_field_find("log.tensorboard"), p, j);
    plan_field_json(plan_field_find("log.tensorboard_ranks"), p, j);
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
