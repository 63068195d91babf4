/* Hugging Face model folders (hf.h): config.json in and out, the weights found in a folder, and
 * a folder written whole (weights, config, the tokenizer files and generation config) and put in
 * place atomically. */
#define _GNU_SOURCE /* renameat2 */
#include "io/hf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/file.h"
#include "util/json.h"
#include "util/path.h"
#include "util/strbuf.h"

/* ---- config.json in ---------------------------------------------------------------------- */

/* Fields that describe the file or how transformers runs it, never what the model computes. */
static const char *const metadata_keys[] = {
  "_name_or_path", "transformers_version", "torch_dtype", "dtype", "bos_token_id", "eos_token_id",
  "pad_token_id", "use_cache", "initializer_range", "output_router_logits",
  /* the Llama 2 reference's slicing of its products: the same products, summed in pieces */
  "pretraining_tp", NULL
};

static int in_list(const char *s, const char *const *list)
{
  for (int i = 0; list[i]; i++)
    if (strcmp(s, list[i]) == 0)
      return 1;
  return 0;
}

struct hf_parse {
  const struct json_doc *j;
  const char *name;
  char *err;
  size_t err_size;
};

static int refuse(const struct hf_parse *h, const char *fmt, const char *a, const char *b)
{
  char what[512];
  snprintf(what, sizeof what, fmt, a, b);
  errf_input(h->err, h->err_size, "%s: %s", h->name, what);
  return 2;
}

static int read_int(const struct hf_parse *h, int id, int min, int *out)
{
  uint64_t v;
  if (!json_uint64(h->j, id, &v) || v < (uint64_t)min || v > INT_MAX) {
    errf_input(h->err, h->err_size, "%s: %s must be a whole number from %d to %d", h->name, h->j->nodes[id].key, min,
         INT_MAX);
    return 2;
  }
  *out = (int)v;
  return 0;
}

static int read_number(const struct hf_parse *h, int id, int positive, double *out)
{
  double v;
  if (!json_double(h->j, id, &v) || !isfinite(v) || v < 0 || (positive && v == 0)) {
    errf_input(h->err, h->err_size, "%s: %s must be a finite number %s 0", h->name, h->j->nodes[id].key,
         positive ? "above" : "of at least");
    return 2;
  }
  *out = v;
  return 0;
}

/* The architecture: 1 Mixtral, 0 Llama; from architectures and model_type, which must agree. */
static int read_arch(const struct hf_parse *h, int *mixtral)
{
  const struct json_doc *j = h->j;
  int arch = -1, type = -1;
  const int a = json_member(j, 0, "architectures"), t = json_member(j, 0, "model_type");
  if (a >= 0) {
    const int first = j->nodes[a].first;
    if (j->nodes[a].type != JSON_ARRAY || j->nodes[a].n_children != 1 || j->nodes[first].type != JSON_STRING)
      return refuse(h, "architectures must be a list of one name (LlamaForCausalLM or MixtralForCausalLM)%s%s", "",
                    "");
    const char *s = j->nodes[first].str;
    arch = strcmp(s, "LlamaForCausalLM") == 0 ? 0 : strcmp(s, "MixtralForCausalLM") == 0 ? 1 : -1;
    if (arch < 0)
      return refuse(h, "architecture '%.100s' is not one tycho implements (LlamaForCausalLM, MixtralForCausalLM)%s",
                    s, "");
  }
  if (t >= 0) {
    const char *s = j->nodes[t].type == JSON_STRING ? j->nodes[t].str : "";
    type = strcmp(s, "llama") == 0 ? 0 : strcmp(s, "mixtral") == 0 ? 1 : -1;
    if (type < 0)
      return refuse(h, "model_type '%.100s' is not one tycho implements (llama, mixtral)%s", s, "");
  }
  if (arch < 0 && type < 0)
    return refuse(h, "neither architectures nor model_type: not a Hugging Face model config%s%s", "", "");
  if (arch >= 0 && type >= 0 && arch != type)
    return refuse(h, "architectures says %s but model_type says %s", arch ? "Mixtral" : "Llama",
                  type ? "mixtral" : "llama");
  *mixtral = arch >= 0 ? arch : type;
  return 0;
}

