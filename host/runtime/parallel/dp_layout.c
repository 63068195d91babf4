/* The data-parallel flat layout bound to a model (dp.h): the layout's buckets (layout/dp_buckets.h)
 * computed on the model's table, and the offsets they give (of the weights and of a bf16 model's
 * copies) copied to its parameters. */
#include "runtime/parallel/dp.h"

int dp_layout_build(struct dp_layout *l, struct model *m, int size, int zero, double bucket_mb,
                    char *err, size_t err_size)
{
  if (dp_buckets_build(l, &m->table, m->config.n_layers, m->ep.size, size, zero, bucket_mb, err, err_size))
    return -1;
  for (int i = 0; i < m->n_params; i++) {
    m->params[i].offset = m->table.p[i].offset;
    m->params[i].bf16_offset = m->table.p[i].bf16_offset;
  }
  m->n_elems = m->table.n_elems;
  m->n_bf16 = m->table.n_bf16;
  return 0;
}
