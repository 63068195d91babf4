/* Hugging Face model folders: config.json refused by field for what tycho does not implement and
 * round-tripped through its writer; a trained model written as a folder of small shards (each
 * within the size, every tensor once in the index, sizes summing to total_size) and read back by
 * weights_load to the same bits (fp32 numbers rounded in the float64 build); the plan's model
 * checked against the folder's config with both values named; an export path that is a link, a
 * file or a folder of someone else's files refused; a second export replacing the first. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "check.h"
#include "io/hf.h"
#include "io/safetensors.h"
#include "runtime/train/train.h"
#include "runtime/model/weights.h"
#include "runtime_fixture.h"
#include "util/json.h"
#include "util/path.h"

#include <ftw.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char err[1024];
static char dir[64];

static const struct fixture_shape shape = { 2, 32, 4, 2, 64, 64, 16, 4, 2 };

static const char *temp_path(const char *name)
{
  static char path[8][256];
  static int next;
  if (!dir[0]) {
    strcpy(dir, "/tmp/test_hf.XXXXXX");
    if (!mkdtemp(dir))
      return "/nonexistent";
  }
  char *p = path[next++ % 8];
  snprintf(p, sizeof path[0], "%s/%s", dir, name);
  return p;
}

static int parse(const char *text, struct hf_config *c)
{
  return hf_config_parse(c, text, strlen(text), "m/config.json", err, sizeof err);
}

#define LLAMA "{\"architectures\":[\"LlamaForCausalLM\"],\"num_hidden_layers\":2,\"hidden_size\":32," \
  "\"num_attention_heads\":4,\"intermediate_size\":64,\"vocab_size\":64"

static void config_fields_tycho_lacks_are_refused_by_name(void)
{
  static const struct { const char *json, *msg; } cases[] = {
    { LLAMA ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}",
      "m/config.json: rope_scaling of type 'llama3' is not one tycho implements: tycho's RoPE is unscaled" },
    { LLAMA ",\"attention_bias\":true}", "m/config.json: attention_bias is set: tycho's attention products have no bias" },
    { LLAMA ",\"hidden_act\":\"gelu\"}", "m/config.json: hidden_act 'gelu' is not one tycho implements (silu)" },
    { LLAMA ",\"quantization_config\":{}}",
      "m/config.json: field 'quantization_config' is not one tycho implements (nor metadata it knows to be harmless)" },
    { LLAMA ",\"head_dim\":16}",
      "m/config.json: head_dim 16 is not hidden_size / num_attention_heads (32 / 4): tycho's heads split hidden_size" },
    { "{\"architectures\":[\"Qwen2ForCausalLM\"]}",
      "m/config.json: architecture 'Qwen2ForCausalLM' is not one tycho implements (LlamaForCausalLM, MixtralForCausalLM)" },
    { "{\"model_type\":\"mixtral\",\"num_hidden_layers\":2,\"hidden_size\":32,\"num_attention_heads\":4,"
      "\"intermediate_size\":64,\"vocab_size\":64,\"sliding_window\":4096}",
      "m/config.json: sliding_window 4096 is shorter than max_position_embeddings 131072: tycho's attention is not windowed" },
    { "{\"model_type\":\"llama\",\"hidden_size\":32}", "m/config.json: no num_hidden_layers" },
    { LLAMA ",\"num_local_experts\":8}",
      "m/config.json: field 'num_local_experts' is not one tycho implements (nor metadata it knows to be harmless)" },
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct hf_config c;
    err[0] = '\0';
    CHECK_MSG(parse(cases[i].json, &c) == 2, "case %zu accepted", i);
    CHECK_MSG(strcmp(err, cases[i].msg) == 0, "case %zu: '%s'", i, err);
  }
  /* metadata and transformers' defaults */
  struct hf_config c;
  CHECK_MSG(parse(LLAMA ",\"torch_dtype\":\"bfloat16\",\"bos_token_id\":1,\"rope_scaling\":null}", &c) == 0, "%s", err);
  CHECK(c.n_kv_heads == 4 && c.max_seq == 2048 && c.norm_eps == 1e-6 && c.rope_theta == 10000 && !c.tie_embeddings &&
        c.experts == 0);
}

static int same_config(const struct hf_config *a, const struct hf_config *b)
{
  return a->n_layers == b->n_layers && a->dim == b->dim && a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads &&
         a->ffn_dim == b->ffn_dim && a->vocab == b->vocab && a->max_seq == b->max_seq && a->norm_eps == b->norm_eps &&
         a->rope_theta == b->rope_theta && a->tie_embeddings == b->tie_embeddings && a->experts == b->experts &&
         a->top_k == b->top_k && a->aux_loss == b->aux_loss;
}