int hf_config_parse(struct hf_config *c, const char *text, size_t n, const char *name, char *err,
                    size_t err_size)
{
  struct json_doc j;
  if (json_parse(&j, text, n, name, 0, err, err_size))
    return 2;
  const struct hf_parse h = { &j, name, err, err_size };
  int rc = 0, mixtral = 0;
  if (j.nodes[0].type != JSON_OBJECT)
    rc = refuse(&h, "not a JSON object%s%s", "", "");
  if (!rc)
    rc = read_arch(&h, &mixtral);
  if (rc) {
    json_free(&j);
    return rc;
  }
  /* transformers' defaults (LlamaConfig, MixtralConfig) for what the file leaves out */
  memset(c, 0, sizeof *c);
  c->max_seq = mixtral ? 4096 * 32 : 2048;
  c->norm_eps = mixtral ? 1e-5 : 1e-6;
  c->rope_theta = mixtral ? 1e6 : 10000.0;
  if (mixtral) {
    c->experts = 8;
    c->top_k = 2;
    c->aux_loss = 0.001;
  }
  const struct { const char *key; int *at; int min; int mixtral_only; } ints[] = {
    { "num_hidden_layers", &c->n_layers, 1, 0 }, { "hidden_size", &c->dim, 1, 0 },
    { "num_attention_heads", &c->n_heads, 1, 0 }, { "num_key_value_heads", &c->n_kv_heads, 1, 0 },
    { "intermediate_size", &c->ffn_dim, 1, 0 }, { "vocab_size", &c->vocab, 2, 0 },
    { "max_position_embeddings", &c->max_seq, 1, 0 }, { "num_local_experts", &c->experts, 1, 1 },
    { "num_experts_per_tok", &c->top_k, 1, 1 },
  };
  const struct { const char *key; double *at; int positive; int mixtral_only; } numbers[] = {
    { "rms_norm_eps", &c->norm_eps, 1, 0 }, { "rope_theta", &c->rope_theta, 1, 0 },
    { "router_aux_loss_coef", &c->aux_loss, 0, 1 },
  };
  int head_dim = 0, sliding = 0;
  for (int m = j.nodes[0].first; m >= 0 && !rc; m = j.nodes[m].next) {
    const struct json_node *v = &j.nodes[m];
    const char *key = v->key;
    int done = 0;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !done; i++)
      if (strcmp(key, ints[i].key) == 0 && (!ints[i].mixtral_only || mixtral))
        done = 1, rc = read_int(&h, m, ints[i].min, ints[i].at);
    for (size_t i = 0; i < sizeof numbers / sizeof numbers[0] && !done; i++)
      if (strcmp(key, numbers[i].key) == 0 && (!numbers[i].mixtral_only || mixtral))
        done = 1, rc = read_number(&h, m, numbers[i].positive, numbers[i].at);
    if (done || strcmp(key, "architectures") == 0 || strcmp(key, "model_type") == 0 || in_list(key, metadata_keys))
      continue;
    if (strcmp(key, "tie_word_embeddings") == 0) {
      if (v->type != JSON_TRUE && v->type != JSON_FALSE)
        rc = refuse(&h, "tie_word_embeddings must be true or false%s%s", "", "");
      c->tie_embeddings = v->type == JSON_TRUE;
    } else if (strcmp(key, "hidden_act") == 0) {
      if (v->type != JSON_STRING || strcmp(v->str, "silu") != 0)
        rc = refuse(&h, "hidden_act '%.100s' is not one tycho implements (silu)%s",
                    v->type == JSON_STRING ? v->str : "(not a name)", "");
    } else if (strcmp(key, "attention_bias") == 0 || strcmp(key, "mlp_bias") == 0) {
      if (v->type != JSON_FALSE)
        rc = refuse(&h, "%s is set: tycho's %s products have no bias", key,
                    key[0] == 'a' ? "attention" : "MLP");
    } else if (strcmp(key, "attention_dropout") == 0 || (mixtral && strcmp(key, "router_jitter_noise") == 0)) {
      double x;
      if (!json_double(&j, m, &x) || x != 0)
        rc = refuse(&h, "%s must be 0: tycho's model has no %s", key,
                    key[0] == 'a' ? "dropout on attention probabilities alone (model.dropout is on the branches too)"
                                  : "router jitter");
    } else if (strcmp(key, "rope_scaling") == 0) {
      if (v->type == JSON_NULL)
        continue;
      const int t = v->type == JSON_OBJECT ? json_member(&j, m, "rope_type") >= 0 ? json_member(&j, m, "rope_type")
                                                                                  : json_member(&j, m, "type")
                                           : -1;
      const char *kind = t >= 0 && j.nodes[t].type == JSON_STRING ? j.nodes[t].str : "(none named)";
      if (strcmp(kind, "default") != 0)
        rc = refuse(&h, "rope_scaling of type '%.100s' is not one tycho implements: tycho's RoPE is unscaled%s",
                    kind, "");
    } else if (strcmp(key, "head_dim") == 0) {
      if (v->type != JSON_NULL)
        rc = read_int(&h, m, 1, &head_dim);
    } else if (mixtral && strcmp(key, "sliding_window") == 0) {
      if (v->type != JSON_NULL)
        rc = read_int(&h, m, 1, &sliding);
    } else {
      rc = refuse(&h, "field '%.100s' is not one tycho implements (nor metadata it knows to be harmless)%s", key,
                  "");
    }
  }
  static const char *const required[] = { "num_hidden_layers", "hidden_size", "num_attention_heads",
                                          "intermediate_size", "vocab_size", NULL };
  for (int i = 0; required[i] && !rc; i++)
    if (json_member(&j, 0, required[i]) < 0)
      rc = refuse(&h, "no %s%s", required[i], "");
  if (!rc && !c->n_kv_heads)
    c->n_kv_heads = c->n_heads;
  if (!rc && head_dim && (c->dim % c->n_heads || head_dim != c->dim / c->n_heads)) {
    errf_input(err, err_size, "%s: head_dim %d is not hidden_size / num_attention_heads (%d / %d): tycho's heads "
         "split hidden_size", name, head_dim, c->dim, c->n_heads);
    rc = 2;
  }
  if (!rc && sliding && sliding < c->max_seq) {
    errf_input(err, err_size, "%s: sliding_window %d is shorter than max_position_embeddings %d: tycho's attention is "
         "not windowed", name, sliding, c->max_seq);
    rc = 2;
  }
  if (!rc && c->experts && c->top_k > c->experts) {
    errf_input(err, err_size, "%s: num_experts_per_tok %d is more than num_local_experts %d", name, c->top_k, c->experts);
    rc = 2;
  }
  json_free(&j);
  return rc;
}

