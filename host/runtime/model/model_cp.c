/* Context parallelism in the model's passes (model.h, struct model_cp): the cut of a forward's
 * token ids to this rank's two chunks, the rope table at their global positions, the dropout
 * masks drawn at them, and the attention through the ring (runtime/parallel/cp.h). Every other op
 * of a block is per token, so it runs on the rank's rows as it would on the whole sequence's. */
#include "runtime/model/model_cp.h"

#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "layout/acts.h"
#include "runtime/model/alloc.h"
#include "runtime/parallel/cp.h"
#include "util/err.h"

int model_cp_open(struct model *m, struct comm_group *g, int B_max, int T, char *err, size_t err_size)
{
  m->cp.group = g;
  m->cp.size = g ? g->size : 1;
  m->cp.rank = g ? g->rank : 0;
  if (m->cp.size <= 1)
    return 0;
  const struct plan_model *c = &m->config;
  m->cp.ring = calloc(1, sizeof *m->cp.ring);
  /* the rows' ids: host memory the trainer's batch is cut into, workspace on the bill */
  m->cp.ids = alloc_host_bytes(ALLOC_WORKSPACE, (size_t)B_max * model_cp_max_rows(T, m->cp.size) * sizeof(int));
  /* the buffers sized for the most heads any layer's attention runs on here (its tp share) */
  int NH, NKV;
  layout_cp_heads(&m->rank, &NH, &NKV);
  if (!m->cp.ring || !m->cp.ids) {
    model_cp_close(m);
    return errf(err, err_size, "context parallelism: out of host memory for the ring");
  }
  if (cp_ring_init(m->cp.ring, m->k, m->kctx, m->device, g, B_max, T, NH, NKV, c->head_dim, err, err_size)) {
    free(m->cp.ring);
    m->cp.ring = NULL;
    model_cp_close(m);
    return -1;
  }
  return 0;
}

void model_cp_close(struct model *m)
{
  if (m->cp.ring) {
    cp_ring_free(m->cp.ring);
    free(m->cp.ring);
  }
  alloc_free(m->cp.ids);
  memset(&m->cp, 0, sizeof m->cp);
}

int model_cp_max_rows(int T, int cp)
{
  return layout_cp_rows(T, cp);
}

/* This rank's chunk i (0, 1) of a T-long sequence: its first position and length. */
static void chunk(const struct model *m, int T, int i, int *start, int *len)
{
  const int id = i == 0 ? m->cp.rank : 2 * m->cp.size - 1 - m->cp.rank;
  attention_cp_chunk(T, m->cp.size, id, start, len);
}

void model_cp_begin(struct model *m, struct model_acts *a, int B, int T)
{
  a->seq_T = T;
  if (m->cp.size <= 1)
    return;
  a->T = attention_cp_rank_tokens(T, m->cp.size, m->cp.rank);
  m->cp.seq_T = T, m->cp.Tl = a->T;
  if (a->cp_rope_T != T) { /* the rows' global positions: chunk one's, then chunk two's */
    const int half = m->config.head_dim / 2;
    int s0, n0, s1, n1;
    chunk(m, T, 0, &s0, &n0);
    chunk(m, T, 1, &s1, &n1);
    m->k->rope_table(m->kctx, a->rope_cos, a->rope_sin, n0, m->config.head_dim, m->config.rope_theta, s0);
    m->k->rope_table(m->kctx, a->rope_cos + (size_t)n0 * half, a->rope_sin + (size_t)n0 * half, n1,
                     m->config.head_dim, m->config.rope_theta, s1);
    a->cp_rope_T = T;
  }
  char why[256];
  if ((m->cp.ring->B != B || m->cp.ring->T != T) && cp_ring_reshape(m->cp.ring, B, T, why, sizeof why))
    fault_set(FAULT_OF(&m->tp), FAULT_LEVEL_MODEL, "%s", why);
}

const int *model_cp_rows(struct model *m, const struct model_acts *a, const int *ids)
{
  if (m->cp.size <= 1 || !ids)
    return ids;
  const int T = a->seq_T, Tl = a->T;
  int s0, n0, s1, n1;
  chunk(m, T, 0, &s0, &n0);
  chunk(m, T, 1, &s1, &n1);
  for (int b = 0; b < a->B; b++) {
    memcpy(m->cp.ids + (size_t)b * Tl, ids + (size_t)b * T + s0, (size_t)n0 * sizeof(int));
    memcpy(m->cp.ids + (size_t)b * Tl + n0, ids + (size_t)b * T + s1, (size_t)n1 * sizeof(int));
  }
  return m->cp.ids;
}

