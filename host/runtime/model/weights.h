/* Hugging Face weights in and out of the model (docs/design.md, "Files tycho reads and writes":
 * plan fields init.from and export.path), through the safetensors module. Names and shapes are
 * Hugging Face's; the padded vocabulary rows are internal and never written or read. */
#ifndef TYCHO_RUNTIME_WEIGHTS_H
#define TYCHO_RUNTIME_WEIGHTS_H
#include <stddef.h>
#include <stdint.h>

#include "runtime/model/model.h"

struct hf_config;

/* Loads every parameter from `path`: a .safetensors file, a sharded checkpoint's
 * model.safetensors.index.json, or a Hugging Face model folder (its config.json checked against
 * m->config as weights_check_from does, then its index and shards or its model.safetensors). F32, F16 and BF16 are converted to fp32. Refused, naming the
 * tensor: a parameter the file lacks, a tensor the model lacks (Llama's non-parameter buffer
 * "*.rotary_emb.inv_freq" is skipped), a shape that differs (expected and found are given), a
 * dtype that is not a floating-point one (F32, F16, BF16, F64). Parameters whose data is NULL
 * are checked but not read (a ZeRO-3 rank loads one bucket at a time). On error the parameters
 * are partly loaded. 0 ok. */
int weights_load(struct model *m, const char *path, char *err, size_t err_size);

/* Writes every parameter as F32 safetensors to `path` (crash-safe: path.tmp, fsync, rename),
 * creating missing parent folders. A tied model writes no lm_head.weight, as Hugging Face does. */
int weights_export(const struct model *m, const char *path, char *err, size_t err_size);

/* Writes every parameter into the Hugging Face model folder `dir` (io/hf.h, hf_write_folder):
 * config.json from m->config, F32 shards of at most shard_bytes (0: the hub's 5 GB) and their
 * index, the tokenizer files and generation config of extras (NULL: none), put in place
 * atomically. */
struct hf_extras;
int weights_export_hf(const struct model *m, const char *dir, uint64_t shard_bytes, const struct hf_extras *extras,
                      char *err, size_t err_size);

/* The Hugging Face config of the plan's model; 2 with a message when the model has none (some
 * layers sparse and some dense). */
int weights_hf_config(const struct plan_model *m, struct hf_config *c, char *err, size_t err_size);

/* export.format "hf" before a run (rank 0): the model has a Hugging Face config, `dir` may be
 * written (io/hf.h, hf_check_output) and files can be made beside it (where DIR.tmp goes).
 * 0 ok; 2 refused; -1 cannot be written. */
int weights_probe_hf(const struct plan_model *m, const char *dir, char *err, size_t err_size);

/* init.from before a run (rank 0): a file opened without waiting and refused unless regular; a
 * folder's config.json read and compared with the plan's model (layers, hidden size, heads, kv
 * heads, intermediate size, vocabulary, rope theta, norm eps, tied embeddings, experts, top-k:
 * "init.from DIR: model.n_layers = 2 in the plan, but DIR/config.json has num_hidden_layers = 4"),
 * then its weights' file as a file. 0 ok (a file that is missing is left to the loader to name);
 * 2 refused; -1 cannot be read. */
int weights_check_from(const struct plan_model *m, const char *path, char *err, size_t err_size);

#endif