static void join(char *out, size_t n, const char *dir, const char *file)
{
  size_t k = strlen(dir);
  while (k > 1 && dir[k - 1] == '/')
    k--;
  snprintf(out, n, "%.*s/%s", (int)k, dir, file);
}

int hf_config_read(const char *dir, struct hf_config *c, char *err, size_t err_size)
{
  char path[4200], *text;
  size_t n;
  join(path, sizeof path, dir, HF_CONFIG);
  int rc = path_read_input(NULL, path, PATH_MAX_TEXT_BYTES, &text, &n, err, err_size);
  if (rc)
    return rc;
  rc = hf_config_parse(c, text, n, path, err, err_size);
  free(text);
  return rc;
}

/* ---- config.json out --------------------------------------------------------------------- */

char *hf_config_text(const struct hf_config *c, size_t *n)
{
  struct strbuf b;
  struct json j;
  sb_init(&b);
  json_init(&j, &b);
  const int mixtral = c->experts > 0;
  json_begin_object(&j);
  json_key(&j, "architectures");
  json_begin_array(&j);
  json_string(&j, mixtral ? "MixtralForCausalLM" : "LlamaForCausalLM");
  json_end_array(&j);
  json_key(&j, "model_type");
  json_string(&j, mixtral ? "mixtral" : "llama");
  const struct { const char *key; long long v; } ints[] = {
    { "num_hidden_layers", c->n_layers }, { "hidden_size", c->dim }, { "num_attention_heads", c->n_heads },
    { "num_key_value_heads", c->n_kv_heads }, { "intermediate_size", c->ffn_dim }, { "vocab_size", c->vocab },
    { "max_position_embeddings", c->max_seq },
  };
  for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
    json_key(&j, ints[i].key);
    json_int(&j, ints[i].v);
  }
  json_key(&j, "rms_norm_eps");
  json_number(&j, c->norm_eps);
  json_key(&j, "rope_theta");
  json_number(&j, c->rope_theta);
  json_key(&j, "rope_scaling");
  json_null(&j);
  json_key(&j, "tie_word_embeddings");
  json_bool(&j, c->tie_embeddings);
  json_key(&j, "hidden_act");
  json_string(&j, "silu");
  json_key(&j, "attention_bias");
  json_bool(&j, 0);
  json_key(&j, "attention_dropout");
  json_number(&j, 0.0);
  if (mixtral) {
    json_key(&j, "num_local_experts");
    json_int(&j, c->experts);
    json_key(&j, "num_experts_per_tok");
    json_int(&j, c->top_k);
    json_key(&j, "router_aux_loss_coef");
    json_number(&j, c->aux_loss);
    json_key(&j, "sliding_window");
    json_null(&j);
  } else {
    json_key(&j, "mlp_bias");
    json_bool(&j, 0);
  }
  json_key(&j, "torch_dtype");
  json_string(&j, "float32");
  json_end_object(&j);
  sb_puts(&b, "\n");
  if (b.failed) {
    sb_free(&b);
    return NULL;
  }
  *n = b.n;
  return b.s;
}

