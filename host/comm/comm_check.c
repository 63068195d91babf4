/* Check mode (docs/design.md, "Collectives"): before each collective every member of the group
 * shares what it is about to do (seq, op, n_bytes, root, reduction, dtype) with a small all-gather
 * on the group's control communicator; every member then finds the same first difference and
 * returns the same message, where the collective itself would hang or mix up data. An all-to-all
 * with per-peer counts, whose n_bytes differ from rank to rank by design, shares its counts
 * instead, and every pair must agree (what i sends to j is what j expects from i). A checked send
 * carries its sender's view in a message ahead of the data; the receiver compares. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "comm_internal.h"

#define ctx comm_ctx

enum { KEY_SEQ, KEY_OP, KEY_BYTES, KEY_PEER, KEY_REDUCE, KEY_DTYPE };
static const char *const key_names[COMM_CHECK_FIELDS] = { "seq", "op", "n_bytes", "root", "reduce", "dtype" };

void comm_check_key(const struct comm_request *r, int64_t key[COMM_CHECK_FIELDS])
{
  key[KEY_SEQ] = (int64_t)r->rec.seq;
  key[KEY_OP] = r->op;
  key[KEY_BYTES] = r->counts ? -1 : (int64_t)r->rec.n_bytes; /* per peer: compared pair by pair */
  key[KEY_PEER] = r->peer;
  key[KEY_REDUCE] = r->op == COMM_ALL_REDUCE || r->op == COMM_REDUCE_SCATTER ? (int64_t)r->reduce : -1;
  key[KEY_DTYPE] = r->dtype;
}

static const char *key_text(int field, int64_t v, char *buf, size_t n)
{
  if (field == KEY_OP)
    return comm_op_name((enum comm_op)v);
  if (field == KEY_DTYPE)
    return comm_dtype_name((enum comm_dtype)v);
  if (field == KEY_REDUCE)
    return v < 0 ? "none" : comm_reduce_name((enum comm_reduce)v);
  if (field == KEY_PEER && v < 0)
    return "none";
  if (field == KEY_BYTES && v < 0)
    return "per-peer counts";
  snprintf(buf, n, "%" PRId64, v);
  return buf;
}

/* The per-peer counts of an all-to-all-v, pair by pair: every member gathers every member's
 * counts (to each peer, then from each peer) and finds the same first pair, in group-rank
 * order, where the sender's count differs from the receiver's. */
static int check_per_peer_counts(const struct comm_request *r, char *err, size_t n)
{
  const struct comm_group *g = r->group;
  const size_t size = (size_t)g->size;
  int64_t *mine = malloc(2 * size * sizeof *mine), *all = malloc(2 * size * size * sizeof *all);
  if (!mine || !all) {
    free(mine);
    free(all);
    return snprintf(err, n, "rank %d: comm check: out of memory", ctx.rank), -1;
  }
  for (size_t j = 0; j < 2 * size; j++)
    mine[j] = (int64_t)r->counts[j];
  int rc = MPI_Allgather(mine, 2 * g->size, MPI_INT64_T, all, 2 * g->size, MPI_INT64_T, g->state->ctl);
  free(mine);
  if (rc != MPI_SUCCESS) {
    free(all);
    return comm_mpi_fail(rc, "MPI_Allgather", __FILE__, __LINE__, err, n);
  }
  int status = 0;
  for (size_t i = 0; i < size && !status; i++)
    for (size_t j = 0; j < size; j++) {
      int64_t sends = all[i * 2 * size + j], expects = all[j * 2 * size + size + i];
      if (sends == expects)
        continue;
      snprintf(err, n, "comm check on %s before all-to-all seq %" PRIu64 ": group rank %zu (world rank %d) sends "
               "%" PRId64 " elements to group rank %zu (world rank %d), which expects %" PRId64 " from it", g->name,
               r->rec.seq, i, g->ranks[i], sends, j, g->ranks[j], expects);
      status = -1;
      break;
    }
  free(all);
  return status;
}

int comm_check_collective(struct comm_request *r, char *err, size_t n)
{
  struct comm_group *g = r->group;
  int64_t *all = malloc((size_t)g->size * COMM_CHECK_FIELDS * sizeof *all);
  if (!all)
    return snprintf(err, n, "rank %d: comm check: out of memory", ctx.rank), -1;
  int rc = MPI_Allgather(r->check_key, COMM_CHECK_FIELDS, MPI_INT64_T, all, COMM_CHECK_FIELDS, MPI_INT64_T,
                         g->state->ctl);
  if (rc != MPI_SUCCESS) {
    free(all);
    return comm_mpi_fail(rc, "MPI_Allgather", __FILE__, __LINE__, err, n);
  }
  /* Every member compares against group rank 0 from the same data: one message everywhere. */
  int status = 0;
  for (int j = 1; j < g->size && !status; j++)
    for (int f = 0; f < COMM_CHECK_FIELDS; f++) {
      int64_t mine = all[(size_t)j * COMM_CHECK_FIELDS + f], first = all[f];
      if (mine == first)
        continue;
      char a[32], b[32];
      snprintf(err, n, "comm check on %s before %s seq %" PRId64 " (as group rank 0 sees it): group rank %d "
               "(world rank %d) has %s %s where group rank 0 (world rank %d) has %s %s", g->name,
               comm_op_name((enum comm_op)all[KEY_OP]), all[KEY_SEQ], j, g->ranks[j], key_names[f],
               key_text(f, mine, a, sizeof a), g->ranks[0], key_names[f], key_text(f, first, b, sizeof b));
      status = -1;
      break;
    }
  free(all);
  /* every member saw the same keys, so either all of them or none compare the counts */
  return status ? status : r->counts ? check_per_peer_counts(r, err, n) : 0;
}

int comm_check_p2p(const struct comm_request *r, char *err, size_t n)
{
  static const int fields[] = { KEY_OP, KEY_SEQ, KEY_BYTES, KEY_DTYPE };
  const struct comm_group *g = r->group;
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    int f = fields[i];
    int64_t sender = r->peer_key[f], mine = f == KEY_OP ? COMM_SEND : r->check_key[f];
    if (sender == mine)
      continue;
    char a[32], b[32];
    snprintf(err, n, "comm check on %s: recv seq %" PRIu64 " from group rank %d (world rank %d): the sender "
             "has %s %s where this rank (world rank %d) expects %s %s", g->name, r->rec.seq, r->peer,
             g->ranks[r->peer], key_names[f], key_text(f, sender, a, sizeof a), ctx.rank, key_names[f],
             key_text(f, mine, b, sizeof b));
    return -1;
  }
  return 0;
}
