/* The comm layer: process groups and collectives, one interface for every backend (docs/design.md,
 * "The mesh" and "Collectives"). MPI carries host buffers; NCCL carries a GPU's buffers on a CUDA
 * stream behind the same functions (comm_stream_set), so nothing here names an MPI type.
 *
 * Conventions.
 * - Counts are elements (`n_elems`, of `enum comm_dtype`); sizes are bytes (`n_bytes`).
 * - Ranks passed to an operation (root, peer) are ranks in the group, not world ranks.
 * - Every operation takes `struct comm_request **req` last. NULL: the operation has completed
 *   when the call returns (blocking). Non-NULL: the call starts it, stores a handle in *req and
 *   returns at once; the buffers belong to the comm layer until comm_wait or comm_test says the
 *   operation is done. Either way the operation runs on this rank's comm thread, which keeps it
 *   progressing while the caller computes, and operations run in the order they were issued.
 * - Operations return 0, or -1 with the reason in comm_error(). Set-up functions (init, groups,
 *   plan hash, trace) write their reason into `err` instead.
 * - Every operation is counted and recorded, size-1 groups included (where it is a copy or
 *   nothing). The comm layer's own control traffic (plan-hash check, check mode, trace
 *   gathering, watchdog queries) is neither: the counters hold model traffic only.
 * - The API is called from one thread per rank.
 *
 * What n_bytes counts, per call (nccl-tests' "size"): all-reduce and broadcast, the buffer;
 * all-gather, the gathered buffer (size · n_elems elements); reduce-scatter, the buffer before
 * scattering (size · n_elems); all-to-all, the send buffer (size · n_elems; with per-peer counts,
 * the sum of send_counts); send and recv, the message. So a rank's all-to-all bytes are what it
 * sends; summed over a group they are also what its members receive.
 *
 * Environment: TYCHO_COMM_TIMEOUT (seconds, default 300, 0 = never) for the watchdog;
 * TYCHO_COMM_CHECK=1 for check mode; TYCHO_COMM_RECORDS for the flight recorder's length. */
#ifndef TYCHO_COMM_H
#define TYCHO_COMM_H
#include <stddef.h>
#include <stdint.h>

#include "real.h"

#define COMM_NAME_MAX 16
#define COMM_RECORDS_DEFAULT 4096
#define COMM_TIMEOUT_DEFAULT 300.0

enum comm_dtype {
  COMM_FP32, COMM_BF16, COMM_FP16, COMM_INT32, COMM_INT64, COMM_UINT8, COMM_FP64, COMM_N_DTYPES
};
/* The runtime's tensors move as `real` (kernels/real.h): fp32, or fp64 in the float64 build. */
#define COMM_REAL (REAL_IS_DOUBLE ? COMM_FP64 : COMM_FP32)
/* Reductions: every type but fp16 sums (bf16 sums only, on the MPI backend); a bf16 sum widens each pair,
 * adds in fp32 and rounds to nearest even once per combination (NCCL's, and the MPI backend's own
 * operation). */
enum comm_reduce { COMM_SUM, COMM_MAX, COMM_N_REDUCES };
enum comm_op {
  COMM_ALL_REDUCE, COMM_ALL_GATHER, COMM_REDUCE_SCATTER, COMM_BROADCAST,
  COMM_SEND, COMM_RECV, COMM_ALL_TO_ALL, COMM_N_OPS
};

/* One process group: the world, or the ranks along one mesh axis. */
struct comm_group {
  char name[COMM_NAME_MAX];       /* "world", "tp", "dp", "pp" */
  int rank;                       /* this rank's index in the group */
  int size;
  int *ranks;                     /* (size) world rank of each member, in group order */
  struct comm_group_state *state; /* backend handles, sequence numbers, counters */
};

struct comm_request; /* a started operation; comm_wait or comm_test ends it */

/* One operation in the flight recorder. Times are seconds since the job's start barrier
 * (comparable across ranks on one node): issued by the caller, started on the comm thread,
 * ended (0 while in flight). */