/* ---- folders ----------------------------------------------------------------------------- */

int hf_is_folder(const char *path)
{
  struct stat st;
  return path[0] && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int hf_weights_path(const char *dir, char *out, size_t n, char *err, size_t err_size)
{
  struct stat st;
  join(out, n, dir, HF_INDEX);
  if (lstat(out, &st) == 0)
    return 0; /* what it is, its reader says */
  join(out, n, dir, HF_SINGLE);
  if (lstat(out, &st) == 0)
    return 0;
  errf_input(err, err_size, "%s: holds neither %s nor %s", dir, HF_INDEX, HF_SINGLE);
  return 2;
}

/* The tokenizer's files an export copies from its source folder; the first must be there. */
static const char *const tokenizer_files[] = { HF_TOKENIZER, "tokenizer_config.json", "special_tokens_map.json",
                                               NULL };

/* A name an export writes into its folder (a shard's or the index's leftover .tmp too). */
static int export_name(const char *s)
{
  const size_t n = strlen(s);
  if (strcmp(s, HF_CONFIG) == 0 || strcmp(s, HF_INDEX) == 0 || strcmp(s, HF_SINGLE) == 0 ||
      strcmp(s, HF_GENERATION) == 0 || in_list(s, tokenizer_files))
    return 1;
  if (n == 32 && strncmp(s, "model-", 6) == 0 && strncmp(s + 11, "-of-", 4) == 0 &&
      strcmp(s + 20, ".safetensors") == 0) { /* model-0000k-of-0000n.safetensors */
    int digits = 1;
    for (int i = 0; i < 5; i++)
      digits = digits && s[6 + i] >= '0' && s[6 + i] <= '9' && s[15 + i] >= '0' && s[15 + i] <= '9';
    return digits;
  }
  if (n > 4 && n < 68 && strcmp(s + n - 4, ".tmp") == 0) {
    char base[64];
    memcpy(base, s, n - 4);
    base[n - 4] = '\0';
    return export_name(base);
  }
  return 0;
}

/* The first entry of folder `dir` that an export does not write, into `foreign`: 1 found, 0 none,
 * -1 cannot read the folder. A folder under an export file's name is foreign: removing the old
 * export (unlinkat) would fail on it after the new one is written. */
static int foreign_entry(const char *dir, char *foreign, size_t n)
{
  DIR *d = opendir(dir);
  if (!d)
    return -1;
  int found = 0;
  for (struct dirent *e; !found && (e = readdir(d));) {
    struct stat st;
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
        (export_name(e->d_name) && !(fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode))))
      continue;
    snprintf(foreign, n, "%s", e->d_name);
    found = 1;
  }
  closedir(d);
  return found;
}

