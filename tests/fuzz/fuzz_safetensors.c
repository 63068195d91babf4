/* libFuzzer target for the safetensors reader: any byte string is parsed both as a whole
 * safetensors image and as index JSON. A parse may fail (with a message) but must never crash,
 * read outside the buffer, leak, or accept a header whose tensors break the invariants below.
 * With clang: clang -fsanitize=fuzzer,address,undefined -Ihost fuzz_safetensors.c
 * host/io/safetensors.c. With gcc, fuzz_driver.c supplies main() and the inputs. */
#include "io/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void require(int cond)
{
  if (!cond) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char err[256];
  struct st_file f;
  struct st_index ix;
  err[0] = '\0';
  if (st_parse(&f, data, size, "fuzz.safetensors", err, sizeof err) == 0) {
    require(f.data >= data + 8 && f.data + f.data_bytes == data + size);
    for (int k = 0; k < f.n_tensors; k++) {
      const struct st_tensor *t = &f.tensors[k];
      require(t->offset <= f.data_bytes && t->n_bytes <= f.data_bytes - t->offset);
      require(t->n_bytes == t->n_elems * st_dtype_bytes(t->dtype));
      require(st_find(&f, t->name) == t);
      if (t->dtype == ST_F32 || t->dtype == ST_F16 || t->dtype == ST_BF16 || t->dtype == ST_F64) {
        real *out = malloc((t->n_elems ? t->n_elems : 1) * sizeof *out);
        require(out && st_read_real(&f, t, out, t->n_elems, err, sizeof err) == 0);
        free(out);
      }
    }
    st_close(&f);
  } else {
    require(err[0] != '\0' && strstr(err, "fuzz.safetensors") == err);
  }
  err[0] = '\0';
  if (st_index_parse(&ix, (const char *)data, size, "fuzz.index.json", err, sizeof err) == 0) {
    for (int k = 0; k < ix.n_entries; k++) {
      require(ix.entries[k].shard >= 0 && ix.entries[k].shard < ix.n_shards);
      require(k == 0 || strcmp(ix.entries[k - 1].name, ix.entries[k].name) < 0);
    }
    st_index_close(&ix);
  } else {
    require(err[0] != '\0');
  }
  return 0;
}