struct comm_record {
  uint64_t seq;  /* per group for collectives; per (group, peer, direction) for send and recv */
  enum comm_op op;
  char group[COMM_NAME_MAX];
  int peer;      /* group rank of the root (broadcast) or the peer (send, recv); -1 otherwise */
  size_t n_bytes;
  long long step;
  int mb;
  int status;    /* 0 ok, -1 failed */
  double t_issue, t_start, t_end;
};

struct comm_counter {
  uint64_t calls;
  uint64_t n_bytes;
};

/* Set-up. comm_init starts MPI with MPI_THREAD_MULTIPLE (refusing less), builds the world group,
 * aligns clocks with a barrier and starts the comm thread and the watchdog. */
int comm_init(int *argc, char ***argv, char *err, size_t err_size);
/* Waits for every started operation, stops the threads, frees the groups, ends MPI. */
int comm_finalize(char *err, size_t err_size);
struct comm_group *comm_world(void);
int comm_local_rank(void); /* from OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID, else MPI */
int comm_local_size(void);
const char *comm_backend_name(void);
/* Checks TYCHO_COMM_BACKEND (unset or empty: "mpi") against the data-plane backends of this
 * build, before comm_init: 0, or -1 with a message naming the ones there are. */
int comm_backend_check(char *err, size_t err_size);

/* Splits `parent` by color (ranks with equal colors form one group), ordered by key.
 * Collective over the parent. It runs on the parent's control communicator, so operations
 * in flight on the parent need not finish first. */
int comm_group_split(struct comm_group *parent, int color, int key, const char *name,
                     struct comm_group **out, char *err, size_t err_size);

/* Frees a group from comm_group_split (the mesh groups included): its communicators (MPI_Comm_free,
 * collective over g), counters and sequence numbers; NULL is a no-op. Refused (-1 with the reason)
 * for the world and while an operation on g is in flight. Records of it stay in the recorder. */
int comm_group_free(struct comm_group *g, char *err, size_t err_size);
/* The lowest world rank whose status is nonzero (INT_MAX: none) into *first, on every rank: the
 * verdict after work each rank did on its own (the mesh groups, mesh/mesh.h). Control traffic,
 * named `what` in the trace. Collective over the world. 0, or -1 with the MPI error. */
int comm_world_first_failed(int status, const char *what, int *first, char *err, size_t err_size);
/* Groups this rank holds now, the world included (1 after comm_init). */
int comm_groups_held(void);

/* Gathers every rank's plan hash; on a mismatch every rank returns -1 with a message naming
 * which ranks have which hash. Collective over the world. */
int comm_check_plan_hash(uint64_t hash, char *err, size_t err_size);

/* Agreement after work each rank does on its own (set-up, opening files, writing output), the
 * primitive under comm_agree_err: every member passes its status (0 ok, else nonzero) and
 * message; every member gets back the
 * status of the lowest group rank that failed (0 when none did), that rank's message in msg
 * (up to COMM_AGREE_MSG_MAX bytes) and its world rank in *failed_rank (-1 when none). So a
 * failure only one rank saw stops every rank at the same point, with one message. Control
 * traffic (not counted); -1 with the MPI error in msg and *failed_rank -1 when the agreement
 * itself fails. Collective over g. */
#define COMM_AGREE_MSG_MAX 2048
int comm_agree(struct comm_group *g, int status, char *msg, size_t msg_size, int *failed_rank);
/* The agreement every caller with an err buffer uses: every member of g passes its status (0 ok,
 * else nonzero: −1, or a code the caller reads back — an error class, a signal) with its message
 * in err; every member returns the status of the lowest group rank that failed (0 when none did)
 * with that rank's message in err, the same words on every rank. `naming` says whether the
 * message follows "rank R: " (R its world rank): COMM_AGREE_PLAIN never, COMM_AGREE_NAME_RANK
 * always, COMM_AGREE_NAME_RANK_UNLESS_PLAN unless the agreed status is COMM_AGREE_PLAN_ERROR (an
 * error in the plan reads the same whichever rank found it). A group of one or NULL: the status
 * as it is, err untouched. −1 with the MPI error in err when the agreement itself fails.
 * Collective over g. */
