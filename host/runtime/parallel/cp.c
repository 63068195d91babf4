/* Context parallelism's ring attention (cp.h). Step s of cp: rank r holds rank (r − s) mod cp's
 * k, v pair (its own at s = 0) and computes its two query chunks against the pair's two key
 * chunks where they lie at or below the causal diagonal (chunk ids order the positions: key
 * chunk ≤ query chunk). With the balanced layout each step is two blocks (three at s = 0, two of
 * them on the diagonal) on every rank, so no rank waits on another's compute. The transfer of
 * step s + 1's pair is posted before step s computes, into the other of two buffers, so it
 * travels while the blocks run.
 *
 * Forward: a chunk's first block writes out and lse, each later one a partial that the
 * log-sum-exp merge folds in (attention_cp_merge). Backward: the final out and lse give D once
 * per row; at each step the rank adds its blocks' dq into its own rows, and their dk, dv share
 * of the held pair into a zeroed buffer while the pair's accumulator arrives from the previous
 * rank (sent there after its step s − 1), then adds the share and sends the accumulator on; the
 * last hop brings each pair's accumulator home. Every block, sum and copy is a call of the ring's
 * kernel table (cp.h), none by name. */
#include "runtime/parallel/cp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout/acts.h"
#include "runtime/model/alloc.h"
#include "util/err.h"

/* A rank's chunk i (0: chunk rank, 1: chunk 2·cp − 1 − rank): id, start, length, first row. */
struct piece { int id, start, len, row; };

static struct piece piece_of(int T, int cp, int rank, int i)
{
  struct piece p;
  int s0, n0;
  attention_cp_chunk(T, cp, rank, &s0, &n0);
  p.id = i == 0 ? rank : 2 * cp - 1 - rank;
  attention_cp_chunk(T, cp, p.id, &p.start, &p.len);
  p.row = i == 0 ? 0 : n0;
  return p;
}

static int tokens(const struct cp_ring *r, int rank)
{
  return attention_cp_rank_tokens(r->T, r->g->size, rank);
}

/* Elements of a rank's k (or v, dk, dv). */
static size_t kv_elems(const struct cp_ring *r, int rank)
{
  return (size_t)r->B * tokens(r, rank) * r->NKV * r->HS;
}

void cp_ring_free(struct cp_ring *r)
{
  real **bufs[] = { &r->kv[0], &r->kv[1], &r->acc[0], &r->acc[1], &r->dloc, &r->pout, &r->plse, &r->D, &r->scratch };
  for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) alloc_free(*bufs[i]);
  memset(r, 0, sizeof *r);
}

int cp_ring_reshape(struct cp_ring *r, int B, int T, char *err, size_t err_size)
{
  const int cp = r->g->size, maxTl = layout_cp_rows(T, cp);
  if (T < 2 * cp)
    return errf(err, err_size, "context parallelism: the sequence (T = %d) is shorter than its 2 · cp = %d chunks",
                T, 2 * cp);
  if ((size_t)B * maxTl > r->cap_rows ||
      r->k->attention_cp_scratch_n_elems(r->kctx, B, maxTl, maxTl, r->NH, r->NKV, r->HS) > r->cap_scratch)
    return errf(err, err_size, "context parallelism: %d × %d tokens do not fit the ring's buffers (sized for %zu rows)",
                B, T, r->cap_rows);
  r->B = B, r->T = T, r->Tl = tokens(r, r->g->rank), r->maxTl = maxTl;
  return 0;
}

int cp_ring_heads(struct cp_ring *r, int NH, int NKV, char *err, size_t err_size)
{
  if (NH < 1 || NKV < 1 || NH > r->cap_NH || NKV > r->cap_NKV || NH % NKV)
    return errf(err, err_size, "context parallelism: %d query and %d key/value heads do not fit the ring's buffers "
                "(sized for %d and %d)", NH, NKV, r->cap_NH, r->cap_NKV);
  r->NH = NH, r->NKV = NKV;
  return 0;
}