int model_cp_draw_masks(const struct model *m, real *mask, size_t per_sample, uint64_t first,
                        const struct model_dropout *d, int B, int layer, enum model_dropout_site site)
{
  if (m->cp.size <= 1)
    return 0;
  /* the masks are on the residual stream, (T, C) a sample: this rank holds its rows [r0, r0 + n)
   * of the cp rank's rows (all of them, or a tp rank's share under sequence parallelism), which
   * are chunk one's positions, then chunk two's */
  const int T = m->cp.seq_T;
  const size_t C = (size_t)m->config.dim, r0 = (size_t)(first / C), n = per_sample / C;
  int s[2], len[2];
  chunk(m, T, 0, &s[0], &len[0]);
  chunk(m, T, 1, &s[1], &len[1]);
  for (int b = 0; b < B; b++)
    for (int i = 0, row = 0; i < 2; row += len[i], i++) {
      const size_t lo = r0 > (size_t)row ? r0 : (size_t)row;
      const size_t hi = r0 + n < (size_t)(row + len[i]) ? r0 + n : (size_t)(row + len[i]);
      if (lo >= hi)
        continue;
      m->k->dropout_mask(m->kctx, mask + (size_t)b * per_sample + (lo - r0) * C, (hi - lo) * C, d->p, d->seed,
                         d->step, (uint32_t)d->samples[b], ((uint32_t)layer << 8) | (uint32_t)site,
                         (uint64_t)(s[i] + (lo - (size_t)row)) * C);
    }
  return 1;
}

void model_cp_attention_forward(struct model *m, struct model_layer_acts *la, const struct attention_dropout *drop,
                                int NH, int NKV)
{
  char why[512];
  if (cp_ring_heads(m->cp.ring, NH, NKV, why, sizeof why) ||
      cp_ring_forward(m->cp.ring, la->atty, la->lse, la->q, la->k, la->v, drop, why, sizeof why))
    fault_set(FAULT_OF(&m->tp), FAULT_LEVEL_MODEL, "%s", why);
}

void model_cp_attention_backward(struct model *m, struct model_acts *a, const struct model_layer_acts *la,
                                 const real *datt, const struct attention_dropout *drop, int NH, int NKV)
{
  char why[512];
  if (cp_ring_heads(m->cp.ring, NH, NKV, why, sizeof why) ||
      cp_ring_backward(m->cp.ring, a->dq, a->dk, a->dv, datt, la->q, la->k, la->v, la->atty, la->lse, drop, why,
                       sizeof why))
    fault_set(FAULT_OF(&m->tp), FAULT_LEVEL_MODEL, "%s", why);
}

/* The cp rank holding position pos of a T-long sequence, and the position's row there. */
static int holder_of(const struct model *m, int T, int pos, int *row)
{
  const int cp = m->cp.size;
  for (int r = 0; r < cp; r++) {
    int s0, n0, s1, n1;
    attention_cp_chunk(T, cp, r, &s0, &n0);
    attention_cp_chunk(T, cp, 2 * cp - 1 - r, &s1, &n1);
    if (pos >= s0 && pos < s0 + n0)
      return *row = pos - s0, r;
    if (pos >= s1 && pos < s1 + n1)
      return *row = n0 + pos - s1, r;
  }
  return *row = 0, 0; /* not reached: the chunks cover the sequence */
}

void model_cp_head_argmax(struct model *m, struct model_acts *a, const int *rows, int n, int *out,
                          model_cp_argmax_fn rows_argmax)
{
  const int T = a->seq_T, Tl = a->T, cp = m->cp.size;
  int *local = calloc((size_t)n * (3 + (size_t)cp) + 1, sizeof *local);
  if (!local) {
    fault_set(FAULT_OF(&m->tp), FAULT_LEVEL_MODEL, "context parallelism: host memory for the argmax");
    for (int i = 0; i < n; i++) out[i] = 0;
    return;
  }
  int *holder = local + n, *mine = holder + n, *all = mine + n;
  for (int i = 0; i < n; i++) {
    int row;
    holder[i] = holder_of(m, T, rows[i] % T, &row);
    /* a row held elsewhere: this rank decodes its sample's first row, and the result is dropped */
    local[i] = (rows[i] / T) * Tl + (holder[i] == m->cp.rank ? row : 0);
  }
  rows_argmax(m, a, local, n, mine);
  if (comm_all_gather(m->cp.group, mine, all, (size_t)n, COMM_INT32, NULL)) {
    fault_set(FAULT_OF(&m->tp), FAULT_LEVEL_MODEL, "context parallelism: all-gather of the argmax: %s", comm_error());
    for (int i = 0; i < n; i++) all[(size_t)holder[i] * n + i] = 0;
  }
  for (int i = 0; i < n; i++) out[i] = all[(size_t)holder[i] * n + i];
  free(local);
}