#define COMM_AGREE_PLAN_ERROR (-2)
enum comm_agree_naming { COMM_AGREE_PLAIN, COMM_AGREE_NAME_RANK, COMM_AGREE_NAME_RANK_UNLESS_PLAN };
int comm_agree_err(struct comm_group *g, int status, char *err, size_t err_size, enum comm_agree_naming naming);

/* Which world ranks take part in what runs now (a REPL chunk's targets): members[r] for each of
 * the world's n ranks, or NULL for every rank (the default). From then on an operation — a
 * collective, a send or receive, an agreement, a split — on a group with a member outside the
 * set is refused before anything starts, with a message naming the group, the ranks it needs
 * and the set: a collective only part of its group reaches would wait forever. 0, or −1 (bad
 * size, out of memory). */
int comm_restrict(const unsigned char *members, int n_members);
/* "0-3,5,7": the ranks whose flag is set (n flags), runs of three or more as ranges. */
void comm_format_ranks(const unsigned char *flags, int n, char *out, size_t size);
/* 0 when every member of g may take part now; else −1 with the refusal in err. */
int comm_restricted_check(const struct comm_group *g, const char *what, char *err, size_t err_size);

/* The REPL's control plane, on a group of its own (comm_group_split of the world): not counted
 * as model traffic and never restricted; its waits last as long as another rank's chunk or the
 * user, so the watchdog names them in its answers (`what`; NULL: waiting for the next chunk)
 * but never times them, and a peer stuck in a timed wait does not leave its abort to a rank
 * that waits here. The wait for the next chunk (what NULL) sleeps between tests instead of
 * polling a core; it is a nonblocking broadcast, which a blocking one does not match, so every
 * member passes NULL alike. comm_control_bcast: n_bytes from root to every member. comm_control_gather: every member's n_bytes to root, which gets each rank's bytes
 * in per_rank[r] (malloc'd, 0-terminated; NULL when it had no room for them, the bytes read and
 * dropped so nobody waits) and counts[r]. Collective over g; 0, or −1 with err.
 * comm_control_bcast_timed: a broadcast inside a chunk, where every member is due at once (the
 * REPL's interrupt check at a step boundary): timed as a model collective is, so a chunk that
 * leaves a member out ends in the watchdog's diagnosis, not a hang. */
int comm_control_bcast(struct comm_group *g, void *buf, size_t n_bytes, int root, const char *what,
                       char *err, size_t err_size);
int comm_control_bcast_timed(struct comm_group *g, void *buf, size_t n_bytes, int root, const char *what,
                             char *err, size_t err_size);
int comm_control_gather(struct comm_group *g, const void *send, size_t n_bytes, int root, char **per_rank,
                        size_t *counts, const char *what, char *err, size_t err_size);

/* Operations. n_elems per rank as in MPI and NCCL: all-gather, the contribution of each rank;
 * reduce-scatter, the share each rank receives; all-to-all, the block sent to each peer (its
 * per-peer form, comm_all_to_all_v, takes one count per peer instead).
 * In place: all-reduce with send == recv; all-gather with send == recv + rank · n_elems.
 * Other overlapping buffers are refused. */
int comm_all_reduce(struct comm_group *g, const void *send, void *recv, size_t n_elems,
                    enum comm_dtype dtype, enum comm_reduce reduce, struct comm_request **req);
int comm_all_gather(struct comm_group *g, const void *send, void *recv, size_t n_elems,
                    enum comm_dtype dtype, struct comm_request **req);