/* dir (absent, or a real folder of export files) checked; 0 ok, 2 refused, -1 cannot look. */
static int check_folder(const char *what, const char *dir, char *err, size_t err_size)
{
  struct stat st;
  const char *w = what && *what ? what : "", *sp = what && *what ? " " : "";
  if (lstat(dir, &st) != 0) {
    if (errno == ENOENT)
      return 0;
    return errf(err, err_size, "%s%s%s: %s", w, sp, dir, strerror(errno));
  }
  if (S_ISLNK(st.st_mode)) {
    errf(err, err_size, "%s%s%s: is a symbolic link; give the folder itself", w, sp, dir);
    return 2;
  }
  if (!S_ISDIR(st.st_mode)) {
    errf(err, err_size, "%s%s%s: is %s, not a folder (a Hugging Face export is a folder)", w, sp, dir,
         S_ISREG(st.st_mode) ? "a regular file" : path_kind(st.st_mode));
    return 2;
  }
  char foreign[300];
  const int f = foreign_entry(dir, foreign, sizeof foreign);
  if (f < 0)
    return errf(err, err_size, "%s%s%s: cannot read the folder: %s", w, sp, dir, strerror(errno));
  if (f) {
    errf(err, err_size, "%s%s%s: holds '%s', which an export does not write; give a new or empty folder, or one a "
         "previous export wrote", w, sp, dir, foreign);
    return 2;
  }
  return 0;
}

int hf_check_output(const char *what, const char *dir, char *err, size_t err_size)
{
  return check_folder(what, dir, err, err_size);
}

/* Removes the export files in dir, then dir (checked first as check_folder does). */
static int remove_folder(const char *what, const char *dir, char *err, size_t err_size)
{
  int rc = check_folder(what, dir, err, err_size);
  if (rc)
    return rc;
  DIR *d = opendir(dir);
  if (!d)
    return errno == ENOENT ? 0 : errf(err, err_size, "%s %s: cannot read the folder: %s", what, dir, strerror(errno));
  for (struct dirent *e; (e = readdir(d));) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    if (unlinkat(dirfd(d), e->d_name, 0) && errno != ENOENT) {
      rc = errf(err, err_size, "%s %s: cannot remove %s: %s", what, dir, e->d_name, strerror(errno));
      break;
    }
  }
  closedir(d);
  if (!rc && rmdir(dir))
    rc = errf(err, err_size, "%s %s: cannot remove the folder: %s", what, dir, strerror(errno));
  return rc;
}

/* An upper bound of the header bytes tensor t adds to a shard: its name (6 bytes a character at
 * most, as \u00XX) and the fixed text around its dims and two offsets of 20 digits each. */
static uint64_t header_bound(const struct st_write_tensor *t)
{
  return 6 * (uint64_t)strlen(t->name) + 64 + 21 * (uint64_t)(t->n_dims + 2);
}

static uint64_t tensor_bytes(const struct st_write_tensor *t)
{
  uint64_t n = 4;
  for (int d = 0; d < t->n_dims; d++)
    n *= (uint64_t)t->shape[d];
  return n;
}

enum { SHARD_BASE = 8 + 40 + 8 }; /* the length, {"__metadata__":{"format":"pt"}}, padding */

