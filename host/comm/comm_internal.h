/* Inside the comm layer: the per-rank context, the request, the data-plane backend interface
 * and the MPI helpers the comm/ files share. Not for use outside host/comm/.
 *
 * Threads. The caller issues operations; the comm thread (comm.c) starts them through the
 * backend in issue order and tests them until they finish, so they progress while the caller
 * computes; the watchdog (comm_watchdog.c) watches their age and answers peers' questions.
 * One lock, ctx.lock, guards the queue, the in-flight list, the flight recorder, counters and
 * sequence numbers. The control plane (world, splits, plan hash, check mode, trace gathering,
 * watchdog queries) is MPI whatever the data plane is, so MPI types are fine here. */
#ifndef TYCHO_COMM_INTERNAL_H
#define TYCHO_COMM_INTERNAL_H
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>

#include "comm.h"

#define COMM_ERR_MAX 512
#define COMM_CHECK_FIELDS 6 /* seq, op, n_bytes, peer, reduce, dtype */
#define COMM_TAG_DATA 0
#define COMM_TAG_CHECK 1

struct comm_group_state {
  void *data;         /* the data-plane backend's channel for the group (group_open's), used
                       * by the comm thread only, in issue order */
  MPI_Comm ctl;       /* control: splits and check mode, from the caller's thread only */
  uint64_t seq;       /* the next collective's sequence number */
  uint64_t *send_seq; /* (size) next send sequence number per peer */
  uint64_t *recv_seq; /* (size) next recv sequence number per peer */
  struct comm_counter counters[COMM_N_OPS];
  struct comm_record last_done; /* the last finished operation, for the watchdog's answers */
  int has_last_done;
  void *nccl;         /* the group's NCCL communicator (comm_stream_open), NULL without one */
};

/* One operation from issue to completion; the public handle. */
struct comm_request {
  struct comm_group *group;
  enum comm_op op;
  enum comm_dtype dtype;
  enum comm_reduce reduce;
  const void *send;
  void *recv;
  size_t n_elems;    /* all-to-all-v: the elements sent, the sum of counts[0, size) */
  size_t *counts;    /* all-to-all-v only, else NULL: (2 · group size) elements to each peer, then
                      * from each peer; the request's own copy, freed with it */
  void *backend_mem; /* the backend's memory for this request (MPI: all-to-all-v's int counts and
                      * displacements), freed with it */
  int peer;         /* group rank: root of a broadcast, peer of a send or recv; -1 otherwise */
  int checked;      /* check mode was on when it was issued */
  int64_t check_key[COMM_CHECK_FIELDS]; /* this rank's view, for check mode */
  int64_t peer_key[COMM_CHECK_FIELDS];  /* the sender's view, received with a checked recv */
  struct comm_record rec;
  uint64_t rec_id;  /* its index in the flight recorder */
  int on_stack;     /* a blocking call's request, owned by the caller's frame */
  void (*then)(void *arg, int status); /* comm_request_then's: run by whoever ends it */
  void *then_arg;
  atomic_int done; /* set last, by the comm thread: the caller may spin on it without the lock */
  int status;
  char err[COMM_ERR_MAX];
  void *stream;     /* a stream operation's CUDA stream (comm_stream_set), NULL for the comm thread's */
  void *event;      /* its CUDA event, recorded after the NCCL call; the comm thread polls it */
  MPI_Request mpi[2]; /* data, and the check message of a send or recv */
  int n_mpi;
  struct comm_request *next_queued;
  struct comm_request *prev_inflight, *next_inflight;
};

/* The data plane, chosen at comm_init by name (TYCHO_COMM_BACKEND, default "mpi"; comm.c lists
 * the backends of the build). start and progress run on the comm thread only; group_open and
 * group_close on the caller's thread, collectively over the group (its control communicator
 * exists: an NCCL backend would share its unique id over it). */
struct comm_backend {
  const char *name;
  /* The group's data channel into g->state->data (MPI: a duplicate of the control communicator;
   * NCCL: a communicator of the group's ranks). 0, or -1 with a message. */
  int (*group_open)(struct comm_group *g, char *err, size_t err_size);
  /* Frees what group_open made (also after a group_open that failed half-way). */
  void (*group_close)(struct comm_group *g);
  /* Refuses what this backend cannot carry (half-precision reductions, counts over INT_MAX). */
  int (*validate)(const struct comm_request *r, char *err, size_t err_size);
  /* Starts r; a size-1 collective may finish here. On failure sets r->status and r->err. An
   * all-to-all with r->counts set is the per-peer form (blocks packed in group-rank order);
   * memory the backend needs until r ends goes in r->backend_mem. */
  void (*start)(struct comm_request *r);
  /* Sets *done once r has finished, with r->status and r->err saying how. */
  void (*progress)(struct comm_request *r, int *done);
};

struct comm_span {
  char name[32];
  double t_begin, t_end;
  long long step;  /* comm_set_step's when the span was added */
  int stage, mb;   /* pipeline stage and micro-batch, -1 for none */
  double flops;    /* 0 when not counted; a counter's value */
  char series[24]; /* a counter (comm_trace_counter): its series; "" for a span */
};