int comm_reduce_scatter(struct comm_group *g, const void *send, void *recv, size_t n_elems,
                        enum comm_dtype dtype, enum comm_reduce reduce, struct comm_request **req);
int comm_broadcast(struct comm_group *g, void *buf, size_t n_elems, enum comm_dtype dtype, int root,
                   struct comm_request **req);
int comm_send(struct comm_group *g, const void *buf, size_t n_elems, enum comm_dtype dtype, int peer,
              struct comm_request **req);
int comm_recv(struct comm_group *g, void *buf, size_t n_elems, enum comm_dtype dtype, int peer,
              struct comm_request **req);
int comm_all_to_all(struct comm_group *g, const void *send, void *recv, size_t n_elems,
                    enum comm_dtype dtype, struct comm_request **req);
/* All-to-all with per-peer counts (expert parallelism's dispatch and combine): this rank sends
 * send_counts[j] elements to group rank j and receives recv_counts[j] elements from it, zeros
 * allowed. Blocks are packed in group-rank order, with no displacements: peer j's block starts
 * at element send_counts[0] + … + send_counts[j-1] of send, and at recv_counts[0] + … +
 * recv_counts[j-1] of recv. Both arrays have g->size entries and are copied: the caller may
 * change them as soon as the call returns (the buffers, as for every operation, belong to the
 * layer until it ends). Every pair must agree, send_counts[j] on group rank i equal to
 * recv_counts[i] on group rank j: check mode proves it across the group before any data moves
 * and names the first pair that differs; without it a mismatch is MPI's undefined case: a
 * truncation error, a block whose end is left as it was, or (seen with Open MPI, to a peer that
 * expects nothing) a message left unmatched and a call that succeeds. This rank's own pair
 * (send_counts[rank] == recv_counts[rank]) is checked always.
 * Not in place (send and recv must not overlap). Recorded and counted as COMM_ALL_TO_ALL
 * ("all-to-all"), n_bytes the send buffer: the sum of send_counts, in bytes. */
int comm_all_to_all_v(struct comm_group *g, const void *send, const size_t *send_counts, void *recv,
                      const size_t *recv_counts, enum comm_dtype dtype, struct comm_request **req);
/* The counts of a comm_all_to_all_v whose receivers do not know them (dropless routing): this
 * rank's send_counts[j] arrives in recv_counts[i] on group rank j (i this rank). Both have
 * g->size entries. It is comm_all_to_all of one COMM_INT64 per peer, recorded and counted as
 * such (8 · g->size bytes): model traffic, like the exchange it sizes. */
int comm_all_to_all_counts(struct comm_group *g, const size_t *send_counts, size_t *recv_counts,
                           struct comm_request **req);

/* Work the caller attaches to a started operation, run when it ends, on the thread that ends it
 * (comm_wait, comm_wait_all, comm_test), before the handle is freed: fn(arg, the operation's
 * status). The staged comm of device buffers (runtime/parallel/dcomm.h) copies what a receive
 * brought back to the device there, ordered with the caller's kernels. One per request. */
void comm_request_then(struct comm_request *req, void (*fn)(void *arg, int status), void *arg);
/* Ends a started operation: waits for it, frees the handle, sets *req to NULL and returns the
 * operation's status. NULL *req is a no-op. */
int comm_wait(struct comm_request **req);
/* Waits for all n; returns -1 if any failed (comm_error() holds the first failure). */
int comm_wait_all(struct comm_request **reqs, int n);
/* *done = 1 when the operation has completed; then as comm_wait. Otherwise returns 0. */
int comm_test(struct comm_request **req, int *done);

