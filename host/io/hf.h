/* Hugging Face model folders: config.json read (strictly: the Llama and Mixtral fields tycho's
 * model has, the few that are metadata, and every other field refused by name, since a field
 * tycho ignored would be a model it computes differently) and written, the weights found in a
 * folder (model.safetensors.index.json with its shards, or one model.safetensors), and a folder
 * written whole: shards of at most a given size, their index and the config, made in DIR.tmp and
 * renamed into place.
 *
 * Functions return 0, or nonzero with a one-line message in err: 2 for input that is not what it
 * must be (a config tycho cannot take, a path that is not a folder, a folder holding files tycho
 * did not write), -1 for what failed (cannot read, cannot write, out of memory). */
#ifndef TYCHO_IO_HF_H
#define TYCHO_IO_HF_H
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

#define HF_CONFIG "config.json"
#define HF_INDEX "model.safetensors.index.json"
#define HF_SINGLE "model.safetensors"
/* The hub's shard size (save_pretrained's max_shard_size "5GB"). */
#define HF_DEFAULT_SHARD_BYTES 5000000000ULL

/* A Llama (experts 0) or Mixtral (experts > 0, every layer's MLP sparse) configuration, in
 * Hugging Face's terms; the comments name config.json's fields. */
struct hf_config {
  int n_layers;       /* num_hidden_layers */
  int dim;            /* hidden_size */
  int n_heads;        /* num_attention_heads */
  int n_kv_heads;     /* num_key_value_heads (default num_attention_heads) */
  int ffn_dim;        /* intermediate_size (Mixtral: each expert's width) */
  int vocab;          /* vocab_size */
  int max_seq;        /* max_position_embeddings */
  double norm_eps;    /* rms_norm_eps */
  double rope_theta;  /* rope_theta */
  int tie_embeddings; /* tie_word_embeddings */
  int experts;        /* num_local_experts; 0 for a Llama */
  int top_k;          /* num_experts_per_tok */
  double aux_loss;    /* router_aux_loss_coef */
};

/* Parses config.json text; `name` starts every message ("DIR/config.json: rope_scaling ...").
 * Refused by name: an architecture other than LlamaForCausalLM or MixtralForCausalLM, a field
 * tycho does not implement (rope_scaling, attention or MLP biases, another activation, attention
 * dropout, a sliding window shorter than max_position_embeddings, router jitter, a head_dim
 * other than hidden_size / num_attention_heads) and any field that is neither a model field nor
 * known metadata (token ids, torch_dtype, transformers_version, ...). The five shape fields
 * (layers, hidden size, heads, intermediate size, vocabulary) are required; other missing fields
 * take transformers' defaults for the architecture. 0 ok, 2 refused. */
int hf_config_parse(struct hf_config *c, const char *text, size_t n, const char *name, char *err,
                    size_t err_size);

/* DIR/config.json read (a regular file of bounded size, opened without waiting) and parsed. */
int hf_config_read(const char *dir, struct hf_config *c, char *err, size_t err_size);

/* config.json text for c (malloc'd, NUL-terminated; *n without the NUL): architectures,
 * model_type, every model field, torch_dtype "float32" (tycho writes F32). NULL when out of
 * memory. */
char *hf_config_text(const struct hf_config *c, size_t *n);

/* 1 when `path` is a folder (links followed), else 0. */
int hf_is_folder(const char *path);

/* The weights of the folder `dir`: DIR/model.safetensors.index.json when it exists, else
 * DIR/model.safetensors, into out. 0 ok; 2 with "DIR: holds neither ..." when it has neither. */
int hf_weights_path(const char *dir, char *out, size_t n, char *err, size_t err_size);

/* The folder `dir` may be written as an export: absent, or a folder (not a link to one) holding
 * only files an export writes (config.json, the index, model.safetensors, model-*-of-*.safetensors,
 * the tokenizer files and generation_config.json)
 * so that replacing it loses nothing else. `what` starts the message ("export.path DIR: ..."). */
int hf_check_output(const char *what, const char *dir, char *err, size_t err_size);

/* Tokenizer files the export folder carries beside the weights, so that the folder is whole for
 * a Hugging Face reader (AutoTokenizer, generate). */
#define HF_TOKENIZER "tokenizer.json"
#define HF_GENERATION "generation_config.json"
struct hf_extras {
  /* the tokenizer.json (by any name) copied byte for byte as tokenizer.json, with the
   * tokenizer_config.json and special_tokens_map.json beside it when present; "" for none, and
   * then no generation_config.json either */
  const char *tokenizer;
  /* generation_config.json's token ids, -1 where unknown (the key is left out) */
  long long bos, eos, pad;
};

/* Writes the folder `dir`: tensors (in order) into shards model-0000k-of-0000n.safetensors of at
 * most shard_bytes each (header included; a tensor larger than that alone in its shard), their
 * index (metadata.total_size: the tensors' bytes) and config.json; with extras (NULL: none) whose
 * tokenizer is set, its tokenizer files and a generation_config.json with the ids
 * known, as transformers' save_pretrained writes it. Everything goes to DIR.tmp
 * (made afresh), synced, then takes DIR's place in one rename; a DIR that was there (checked as
 * hf_check_output does, before and again just before the rename) is removed after. */
int hf_write_folder(const char *what, const char *dir, const struct hf_config *c,
                    const struct st_write_tensor *tensors, int n_tensors, uint64_t shard_bytes,
                    const struct hf_extras *extras, char *err, size_t err_size);

#endif