static void config_text_reads_back_the_same(void)
{
  const struct hf_config in[2] = {
    { 4, 128, 8, 4, 384, 64, 32, 1e-5, 10000, 1, 0, 0, 0 },
    { 32, 4096, 32, 8, 14336, 32000, 32768, 1e-5, 1e6, 0, 8, 2, 0.02 },
  };
  for (int i = 0; i < 2; i++) {
    size_t n;
    char *text = hf_config_text(&in[i], &n);
    struct hf_config out;
    CHECK(text && hf_config_parse(&out, text, n, "c", err, sizeof err) == 0);
    CHECK_MSG(same_config(&in[i], &out), "config %d: %s", i, text);
    CHECK(strstr(text, i ? "[\"MixtralForCausalLM\"]" : "[\"LlamaForCausalLM\"]") &&
          strstr(text, "\"torch_dtype\":\"float32\""));
    free(text);
  }
}

/* The folder's index against its shards: every tensor once, in the shard the index names, the
 * tensors' bytes summing to metadata.total_size; *n_shards the shards. */
static void check_index(const char *folder, int n_params, int *n_shards, uint64_t shard_bytes)
{
  char path[300];
  snprintf(path, sizeof path, "%s/" HF_INDEX, folder);
  struct st_index ix;
  CHECK_MSG(st_index_open(&ix, path, err, sizeof err) == 0, "%s", err);
  *n_shards = ix.n_shards;
  CHECK(ix.n_entries == n_params);
  int in_shards = 0;
  uint64_t bytes = 0;
  for (int s = 0; s < ix.n_shards; s++) {
    char want[48];
    snprintf(want, sizeof want, "model-%05d-of-%05d.safetensors", s + 1, ix.n_shards);
    CHECK_MSG(strcmp(ix.shard_files[s], want) == 0, "%s", ix.shard_files[s]);
    in_shards += ix.shards[s].n_tensors;
    struct stat st;
    CHECK(stat(ix.shards[s].path, &st) == 0);
    CHECK_MSG((uint64_t)st.st_size <= shard_bytes || ix.shards[s].n_tensors == 1, "%s: %lld bytes",
              ix.shards[s].path, (long long)st.st_size);
    for (int t = 0; t < ix.shards[s].n_tensors; t++) {
      const struct st_file *f;
      CHECK(st_index_find(&ix, ix.shards[s].tensors[t].name, &f) && f == &ix.shards[s]);
      bytes += ix.shards[s].tensors[t].n_bytes;
    }
  }
  CHECK(in_shards == n_params); /* with the line above: each tensor in one shard, once */
  st_index_close(&ix);
  char *text;
  size_t n;
  struct json_doc j;
  uint64_t total = 0;
  CHECK(path_read_input(NULL, path, 0, &text, &n, err, sizeof err) == 0);
  CHECK(json_parse(&j, text, n, path, 0, err, sizeof err) == 0);
  const int meta = json_member(&j, 0, "metadata"), size = meta >= 0 ? json_member(&j, meta, "total_size") : -1;
  CHECK(size >= 0 && json_uint64(&j, size, &total));
  CHECK_MSG(total == bytes, "total_size %llu, the tensors %llu", (unsigned long long)total, (unsigned long long)bytes);
  json_free(&j);
  free(text);
}