/* Device operations on a stream (NCCL, where this build has it: comm_stream_built()). A group
 * given a communicator by comm_stream_open carries, on the thread that called
 * comm_stream_set(stream) with a CUDA stream, every operation that thread issues until
 * comm_stream_set(NULL), as an NCCL call on that stream: ordered with the kernels issued on the
 * stream before and after it, with no host synchronisation. Such an operation returns once it is
 * on the stream, whether or not req is given (*req is set to NULL: there is nothing to wait for
 * on the host); it is numbered, counted and recorded as any other, and the comm thread ends its
 * record when the device has run it, so the watchdog times it on the device. A failure the
 * device reports later is kept: comm_stream_status. Buffers are the stream's device's memory.
 * comm_stream_open: collective over g; the id made on g's rank 0 and broadcast over g's control
 * communicator; on the calling thread's current CUDA device. comm_stream_close: after the
 * group's stream operations have run (it waits for their records to end), frees the
 * communicator; a group without one: nothing. comm_stream_status: 0, or -1 with the first
 * failure of a stream operation in err. */
int comm_stream_built(void);
int comm_stream_open(struct comm_group *g, char *err, size_t err_size);
void comm_stream_close(struct comm_group *g);
void comm_stream_set(void *stream);
int comm_stream_status(char *err, size_t err_size);

/* The last operation error on this rank. */
const char *comm_error(void);
/* Sets it (a layer above that fails an operation before it starts: the staged comm out of host
 * memory); returns -1. */
int comm_set_error(const char *msg);

/* Records. The step and micro-batch go into every following record. */
void comm_set_step(long long step, int mb);
struct comm_counter comm_counter_get(const struct comm_group *g, enum comm_op op);
void comm_counters_reset(void); /* all groups, all ops; sequence numbers go on */
uint64_t comm_group_seq(const struct comm_group *g); /* collectives issued on g so far */
/* Operations this rank has begun so far, of every kind (collectives, sends, receives, agreements,
 * control calls): the REPL tells from it whether a chunk has entered one (an interrupt may then
 * only stop it where every rank agrees). */
unsigned long long comm_ops_started(void);
/* Copies the last (up to) max records, oldest first; returns how many. */
int comm_records(struct comm_record *out, int max);
/* Grows the flight recorder's rings (records and trace spans) to at least `capacity` each,
 * keeping what they hold; 0, or -1 when out of memory (the old rings stay). */
int comm_reserve_records(int capacity);

/* Checks and limits. */
void comm_set_check(int on);           /* cross-check (seq, op, n_bytes) before each collective */
void comm_set_timeout(double seconds); /* watchdog; 0 disables */

/* Trace. comm_now is the clock of the records; comm_trace_span adds a span of the caller's
 * (e.g. "compute") to the trace, comm_trace_work one that belongs to a pipeline stage and
 * micro-batch (-1: none) and did `flops` FLOPs (0: not counted); both carry the step of
 * comm_set_step and share the flight recorder's ring (TYCHO_COMM_RECORDS long).
 * comm_trace_write gathers every rank's records and spans and rank 0 writes one Chrome
 * trace-event JSON file (open it in Perfetto): one process per rank, track 0 the caller's
 * spans, one track per group; comm_trace_write_steps keeps only steps first..last.
 * Collective over the world. */
double comm_now(void);
void comm_trace_span(const char *name, double t_begin, double t_end);
void comm_trace_work(const char *name, int stage, int mb, double flops, double t_begin, double t_end);
/* A counter in the trace (a Chrome "C" event at now): series `series` of counter `name` takes
 * `value`; the viewers plot each counter's series over time (e.g. "moe layer 1", "dropped"). */
void comm_trace_counter(const char *name, const char *series, double value);
int comm_trace_write(const char *path, char *err, size_t err_size);
int comm_trace_write_steps(const char *path, long long first, long long last, char *err, size_t err_size);

/* Names for messages. */
const char *comm_op_name(enum comm_op op);
const char *comm_dtype_name(enum comm_dtype dtype);
const char *comm_reduce_name(enum comm_reduce reduce);
size_t comm_dtype_size(enum comm_dtype dtype);

/* For the command line: prints "tycho: rank R: <message>" to stderr and ends the whole job
 * with MPI_Abort (exit code 1); plain exit(1) when MPI is not running. */
void comm_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#endif
