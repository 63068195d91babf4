/* Hugging Face weights in and out of the model (docs/design.md, "Files tycho reads and writes":
 * plan fields init.from and export.path), through the safetensors module. Names and shapes are
 * Hugging Face's; the padded vocabulary rows are internal and never written or read. */
#ifndef TYCHO_RUNTIME_WEIGHTS_H
#define TYCHO_RUNTIME_WEIGHTS_H
#include <stddef.h>

#include "runtime/model/model.h"

/* Loads every parameter from `path`: a .safetensors file, or a sharded checkpoint's
 * model.safetensors.index.json. F32, F16 and BF16 are converted to fp32. Refused, naming the
 * tensor: a parameter the file lacks, a tensor the model lacks (Llama's non-parameter buffer
 * "*.rotary_emb.inv_freq" is skipped), a shape that differs (expected and found are given), a
 * dtype that is not a floating-point one (F32, F16, BF16, F64). Parameters whose data is NULL
 * are checked but not read (a ZeRO-3 rank loads one bucket at a time). On error the parameters
 * are partly loaded. 0 ok. */
int weights_load(struct model *m, const char *path, char *err, size_t err_size);

/* Writes every parameter as F32 safetensors to `path` (crash-safe: path.tmp, fsync, rename),
 * creating missing parent folders. A tied model writes no lm_head.weight, as Hugging Face does. */
int weights_export(const struct model *m, const char *path, char *err, size_t err_size);

#endif
