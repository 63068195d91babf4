/* Writing files whole and durably, and mapping them for reading: the one way checkpoints, exports
 * and safetensors put bytes on disk (every byte written past short writes and interruptions, the
 * file and its folder synced, a replacement made atomic by a rename) and map what they read back.
 * Paths are opened as util/path.h does: nothing that is not a regular file is written into,
 * waited on or replaced, and no link is followed to create or write a file.
 *
 * Every function returns 0, or -1 with a one-line message naming the path and the cause in err
 * (err_size bytes; err may be NULL). */
#ifndef TYCHO_UTIL_FILE_H
#define TYCHO_UTIL_FILE_H
#include <stddef.h>

/* All n bytes of buf to fd, going on after short writes and interruptions (EINTR). On failure
 * errno is kept ("cannot write PATH: strerror"; a write that makes no progress gives EIO). */
int file_write_all(int fd, const char *path, const void *buf, size_t n, char *err, size_t err_size);

/* Creates `path` (0644) or truncates it, refusing a link at `path` ("cannot create PATH: Too
 * many levels of symbolic links") and anything that is not a regular file, without waiting on a
 * FIFO. For files in a folder tycho made afresh (a checkpoint's step_N.tmp). *fd is blocking. */
int file_create(const char *path, int *fd, char *err, size_t err_size);

/* fsync of fd, then close (always): "cannot sync PATH: strerror", "cannot write PATH: strerror"
 * (a close that fails reports a write that did not land). */
int file_sync_close(int fd, const char *path, char *err, size_t err_size);

/* fsync of the folder `dir`, so that the names created or renamed in it last: "cannot sync
 * DIR: strerror". */
int file_sync_folder(const char *dir, char *err, size_t err_size);

/* file_create, file_write_all and file_sync_close of one buffer. */
int file_write_synced(const char *path, const void *buf, size_t n, char *err, size_t err_size);

/* An atomic replacement of `path`: written to PATH.tmp (in the same folder), synced, renamed
 * over `path`, the folder synced; readers see the old file or the new one, never part of one.
 * `path` is refused when it exists, after following links, as anything but a regular file (as
 * path_check_output, with `what`), at the start and again before the rename; a link at `path`
 * is itself replaced, its target left as it is. PATH.tmp is always made afresh: a leftover
 * regular file or link there is removed (a link's target untouched), anything else refused. */
struct file_atomic {
  int fd;
  char *path, *tmp;
  const char *what;
};

/* PATH.tmp created. On failure nothing is left and there is nothing to end. */
int file_atomic_begin(struct file_atomic *a, const char *what, const char *path, char *err,
                      size_t err_size);
/* file_write_all into PATH.tmp. */
int file_atomic_write(struct file_atomic *a, const void *buf, size_t n, char *err, size_t err_size);
/* ok: synced and renamed over `path` (0, or nonzero with a message and PATH.tmp removed);
 * !ok: abandoned (PATH.tmp removed, nothing written to err, status 0). Always ends `a`. */
int file_atomic_end(struct file_atomic *a, int ok, char *err, size_t err_size);

/* file_atomic_begin, file_atomic_write and file_atomic_end of one buffer. */
int file_write_atomic(const char *what, const char *path, const void *buf, size_t n, char *err,
                      size_t err_size);

/* A file mapped read-only. An empty file maps to data NULL, bytes 0. */
struct file_map {
  void *data;
  size_t bytes;
};

/* Opens `path` as path_open_input does (without waiting, refused unless a regular file of at most
 * max_bytes, 0: no limit; `what` starts its messages) and maps it whole: "WHAT PATH: cannot mmap
 * N bytes: strerror". A path that is not a regular file is an input error (util/err.h). */
int file_map(const char *what, const char *path, long long max_bytes, struct file_map *m, char *err,
             size_t err_size);
/* Unmaps (nothing when empty) and zeroes m. The mapping is guarded while it lasts (below). */
void file_unmap(struct file_map *m);

/* The guard of read-only mappings (file_map's, token files'): one line and exit 1 when the file
 * shrinks under them. A page of a mapping past the file's new end raises SIGBUS when touched (a
 * token file truncated while a run reads it, a weights file rewritten during a load); unhandled,
 * that is a signal death and, under Open MPI, a backtrace. map_guard_add registers a mapping and
 * installs the handler when it is not the current one (so after MPI_Init, which installs Open
 * MPI's own): a SIGBUS inside a registered mapping writes
 *   "tycho: WHAT PATH: the file shrank while the run had it mapped (...): byte N of the M mapped is gone"
 * and exits 1 (a change made to the input during the run, not a fault of the input as given); any
 * other SIGBUS goes to the handler that was there before (or the default action). */
#define MAP_GUARD_MAX 256 /* mappings registered at once; more are left unguarded */

/* Registers [addr, addr + bytes) as the mapping of `path` (what: a field such as "data.train",
 * or NULL). Both strings are copied. */
void map_guard_add(const void *addr, size_t bytes, const char *what, const char *path);
/* Forgets the mapping at addr (before munmap); a no-op for an address never registered. */
void map_guard_remove(const void *addr);

#endif