static void folder_round_trips_to_the_same_bits(void)
{
  struct plan p;
  fixture_plan(&p, shape);
  struct trainer a;
  struct train_step_stats st;
  CHECK_MSG(trainer_open(&a, &p, NULL, err, sizeof err) == TRAIN_OK, "%s", err);
  for (int s = 0; s < 3; s++)
    CHECK(trainer_step(&a, &st, err, sizeof err) == 0);
  const uint64_t shard_bytes = 12000;
  const char *folder = temp_path("sub/hf");
  CHECK_MSG(weights_export_hf(&a.model, folder, shard_bytes, NULL, err, sizeof err) == 0, "%s", err);
  int n_shards = 0;
  check_index(folder, a.model.n_params, &n_shards, shard_bytes);
  CHECK_MSG(n_shards > 2, "%d shards", n_shards);

  struct model b;
  CHECK(model_create(&b, &p.model, err, sizeof err) == 0);
  CHECK_MSG(weights_load(&b, folder, err, sizeof err) == 0, "%s", err);
#if REAL_IS_DOUBLE
  for (int i = 0; i < a.model.n_params; i++)
    for (size_t e = 0; e < a.model.params[i].n_elems; e++)
      CHECK(b.params[i].data[e] == (real)(float)a.model.params[i].data[e]);
#else
  CHECK(fixture_params_equal(&a.model, &b));
#endif
  /* a second export replaces the first whole: one shard now, no shard of the first left */
  CHECK_MSG(weights_export_hf(&a.model, folder, 0, NULL, err, sizeof err) == 0, "%s", err);
  check_index(folder, a.model.n_params, &n_shards, HF_DEFAULT_SHARD_BYTES);
  CHECK(n_shards == 1);
  char gone[300];
  snprintf(gone, sizeof gone, "%s/model-00002-of-%05d.safetensors", folder, n_shards);
  CHECK(access(gone, F_OK) != 0);
  snprintf(gone, sizeof gone, "%s.tmp", folder);
  CHECK(access(gone, F_OK) != 0);
  CHECK_MSG(weights_load(&b, folder, err, sizeof err) == 0, "%s", err);
  model_free(&b);

  /* the plan's model against the config, field by field */
  CHECK(weights_check_from(&p.model, folder, err, sizeof err) == 0);
  struct plan_model m = p.model;
  m.n_layers = 3;
  CHECK(weights_check_from(&m, folder, err, sizeof err) == 2);
  char want[600];
  snprintf(want, sizeof want, "init.from %s: model.n_layers = 3 in the plan, but %s/config.json has "
           "num_hidden_layers = 2", folder, folder);
  CHECK_MSG(strcmp(err, want) == 0, "%s", err);
  m = p.model;
  m.tie_embeddings = 1;
  CHECK(weights_check_from(&m, folder, err, sizeof err) == 2);
  snprintf(want, sizeof want, "init.from %s: model.tie_embeddings = true in the plan, but %s/config.json has "
           "tie_word_embeddings = false", folder, folder);
  CHECK_MSG(strcmp(err, want) == 0, "%s", err);
  m = p.model;
  m.norm_eps = 1e-6;
  CHECK(weights_check_from(&m, folder, err, sizeof err) == 2);
  snprintf(want, sizeof want, "init.from %s: model.norm_eps = 1e-06 in the plan, but %s/config.json has "
           "rms_norm_eps = 1e-05", folder, folder);
  CHECK_MSG(strcmp(err, want) == 0, "%s", err);
  CHECK(model_create(&b, &m, err, sizeof err) == 0);
  CHECK(weights_load(&b, folder, err, sizeof err) != 0 && strcmp(err, want) == 0);
  model_free(&b);
  trainer_close(&a);
}

static void export_paths_that_are_not_an_exports_folder_are_refused(void)
{
  const char *file = temp_path("file"), *link = temp_path("link"), *foreign = temp_path("foreign");
  FILE *f = fopen(file, "w");
  CHECK(f && fclose(f) == 0);
  CHECK(symlink(dir, link) == 0);
  char inside[300];
  CHECK(mkdir(foreign, 0755) == 0);
  snprintf(inside, sizeof inside, "%s/vocab.txt", foreign); /* tokenizer.json is an export's now */
  f = fopen(inside, "w");
  CHECK(f && fclose(f) == 0);
  char want[600];
  CHECK(hf_check_output("export.path", link, err, sizeof err) == 2);
  snprintf(want, sizeof want, "export.path %s: is a symbolic link; give the folder itself", link);
  CHECK_MSG(strcmp(err, want) == 0, "%s", err);
  CHECK(hf_check_output("export.path", file, err, sizeof err) == 2);
  snprintf(want, sizeof want, "export.path %s: is a regular file, not a folder (a Hugging Face export is a folder)",
           file);
  CHECK_MSG(strcmp(err, want) == 0, "%s", err);
  CHECK(hf_check_output("export.path", foreign, err, sizeof err) == 2);
  snprintf(want, sizeof want, "export.path %s: holds 'vocab.txt', which an export does not write; give a new "
           "or empty folder, or one a previous export wrote", foreign);
  CHECK_MSG(strcmp(err, want) == 0, "%s", err);
  CHECK(access(inside, F_OK) == 0);
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static void temp_folder_removed(void)
{
  CHECK(dir[0] && nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS) == 0);
}

TEST_MAIN(TEST(config_fields_tycho_lacks_are_refused_by_name),
          TEST(config_text_reads_back_the_same),
          TEST(folder_round_trips_to_the_same_bits),
          TEST(export_paths_that_are_not_an_exports_folder_are_refused),
          TEST(temp_folder_removed))