int cp_ring_init(struct cp_ring *r, const struct kernel_ops *k, void *kctx, int device, struct comm_group *g,
                 int B, int T, int NH, int NKV, int HS, char *err, size_t err_size)
{
  memset(r, 0, sizeof *r);
  const int cp = g->size;
  if (T < 2 * cp)
    return errf(err, err_size, "context parallelism: the sequence (T = %d) is shorter than its 2 · cp = %d chunks",
                T, 2 * cp);
  /* the comm layer sends host memory; NCCL's device transfers for the ring are not written */
  if (!k->host_visible)
    return errf(err, err_size,
                "context parallelism: the ring on the %s kernel table (device memory) is not supported yet: "
                "its transfers run on host memory only", k->name);
  r->k = k, r->kctx = kctx;
  r->g = g, r->B = B, r->T = T, r->NH = NH, r->NKV = NKV, r->HS = HS;
  r->Tl = tokens(r, g->rank);
  /* the sizes the bill counts (layout_cp_ring): the transfers' buffers as comm, the blocks' as
   * workspace */
  struct layout_cp_ring z;
  layout_cp_ring(&z, k, kctx, B, T, cp, NH, NKV, HS);
  r->maxTl = z.maxTl;
  for (int i = 0; i < 2; i++) {
    r->kv[i] = alloc_reals_on(device, ALLOC_COMM, z.kv);
    r->acc[i] = alloc_reals_on(device, ALLOC_COMM, z.kv);
  }
  r->dloc = alloc_reals_on(device, ALLOC_WORKSPACE, z.kv);
  r->pout = alloc_reals_on(device, ALLOC_WORKSPACE, z.rows * NH * HS);
  r->plse = alloc_reals_on(device, ALLOC_WORKSPACE, z.rows * NH);
  r->D = alloc_reals_on(device, ALLOC_WORKSPACE, z.rows * NH);
  r->cap_rows = z.rows;
  r->cap_NH = NH, r->cap_NKV = NKV;
  r->cap_scratch = z.scratch;
  r->scratch = alloc_reals_on(device, ALLOC_WORKSPACE, r->cap_scratch);
  if (!r->kv[0] || !r->kv[1] || !r->acc[0] || !r->acc[1] || !r->dloc || !r->pout || !r->plse || !r->D ||
      !r->scratch) {
    cp_ring_free(r);
    return errf(err, err_size, "context parallelism: out of the %s table's memory for the ring's buffers (%zu bytes)",
                k->name, (z.comm + z.work) * sizeof(real));
  }
  return 0;
}

size_t cp_ring_send_bytes(const struct cp_ring *r, int backward)
{
  const int cp = r->g->size, me = r->g->rank;
  size_t n = 0;
  for (int s = 0; s < cp; s++) {
    const size_t pair = 2 * kv_elems(r, (me - s + cp) % cp);
    if (s < cp - 1)
      n += pair;       /* k and v on to the next rank */
    if (backward)
      n += pair;       /* dk and dv on */
  }
  return n * sizeof(real);
}

/* Posts the transfer of step s + 1's pair: the held one (hk, hv: rank src's) to the next rank,
 * the previous rank's held one into buf. */
static int post_pair(struct cp_ring *r, int s, const real *hk, const real *hv, real *buf,
                     struct comm_request **req)
{
  const int cp = r->g->size, me = r->g->rank;
  const int next = (me + 1) % cp, prev = (me - 1 + cp) % cp;
  const size_t nh = kv_elems(r, (me - s + cp) % cp), nn = kv_elems(r, (me - s - 1 + cp) % cp);
  if (comm_recv(r->g, buf, nn, COMM_REAL, prev, &req[0]) || comm_recv(r->g, buf + nn, nn, COMM_REAL, prev, &req[1]) ||
      comm_send(r->g, hk, nh, COMM_REAL, next, &req[2]) || comm_send(r->g, hv, nh, COMM_REAL, next, &req[3]))
    return -1;
  return 0;
}

static int failed(struct comm_request **req, int n, const char *pass, int s, char *err, size_t err_size)
{
  char msg[512];
  snprintf(msg, sizeof msg, "%s", comm_error());
  comm_wait_all(req, n);
  return errf(err, err_size, "context parallelism: ring %s, step %d: %s", pass, s, msg);
}

int cp_ring_forward(struct cp_ring *r, real *out, real *lse, const real *q, const real *k,
                    const real *v, const struct attention_dropout *drop, char *err, size_t err_size)
{
  const int cp = r->g->size, me = r->g->rank, B = r->B, NH = r->NH, NKV = r->NKV, HS = r->HS;
  const size_t C = (size_t)NH * HS, CK = (size_t)NKV * HS;
  const real *hk = k, *hv = v; /* the pair held at this step */
  int have[2] = { 0, 0 };
  for (int s = 0; s < cp; s++) {
    struct comm_request *req[4] = { NULL, NULL, NULL, NULL };
    real *buf = r->kv[s % 2];
    if (s < cp - 1 && post_pair(r, s, hk, hv, buf, req))
      return failed(req, 4, "forward", s, err, err_size);
    const int src = (me - s + cp) % cp, Tsrc = tokens(r, src);
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 2; j++) {
        const struct piece a = piece_of(r->T, cp, me, i), kb = piece_of(r->T, cp, src, j);
        if (kb.id > a.id)
          continue; /* every key after every row */
        const struct attention_block blk = { r->T, a.start, a.len, kb.start, kb.len, r->Tl, Tsrc };
        real *o = have[i] ? r->pout : out, *l = have[i] ? r->plse : lse;
        r->k->attention_cp_forward(r->kctx, o + (size_t)a.row * C, l + a.row, r->scratch, q + (size_t)a.row * C,
                                   hk + (size_t)kb.row * CK, hv + (size_t)kb.row * CK, drop, &blk, B, NH, NKV,
                                   HS);
        if (have[i])
          r->k->attention_cp_merge(r->kctx, out + (size_t)a.row * C, lse + a.row, r->pout + (size_t)a.row * C,
                                   r->plse + a.row, B, a.len, r->Tl, NH, HS);
        have[i] = 1;
      }
    if (comm_wait_all(req, 4))
      return failed(req, 4, "forward", s, err, err_size);
    const size_t nn = kv_elems(r, (me - s - 1 + cp) % cp);
    hk = buf, hv = buf + nn;
  }
  return 0;
}

