/* What `tycho run` checks and holds before its first step (train_run.c): every path it will
 * write tried, and the files only one run may write at a time locked.
 *
 * Probes: run_probe_file (export.path, log.metrics, log.trace: files written later) makes the
 * file's folders as the writer would, refuses a path that exists as anything but a regular file
 * (status 2: a device, FIFO, folder or socket, or a link to one, is never replaced or written
 * into), creates and removes a probe file beside it (and, when the file exists, opens it for
 * writing without truncating it); run_probe_dir
 * (checkpoint.dir) makes the folder and creates and removes a probe file in it. Each message
 * names the plan field and the path, with strerror.
 *
 * Locks: run_lock_take opens (creating) the lock file PATH and takes flock(LOCK_EX | LOCK_NB)
 * on it, then writes "pid host" into it; a lock another process holds is refused naming that
 * holder (pid, host, read from the file), the field and the locked path. The lock file is never
 * opened through a link: a symbolic link at PATH (dangling or not), a hard link (a file of more
 * than one name) or anything but a regular file there is refused (status 2, naming the field, the
 * locked path and the lock file), so no file outside the given paths is written or created.
 * run_lock_held says whether this process holds a lock file (a REPL's save inside the run
 * that holds its folder). run_lock_release
 * removes the lock file and closes it (the OS releases a dead process's lock; its file, left
 * behind, is taken over by the next run). A lock file removed between open and flock by the
 * holder's release is detected (inode check) and opened again. Local: under mpirun rank 0 takes
 * the locks and the ranks agree on the outcome. */
#ifndef TYCHO_RUNTIME_RUN_GUARD_H
#define TYCHO_RUNTIME_RUN_GUARD_H
#include <stddef.h>

/* 0 ok; −1 with a message; run_probe_file 2 for a path that is not a regular file. */
int run_probe_file(const char *field, const char *path, char *err, size_t err_size);
int run_probe_dir(const char *field, const char *dir, char *err, size_t err_size);
/* run_probe_file of a file replaced whole (util/file.h, file_atomic: export.path's safetensors,
 * log.trace): PATH.tmp, where the new file is written first, refused (2) when it exists as
 * anything but a regular file or a link, as the writer would refuse it after the steps. */
int run_probe_replaced(const char *field, const char *path, char *err, size_t err_size);

struct run_lock {
  int fd;          /* -1: not held */
  char path[4096]; /* the lock file */
};
/* 0 held; −1 with a message ("FIELD: PATH is in use by another run (pid P on host H; lock
 * LOCKFILE)", or why the lock file cannot be made); 2 the lock file is a link or not a regular
 * file ("FIELD PATH: the lock file LOCKFILE is a symbolic link; remove it ..."). `what` is the
 * locked path named in it. */
int run_lock_take(struct run_lock *l, const char *field, const char *what, const char *lock_path,
                  char *err, size_t err_size);
/* 1 when lock_path is a lock this process holds (run_lock_take), else 0. */
int run_lock_held(const char *lock_path);
void run_lock_release(struct run_lock *l);

#endif