struct comm_context {
  int initialized, mpi_owned;
  int rank, size, local_rank, local_size;
  double t0; /* monotonic seconds at the start barrier */
  const struct comm_backend *backend;
  struct comm_group *world;
  struct comm_group **groups; /* every group this rank holds, world first */
  int n_groups, cap_groups;
  MPI_Comm watch;             /* the watchdog's questions and answers */

  pthread_mutex_t lock;
  pthread_cond_t work;        /* to the comm thread: work queued, or stop */
  pthread_cond_t finished;    /* from the comm thread: a request finished */
  pthread_cond_t wake_watchdog;
  pthread_t thread, watchdog;
  int threads_started, stop_thread, stop_watchdog;
  atomic_int work_queued;     /* the queue is not empty: lets an idle comm thread spin briefly */
  struct comm_request *queue_head, *queue_tail; /* issued, not yet started */
  struct comm_request *inflight;                /* issued, not finished */
  struct { const char *what; double t_begin; int active, untimed; const struct comm_group *group; } control; /* a control-plane call; untimed: named in answers, never diagnosed for its age (a REPL rank waiting for the others' chunk) */

  unsigned long long ops_started; /* operations begun (collectives, sends, control calls): comm_ops_started */

  long long step;
  int mb;
  int check;
  double timeout;

  struct comm_record *records; /* (n_records_cap) ring */
  int n_records_cap;
  uint64_t n_records;          /* ever added */
  struct comm_span *spans;     /* (n_records_cap) ring */
  uint64_t n_spans;

  char error[COMM_ERR_MAX];    /* comm_error() */
  char stream_error[COMM_ERR_MAX]; /* the first stream operation that failed on the device
                                    * (nobody waits for one): comm_stream_status */
};

extern struct comm_context comm_ctx;
extern const struct comm_backend comm_mpi_backend;

/* comm.c */
double comm_clock(void); /* monotonic seconds */
int comm_group_add(struct comm_group *g); /* to ctx.groups; -1 out of memory */

/* comm_record.c; callers hold ctx.lock. */
int comm_recorder_init(int capacity);
void comm_recorder_free(void);
uint64_t comm_recorder_add(const struct comm_record *rec);
void comm_recorder_update(uint64_t id, const struct comm_record *rec);
int comm_recorder_last(struct comm_record *out, int max);
int comm_recorder_spans(struct comm_span *out, int max);

/* comm_mpi.c */
/* Formats "rank R: file:line: MPI_Xxx: <MPI's error string>" into err; returns -1. */
int comm_mpi_fail(int code, const char *call, const char *file, int line, char *err, size_t err_size);
#define MPI_CHECK(call, err, err_size) do { int mpi_rc_ = (call); if (mpi_rc_ != MPI_SUCCESS) \
  return comm_mpi_fail(mpi_rc_, #call, __FILE__, __LINE__, (err), (err_size)); } while (0)
int comm_mpi_init(int *argc, char ***argv, char *err, size_t err_size);
int comm_mpi_finalize(char *err, size_t err_size);
/* A barrier over the world's control communicator that polls, so the watchdog can time it. */
int comm_mpi_leave_barrier(char *err, size_t err_size);
/* A group whose control communicator is `ctl` (taken over, freed on failure) and whose data
 * communicator is a duplicate of it; added to the context. */
int comm_mpi_group_new(MPI_Comm ctl, const char *name, struct comm_group **out, char *err, size_t err_size);
void comm_mpi_group_free(struct comm_group *g);

/* comm_nccl.c: the stream data plane. validate on the caller's thread; start there too (the NCCL
 * call on r->stream, then the event); progress and release on the comm thread. */
int comm_nccl_validate(const struct comm_request *r, char *err, size_t err_size);
void comm_nccl_start(struct comm_request *r);
void comm_nccl_progress(struct comm_request *r, int *done);
void comm_nccl_release(struct comm_request *r);
/* comm.c: waits until no stream operation on g is in flight (the device has run them). */
void comm_stream_drain(const struct comm_group *g);

/* comm_check.c: check mode's cross-check of a collective, on the caller's thread. */
int comm_check_collective(struct comm_request *r, char *err, size_t err_size);
/* Compares a finished checked recv's key with the sender's. */
int comm_check_p2p(const struct comm_request *r, char *err, size_t err_size);
void comm_check_key(const struct comm_request *r, int64_t key[COMM_CHECK_FIELDS]);

/* comm_watchdog.c */
int comm_watchdog_start(char *err, size_t err_size);
void comm_watchdog_stop(void);
/* Brackets a blocking control-plane call so the watchdog also times it. */
void comm_control_begin(const char *what);
/* The same for a call that waits for every member of `group`: a diagnosis asks them where they are. */
void comm_control_begin_on(const char *what, const struct comm_group *group);
void comm_control_end(void);
/* The same as comm_control_begin_on for a wait whose length is the user's (the REPL): peers'
 * questions are answered with `what`, but the watchdog never ends the job for its age. */
void comm_control_begin_untimed(const char *what, const struct comm_group *group);

#endif