int cp_ring_backward(struct cp_ring *r, real *dq, real *dk, real *dv, const real *dout,
                     const real *q, const real *k, const real *v, const real *out,
                     const real *lse, const struct attention_dropout *drop, char *err,
                     size_t err_size)
{
  const int cp = r->g->size, me = r->g->rank, B = r->B, NH = r->NH, NKV = r->NKV, HS = r->HS;
  const int next = (me + 1) % cp, prev = (me - 1 + cp) % cp;
  const size_t C = (size_t)NH * HS, CK = (size_t)NKV * HS;
  const struct kernel_ops *kt = r->k;
  kt->attention_cp_row_dots(r->kctx, r->D, dout, out, B, r->Tl, r->Tl, NH, HS);
  kt->zero(r->kctx, dq, (size_t)B * r->Tl * C * sizeof(real));
  const real *hk = k, *hv = v;
  /* acc_send: the accumulator sent at the last step (its buffer is free once that ends);
   * acc_recv: the one arriving for this step's pair. */
  struct comm_request *acc_send = NULL, *acc_recv = NULL;
  for (int s = 0; s < cp; s++) {
    struct comm_request *req[4] = { NULL, NULL, NULL, NULL };
    real *buf = r->kv[s % 2];
    if (s < cp - 1 && post_pair(r, s, hk, hv, buf, req))
      goto fail;
    const int src = (me - s + cp) % cp, Tsrc = tokens(r, src);
    const size_t nkv = kv_elems(r, src);
    /* this step's share: into the accumulator itself at s = 0 (the pair's first stop), else
     * into dloc while the accumulator arrives */
    real *share = s == 0 ? r->acc[0] : r->dloc;
    kt->zero(r->kctx, share, 2 * nkv * sizeof(real));
    for (int i = 0; i < 2; i++)
      for (int j = 0; j < 2; j++) {
        const struct piece a = piece_of(r->T, cp, me, i), kb = piece_of(r->T, cp, src, j);
        if (kb.id > a.id)
          continue;
        const struct attention_block blk = { r->T, a.start, a.len, kb.start, kb.len, r->Tl, Tsrc };
        const size_t ko = (size_t)kb.row * CK;
        kt->attention_cp_backward(r->kctx, dq + (size_t)a.row * C, share + ko, share + nkv + ko, r->scratch,
                                  dout + (size_t)a.row * C, q + (size_t)a.row * C, hk + ko, hv + ko, lse + a.row,
                                  r->D + a.row, drop, &blk, B, NH, NKV, HS);
      }
    real *acc = r->acc[s % 2];
    if (s > 0) {
      if (comm_wait(&acc_recv))
        goto fail;
      kt->vec_add(r->kctx, acc, acc, share, 2 * nkv);
    }
    /* on with it; the next pair's accumulator (at s = cp − 1: this rank's own, home) into the
     * other buffer, free once the last step's send has ended */
    if (comm_wait(&acc_send))
      goto fail;
    if (cp > 1) {
      const size_t nn = kv_elems(r, (me - s - 1 + cp) % cp);
      if (comm_recv(r->g, r->acc[(s + 1) % 2], 2 * nn, COMM_REAL, prev, &acc_recv) ||
          comm_send(r->g, acc, 2 * nkv, COMM_REAL, next, &acc_send))
        goto fail;
    }
    if (comm_wait_all(req, 4))
      goto fail;
    const size_t nn = kv_elems(r, (me - s - 1 + cp) % cp);
    hk = buf, hv = buf + nn;
    continue;
  fail:
    {
      char msg[512];
      snprintf(msg, sizeof msg, "%s", comm_error());
      comm_wait_all(req, 4);
      comm_wait(&acc_recv);
      comm_wait(&acc_send);
      return errf(err, err_size, "context parallelism: ring backward, step %d: %s", s, msg);
    }
  }
  if (comm_wait(&acc_recv) || comm_wait(&acc_send))
    return errf(err, err_size, "context parallelism: ring backward, the accumulators' last hop: %s", comm_error());
  const real *home = r->acc[cp == 1 ? 0 : cp % 2]; /* cp 1: the share, never sent */
  const size_t mine = kv_elems(r, me);
  kt->copy(r->kctx, dk, home, mine * sizeof(real));
  kt->copy(r->kctx, dv, home + mine, mine * sizeof(real));
  return 0;
}