static int write_shards(const char *what, const char *tmp, const struct st_write_tensor *tensors, int n_tensors,
                        uint64_t shard_bytes, char *err, size_t err_size)
{
  int *shard_of = malloc(((size_t)n_tensors + 1) * sizeof *shard_of);
  char (*files)[48] = malloc(((size_t)n_tensors + 1) * sizeof *files);
  const char **names = malloc(((size_t)n_tensors + 1) * sizeof *names), **shard_files = malloc(((size_t)n_tensors + 1) * sizeof *shard_files);
  int rc = 0, n_shards = 0;
  if (!shard_of || !files || !names || !shard_files)
    rc = errf(err, err_size, "%s %s: out of memory", what, tmp);
  /* greedy in the tensors' order: a shard closes when the next tensor would take it past the size */
  uint64_t used = 0, total = 0;
  for (int i = 0; i < n_tensors && !rc; i++) {
    const uint64_t add = tensor_bytes(&tensors[i]) + header_bound(&tensors[i]);
    if (i == 0 || used + add > shard_bytes) {
      n_shards++;
      used = SHARD_BASE;
    }
    used += add;
    total += tensor_bytes(&tensors[i]);
    shard_of[i] = n_shards - 1;
  }
  if (!rc && n_shards > 99999)
    rc = errf(err, err_size, "%s %s: %d shards (more than 99999): give a larger export.shard_mb", what, tmp, n_shards);
  char path[4300];
  for (int s = 0, first = 0; s < n_shards && !rc; s++) {
    int last = first;
    while (last < n_tensors && shard_of[last] == s)
      last++;
    snprintf(files[s], sizeof files[s], "model-%05d-of-%05d.safetensors", s + 1, n_shards);
    join(path, sizeof path, tmp, files[s]);
    rc = st_write_f32(path, tensors + first, last - first, err, err_size);
    first = last;
  }
  for (int i = 0; i < n_tensors && !rc; i++) {
    names[i] = tensors[i].name;
    shard_files[i] = files[shard_of[i]];
  }
  if (!rc) {
    join(path, sizeof path, tmp, HF_INDEX);
    rc = st_index_write(path, names, shard_files, n_tensors, total, err, err_size);
  }
  free(shard_of);
  free(files);
  free(names);
  free(shard_files);
  return rc;
}

/* The folder that holds `dir` ("." when it has no folder part). */
static void parent_of(const char *dir, char *out, size_t n)
{
  snprintf(out, n, "%s", dir);
  size_t k = strlen(out);
  while (k > 1 && out[k - 1] == '/')
    out[--k] = '\0';
  char *slash = strrchr(out, '/');
  if (!slash)
    snprintf(out, n, ".");
  else if (slash == out)
    out[1] = '\0';
  else
    *slash = '\0';
}

/* The tokenizer file i of tokenizer_files for the tokenizer.json `tok`: tok itself for i 0, else
 * the file of that name in tok's folder. */
static void tokenizer_source(const char *tok, int i, char *out, size_t n)
{
  if (i == 0) {
    snprintf(out, n, "%s", tok);
    return;
  }
  char dir[4200];
  parent_of(tok, dir, sizeof dir);
  join(out, n, dir, tokenizer_files[i]);
}

/* The tokenizer's file i copied byte for byte to tmp/NAME; a file other than tokenizer.json that
 * is absent is skipped (transformers reads the folder without it). */
static int copy_file(const char *what, const char *tok, const char *tmp, int i, char *err, size_t err_size)
{
  char from[4300], to[4300];
  struct stat st;
  tokenizer_source(tok, i, from, sizeof from);
  join(to, sizeof to, tmp, tokenizer_files[i]);
  if (i > 0 && stat(from, &st) != 0 && errno == ENOENT)
    return 0;
  struct file_map m;
  char why[512];
  if (file_map(NULL, from, 0, &m, why, sizeof why))
    return errf(err, err_size, "%s %s: the tokenizer: %s", what, tmp, why);
  int rc = file_write_synced(to, m.data ? m.data : "", m.bytes, err, err_size);
  file_unmap(&m);
  return rc;
}

/* generation_config.json as save_pretrained writes one made from the model's config: the token
 * ids set, transformers_version, and _from_model_config (the settings are the defaults). */
static int write_generation(const char *tmp, const struct hf_extras *x, char *err, size_t err_size)
{
  struct strbuf b;
  struct json j;
  sb_init(&b);
  json_init(&j, &b);
  json_begin_object(&j);
  json_key(&j, "_from_model_config");
  json_bool(&j, 1);
  const struct { const char *key; long long v; } ids[] = {
    { "bos_token_id", x->bos }, { "eos_token_id", x->eos }, { "pad_token_id", x->pad },
  };
  for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++)
    if (ids[i].v >= 0) {
      json_key(&j, ids[i].key);
      json_int(&j, ids[i].v);
    }
  /* the version whose format this is (the generation config's keys as 4.40 writes them) */
  json_key(&j, "transformers_version");
  json_string(&j, "4.40.2");
  json_end_object(&j);
  sb_puts(&b, "\n");
  char path[4300];
  join(path, sizeof path, tmp, HF_GENERATION);
  int rc = b.failed ? errf(err, err_size, "%s: out of memory", path) : file_write_synced(path, b.s, b.n, err, err_size);
  sb_free(&b);
  return rc;
}

