/* Collectives on model memory: the comm layer's operations (comm/comm.h) on buffers of the
 * model's kernel table, which may be memory the host cannot touch (a GPU's). Every collective,
 * send and receive the runtime issues on tensor memory goes through here, so the choice of how
 * device buffers reach the wire is made once (the plan's `comm`, resolved by the trainer with
 * dcomm_choose):
 *   - direct ("mpi"): the buffers go to the comm layer as they are; one branch, no copies. For
 *     memory the host can see (the CPU's);
 *   - staged: each operation copies its device input to a host staging buffer with the table's
 *     to_host, runs the same comm operation on host buffers, and copies the result back with
 *     from_host. Correct for any number of ranks (ranks sharing one GPU included), and the comm
 *     layer's counters, records and sequence numbers are the direct run's: the same operation,
 *     the same element counts, only other addresses;
 *   - nccl: the same operation on the device buffers themselves, put on the CUDA context's
 *     stream by the comm layer's NCCL plane (comm_stream_set): ordered with the kernels, no copy
 *     and no host synchronisation; a started operation's req comes back NULL (nothing to wait
 *     for on the host), and the counters and records are again the direct run's.
 * Started operations (req non-NULL) stay started: the input is copied out when the operation is
 * issued, and the copy back runs when the caller ends it (comm_wait, comm_wait_all or comm_test,
 * through comm_request_then), on the caller's thread, ordered with its kernels; the caller keeps
 * its waits. Staging buffers are host memory from the allocator (alloc_host_bytes, billed as
 * "comm" on the host), kept and reused by size, one per operation in flight, and given back by
 * dcomm_release. Called from the thread that drives the run (as the allocator is). */
#ifndef TYCHO_RUNTIME_PARALLEL_DCOMM_H
#define TYCHO_RUNTIME_PARALLEL_DCOMM_H
#include <stddef.h>

#include "comm/comm.h"
#include "plan/plan.h"

struct kernel_ops;

enum dcomm_mode { DCOMM_DIRECT, DCOMM_STAGED, DCOMM_NCCL };
const char *dcomm_mode_name(enum dcomm_mode m); /* "mpi", "staged", "nccl" */

/* Where the buffers of an operation live and how they travel. */
struct dcomm_mem {
  const struct kernel_ops *k; /* the table the buffers belong to (to_host, from_host) */
  void *kctx;
  enum dcomm_mode mode;
  void *stream;               /* DCOMM_NCCL: the CUDA stream of kctx */
};
/* The dcomm_mem of anything with k, kctx, comm_mode and comm_stream (a model, its model_tp). */
#define DCOMM_OF(x) (&(const struct dcomm_mem){ (x)->k, (x)->kctx, (x)->comm_mode, (x)->comm_stream })

/* What decides the mode, besides the plan's field. */
struct dcomm_facts {
  const char *backend; /* the kernel table's name ("cpu", "cuda", ...) */
  int host_visible;    /* the table's memory is host memory */
  int cuda;            /* the table is the CUDA backend's (its memory a CUDA device's) */
  int nccl_built;      /* this build has the NCCL plane (comm_stream_built) */
  int ranks_per_gpu;   /* the most ranks sharing one GPU on any node (1: each its own); 0 unknown */
};
/* The plan's comm (p->comm) resolved: "auto" is NCCL on a CUDA table when the build has NCCL and
 * every rank has its own GPU, staged on other memory the host cannot see, direct on host
 * memory. A choice the facts cannot carry is refused: 0, or −2 (a plan error) with the reason,
 * naming the plan's comm field, in err. */
int dcomm_choose(const struct plan *p, const struct dcomm_facts *f, enum dcomm_mode *mode, char *err,
                 size_t err_size);

/* As comm_all_reduce, comm_all_gather, ... (same arguments after the first, same in-place rules,
 * same return: 0, or -1 with the reason in comm_error()). A staging buffer the host has no room
 * for fails the operation before it starts, on this rank only (comm_error() says so). */
int dcomm_all_reduce(const struct dcomm_mem *d, struct comm_group *g, const void *send, void *recv,
                     size_t n_elems, enum comm_dtype dtype, enum comm_reduce reduce, struct comm_request **req);
int dcomm_all_gather(const struct dcomm_mem *d, struct comm_group *g, const void *send, void *recv,
                     size_t n_elems, enum comm_dtype dtype, struct comm_request **req);
int dcomm_reduce_scatter(const struct dcomm_mem *d, struct comm_group *g, const void *send, void *recv,
                         size_t n_elems, enum comm_dtype dtype, enum comm_reduce reduce, struct comm_request **req);
int dcomm_broadcast(const struct dcomm_mem *d, struct comm_group *g, void *buf, size_t n_elems,
                    enum comm_dtype dtype, int root, struct comm_request **req);
int dcomm_send(const struct dcomm_mem *d, struct comm_group *g, const void *buf, size_t n_elems,
               enum comm_dtype dtype, int peer, struct comm_request **req);
int dcomm_recv(const struct dcomm_mem *d, struct comm_group *g, void *buf, size_t n_elems,
               enum comm_dtype dtype, int peer, struct comm_request **req);
int dcomm_all_to_all_v(const struct dcomm_mem *d, struct comm_group *g, const void *send,
                       const size_t *send_counts, void *recv, const size_t *recv_counts,
                       enum comm_dtype dtype, struct comm_request **req);

/* Frees the staging buffers no operation holds (the trainer's close); those of operations still
 * in flight stay theirs. */
void dcomm_release(void);
/* Host bytes the staging buffers hold now (in use or kept for reuse). */
size_t dcomm_staging_bytes(void);

#endif
