/* The stream data plane (comm.h, "Device operations on a stream"): NCCL communicators per group,
 * and an operation as an NCCL call on the caller's CUDA stream followed by an event the comm
 * thread polls to end the operation's record. Built where CMake finds NCCL beside the CUDA
 * backend (TYCHO_HAVE_NCCL); elsewhere every entry says the build has none.
 *
 * Ordering. NCCL calls are made on the caller's thread when the operation is issued, so they sit
 * on the stream between the kernels issued before and after them: a collective reads what the
 * kernels before it wrote and the kernels after it read its result, with no host
 * synchronisation. Every rank issues a group's operations in the same order (the comm layer's
 * rule for every backend), which is the order NCCL needs.
 *
 * Records. The front (comm.c) numbers, counts and records the operation as for MPI; the event
 * recorded after the NCCL call tells the comm thread when the device has run it, so the record's
 * end time, the group's last finished operation and the watchdog's view of what is in flight
 * are the device's, and an operation that never ends on the device (a peer that never joined)
 * ends the job through the watchdog's diagnosis as an MPI one does. */
#include "comm_internal.h"

#include <stdio.h>
#include <string.h>

#if TYCHO_HAVE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

int comm_stream_built(void) { return 1; }

static int nccl_fail(ncclResult_t rc, ncclComm_t c, const char *call, char *err, size_t n)
{
  const char *last = ncclGetLastError(c);
  snprintf(err, n, "rank %d: %s: %s%s%s", comm_ctx.rank, call, ncclGetErrorString(rc), last && *last ? ": " : "",
           last ? last : "");
  return -1;
}

int comm_stream_open(struct comm_group *g, char *err, size_t n)
{
  if (!g || !g->state)
    return snprintf(err, n, "comm_stream_open: no group"), -1;
  if (g->state->nccl)
    return 0;
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  if (g->rank == 0) {
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) /* the others still wait in the broadcast: they get an empty id and fail */
      memset(&id, 0, sizeof id);
  }
  comm_control_begin_on("NCCL communicator set-up", g);
  int rc_mpi = MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, g->state->ctl);
  comm_control_end();
  if (rc_mpi != MPI_SUCCESS)
    return comm_mpi_fail(rc_mpi, "MPI_Bcast(NCCL unique id)", __FILE__, __LINE__, err, n);
  static const ncclUniqueId zero;
  if (!memcmp(&id, &zero, sizeof id))
    return snprintf(err, n, "rank %d: group %s: its rank 0 could not make an NCCL unique id", comm_ctx.rank,
                    g->name), -1;
  ncclComm_t c = NULL;
  comm_control_begin_on("NCCL communicator set-up", g);
  ncclResult_t rc = ncclCommInitRank(&c, g->size, id, g->rank);
  comm_control_end();
  if (rc != ncclSuccess)
    return nccl_fail(rc, c, "ncclCommInitRank", err, n);
  g->state->nccl = c;
  return 0;
}

void comm_stream_close(struct comm_group *g)
{
  if (!g || !g->state || !g->state->nccl)
    return;
  comm_stream_drain(g);
  ncclCommDestroy((ncclComm_t)g->state->nccl);
  g->state->nccl = NULL;
}

static int nccl_type(enum comm_dtype d, ncclDataType_t *t)
{
  switch (d) {
  case COMM_FP32: *t = ncclFloat32; return 0;
  case COMM_BF16: *t = ncclBfloat16; return 0;
  case COMM_FP16: *t = ncclFloat16; return 0;
  case COMM_INT32: *t = ncclInt32; return 0;
  case COMM_INT64: *t = ncclInt64; return 0;
  case COMM_UINT8: *t = ncclUint8; return 0;
  case COMM_FP64: *t = ncclFloat64; return 0;
  default: return -1;
  }
}

int comm_nccl_validate(const struct comm_request *r, char *err, size_t n)
{
  ncclDataType_t t;
  if (!r->group->state->nccl)
    return snprintf(err, n, "comm %s on %s: the group has no NCCL communicator (comm_stream_open)",
                    comm_op_name(r->op), r->group->name), -1;
  if (nccl_type(r->dtype, &t))
    return snprintf(err, n, "comm %s on %s: NCCL has no type for %s", comm_op_name(r->op), r->group->name,
                    comm_dtype_name(r->dtype)), -1;
  return 0;
}

static ncclResult_t per_peer(const struct comm_request *r, ncclDataType_t t, ncclComm_t c, cudaStream_t s)
{
  const struct comm_group *g = r->group;
  const size_t es = comm_dtype_size(r->dtype);
  const size_t *to = r->counts, *from = r->counts + g->size;
  const char *send = r->send;
  char *recv = r->recv;
  ncclResult_t rc = ncclGroupStart();
  size_t at_send = 0, at_recv = 0;
  for (int j = 0; j < g->size && rc == ncclSuccess; j++) {
    if (to[j])
      rc = ncclSend(send + at_send * es, to[j], t, j, c, s);
    if (rc == ncclSuccess && from[j])
      rc = ncclRecv(recv + at_recv * es, from[j], t, j, c, s);
    at_send += to[j];
    at_recv += from[j];
  }
  ncclResult_t end = ncclGroupEnd();
  return rc != ncclSuccess ? rc : end;
}