int hf_write_folder(const char *what, const char *dir, const struct hf_config *c,
                    const struct st_write_tensor *tensors, int n_tensors, uint64_t shard_bytes,
                    const struct hf_extras *extras, char *err, size_t err_size)
{
  char tmp[4200], old[4200], path[4300], parent[4200];
  size_t k = strlen(dir);
  while (k > 1 && dir[k - 1] == '/')
    k--;
  if (k + 8 >= sizeof tmp)
    return errf(err, err_size, "%s %s: path too long", what, dir);
  snprintf(tmp, sizeof tmp, "%.*s.tmp", (int)k, dir);
  snprintf(old, sizeof old, "%.*s.old", (int)k, dir);
  parent_of(dir, parent, sizeof parent);
  int rc = check_folder(what, dir, err, err_size);
  if (rc)
    return rc;
  if (path_make_parent_dirs(tmp, err, err_size))
    return -1;
  /* DIR.tmp and DIR.old are made afresh: a leftover of a run that stopped is removed when it
   * holds only export files, a link there is removed (its target untouched), anything else refused */
  const char *aside[] = { tmp, old };
  for (int i = 0; i < 2 && !rc; i++) {
    struct stat st;
    if (lstat(aside[i], &st) == 0 && S_ISLNK(st.st_mode))
      rc = unlink(aside[i]) ? errf(err, err_size, "%s %s: cannot remove %s: %s", what, dir, aside[i], strerror(errno))
                            : 0;
    else
      rc = remove_folder(what, aside[i], err, err_size);
  }
  if (rc)
    return rc;
  if (mkdir(tmp, 0755))
    return errf(err, err_size, "%s %s: cannot create the folder %s: %s", what, dir, tmp, strerror(errno));
  rc = write_shards(what, tmp, tensors, n_tensors, shard_bytes, err, err_size);
  size_t n = 0;
  char *config = rc ? NULL : hf_config_text(c, &n);
  if (!rc && !config)
    rc = errf(err, err_size, "%s %s: out of memory", what, dir);
  if (!rc) {
    join(path, sizeof path, tmp, HF_CONFIG);
    rc = file_write_synced(path, config, n, err, err_size);
  }
  free(config);
  const int tokenizer = extras && extras->tokenizer && extras->tokenizer[0];
  for (int i = 0; tokenizer && !rc && tokenizer_files[i]; i++)
    rc = copy_file(what, extras->tokenizer, tmp, i, err, err_size);
  if (tokenizer && !rc)
    rc = write_generation(tmp, extras, err, err_size);
  if (!rc)
    rc = file_sync_folder(tmp, err, err_size);
  if (!rc)
    rc = check_folder(what, dir, err, err_size); /* again: it may have changed while we wrote */
  if (!rc) {
    struct stat st;
    if (lstat(dir, &st) != 0) {
      if (rename(tmp, dir))
        rc = errf(err, err_size, "%s %s: cannot rename %s into place: %s", what, dir, tmp, strerror(errno));
    } else if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) {
      rc = remove_folder(what, tmp, err, err_size); /* the old export, now at DIR.tmp */
    } else if (rename(dir, old)) { /* a file system without the exchange: the old one aside first */
      rc = errf(err, err_size, "%s %s: cannot rename it to %s: %s", what, dir, old, strerror(errno));
    } else if (rename(tmp, dir)) {
      rc = errf(err, err_size, "%s %s: cannot rename %s into place: %s", what, dir, tmp, strerror(errno));
      (void)!rename(old, dir);
    } else {
      rc = remove_folder(what, old, err, err_size);
    }
  }
  if (rc) {
    char ignored[256];
    remove_folder(what, tmp, ignored, sizeof ignored);
    return rc;
  }
  return file_sync_folder(parent, err, err_size);
}