void comm_nccl_start(struct comm_request *r)
{
  ncclComm_t c = (ncclComm_t)r->group->state->nccl;
  cudaStream_t s = (cudaStream_t)r->stream;
  ncclDataType_t t = ncclFloat32;
  nccl_type(r->dtype, &t); /* validated */
  const ncclRedOp_t op = r->reduce == COMM_MAX ? ncclMax : ncclSum;
  const size_t n = r->n_elems;
  ncclResult_t rc = ncclSuccess;
  const char *call = "";
  switch (r->op) {
  case COMM_ALL_REDUCE: call = "ncclAllReduce"; rc = ncclAllReduce(r->send, r->recv, n, t, op, c, s); break;
  case COMM_ALL_GATHER: call = "ncclAllGather"; rc = ncclAllGather(r->send, r->recv, n, t, c, s); break;
  case COMM_REDUCE_SCATTER: call = "ncclReduceScatter"; rc = ncclReduceScatter(r->send, r->recv, n, t, op, c, s); break;
  case COMM_BROADCAST: call = "ncclBroadcast"; rc = ncclBroadcast(r->recv, r->recv, n, t, r->peer, c, s); break;
  case COMM_SEND: call = "ncclSend"; rc = ncclSend(r->send, n, t, r->peer, c, s); break;
  case COMM_RECV: call = "ncclRecv"; rc = ncclRecv(r->recv, n, t, r->peer, c, s); break;
  case COMM_ALL_TO_ALL:
    call = "ncclSend/ncclRecv (all-to-all)";
    if (r->counts) {
      rc = per_peer(r, t, c, s);
    } else { /* the same block size to every peer */
      const size_t es = comm_dtype_size(r->dtype);
      rc = ncclGroupStart();
      for (int j = 0; j < r->group->size && rc == ncclSuccess; j++) {
        rc = ncclSend((const char *)r->send + (size_t)j * n * es, n, t, j, c, s);
        if (rc == ncclSuccess)
          rc = ncclRecv((char *)r->recv + (size_t)j * n * es, n, t, j, c, s);
      }
      ncclResult_t end = ncclGroupEnd();
      rc = rc != ncclSuccess ? rc : end;
    }
    break;
  default: break;
  }
  if (rc != ncclSuccess) {
    r->status = nccl_fail(rc, c, call, r->err, sizeof r->err);
    return;
  }
  cudaEvent_t ev = NULL;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess)
    e = cudaEventRecord(ev, s);
  if (e != cudaSuccess) {
    if (ev)
      cudaEventDestroy(ev);
    snprintf(r->err, sizeof r->err, "rank %d: after %s: cudaEventRecord: %s", comm_ctx.rank, call,
             cudaGetErrorString(e));
    r->status = -1;
    return;
  }
  r->event = ev;
}

void comm_nccl_progress(struct comm_request *r, int *done)
{
  cudaError_t e = cudaEventQuery((cudaEvent_t)r->event);
  if (e == cudaErrorNotReady) {
    ncclResult_t async = ncclSuccess;
    ncclComm_t c = (ncclComm_t)r->group->state->nccl;
    if (ncclCommGetAsyncError(c, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      r->status = nccl_fail(async, c, "NCCL (asynchronous error)", r->err, sizeof r->err);
      *done = 1;
    }
    return;
  }
  *done = 1;
  if (e != cudaSuccess) {
    snprintf(r->err, sizeof r->err, "rank %d: comm %s on %s: cudaEventQuery: %s", comm_ctx.rank, comm_op_name(r->op),
             r->group->name, cudaGetErrorString(e));
    r->status = -1;
  }
}

void comm_nccl_release(struct comm_request *r)
{
  if (r->event)
    cudaEventDestroy((cudaEvent_t)r->event);
  r->event = NULL;
}

#else /* no NCCL in this build */

int comm_stream_built(void) { return 0; }

int comm_stream_open(struct comm_group *g, char *err, size_t n)
{
  (void)g;
  return snprintf(err, n, "this build of tycho has no NCCL"), -1;
}

void comm_stream_close(struct comm_group *g) { (void)g; }

int comm_nccl_validate(const struct comm_request *r, char *err, size_t n)
{
  return snprintf(err, n, "comm %s on %s: this build of tycho has no NCCL", comm_op_name(r->op), r->group->name), -1;
}

void comm_nccl_start(struct comm_request *r)
{
  r->status = -1;
  snprintf(r->err, sizeof r->err, "this build of tycho has no NCCL");
}

void comm_nccl_progress(struct comm_request *r, int *done)
{
  (void)r;
  *done = 1;
}

void comm_nccl_release(struct comm_request *r) { (void)r; }

#endif
