/* Probes and locks of `tycho run` (run_guard.h). */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE /* flock, gethostname */
#include "runtime/train/run_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/path.h"

/* Creates and removes a probe file in folder dir. 0 ok; 1 with a message. */
static int probe_in(const char *field, const char *path, const char *dir, char *err, size_t n)
{
  char probe[4200];
  snprintf(probe, sizeof probe, "%s/.tycho-probe-%ld", dir, (long)getpid());
  int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    return errf(err, n, "%s %s: cannot create files in the folder %s: %s", field, path, dir, strerror(errno));
  close(fd);
  if (unlink(probe))
    return errf(err, n, "%s %s: cannot remove the probe file %s: %s", field, path, probe, strerror(errno));
  return 0;
}

int run_probe_file(const char *field, const char *path, char *err, size_t n)
{
  char why[4200], dir[4096];
  if (!path[0])
    return 0;
  if (path_make_parent_dirs(path, why, sizeof why))
    return errf(err, n, "%s %s: %s", field, path, why);
  struct stat st;
  const int special = path_check_output(field, path, err, n);
  if (special)
    return special; /* 2: a device, FIFO, folder or socket is not replaced nor written into */
  if (stat(path, &st) == 0) {
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC); /* no O_TRUNC: the old file stays */
    if (fd < 0)
      return errf(err, n, "%s %s: cannot write it: %s", field, path, strerror(errno));
    close(fd);
  } else if (errno != ENOENT) {
    return errf(err, n, "%s %s: %s", field, path, strerror(errno));
  }
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (!slash)
    snprintf(dir, sizeof dir, ".");
  else if (slash == dir)
    dir[1] = '\0';
  else
    *slash = '\0';
  return probe_in(field, path, dir, err, n);
}

int run_probe_replaced(const char *field, const char *path, char *err, size_t n)
{
  int rc = run_probe_file(field, path, err, n);
  if (rc || !path[0])
    return rc;
  char tmp[4200];
  struct stat st;
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  if (lstat(tmp, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
    errf(err, n, "%s %s: %s is %s; the new file is written there first, so it must be absent or a regular file",
         field, path, tmp, path_kind(st.st_mode));
    return 2; /* the writer would refuse it after the steps (file_atomic_begin) */
  }
  return 0;
}

int run_probe_dir(const char *field, const char *dir, char *err, size_t n)
{
  char why[4200], inside[4200];
  if (!dir[0])
    return 0;
  snprintf(inside, sizeof inside, "%s/x", dir);
  if (path_make_parent_dirs(inside, why, sizeof why))
    return errf(err, n, "%s %s: %s", field, dir, why);
  return probe_in(field, dir, dir, err, n);
}

/* The locks this process holds (run_lock_held): a REPL's save inside a run that holds its
 * folder's lock must not be refused by that run's own lock. */
enum { HELD_MAX = 8 };
static struct run_lock *held[HELD_MAX];

/* 2 with "FIELD WHAT: the lock file LOCK is ..., not ..." when the lock file fd (open on
 * lock_path, not through a link) is not a regular file of one name; 0 otherwise. */
static int refuse_odd_lock(int fd, const char *field, const char *what, const char *lock_path, char *err,
                           size_t n)
{
  struct stat st;
  if (fstat(fd, &st))
    return errf(err, n, "%s %s: cannot look at the lock file %s: %s", field, what, lock_path, strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    errf(err, n, "%s %s: the lock file %s is %s, not a regular file; remove it", field, what, lock_path,
         path_kind(st.st_mode));
    return 2;
  }
  if (st.st_nlink > 1) { /* a second name of another file: writing "pid host" would change that file */
    errf(err, n, "%s %s: the lock file %s has %ld names (a hard link to another file); remove it", field, what,
         lock_path, (long)st.st_nlink);
    return 2;
  }
  return 0;
}

int run_lock_take(struct run_lock *l, const char *field, const char *what, const char *lock_path,
                  char *err, size_t n)
{
  l->fd = -1;
  snprintf(l->path, sizeof l->path, "%s", lock_path);
  for (int attempt = 0; attempt < 100; attempt++) {
    /* O_NOFOLLOW: a link at the lock's name is refused, never written through (nor, dangling,
     * made to create the file it points to); O_NONBLOCK: a FIFO there does not wait */
    int fd = open(lock_path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ELOOP) {
      errf(err, n, "%s %s: the lock file %s is a symbolic link; remove it (tycho never writes a lock through a "
           "link)", field, what, lock_path);
      return 2;
    }
    if (fd < 0)
      return errf(err, n, "%s %s: cannot create the lock file %s: %s", field, what, lock_path, strerror(errno));
    const int odd = refuse_odd_lock(fd, field, what, lock_path, err, n);
    if (odd) {
      close(fd);
      return odd;
    }
    if (flock(fd, LOCK_EX | LOCK_NB)) {
      const int e = errno;
      if (e != EWOULDBLOCK) {
        close(fd);
        return errf(err, n, "%s %s: cannot lock %s: %s", field, what, lock_path, strerror(e));
      }
      char text[512] = "", host[300] = "?";
      long pid = 0;
      ssize_t got = pread(fd, text, sizeof text - 1, 0);
      close(fd);
      text[got > 0 ? got : 0] = '\0';
      if (sscanf(text, "%ld %299s", &pid, host) < 1)
        return errf_input(err, n, "%s %s: in use by another run (lock %s, being taken)", field, what, lock_path);
      return errf_input(err, n, "%s %s: in use by another run (pid %ld on host %s; lock %s)", field, what, pid,
                  host, lock_path);
    }
    struct stat a, b;
    if (fstat(fd, &a) || lstat(lock_path, &b) || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
      close(fd); /* the holder removed it as we opened it: open the new one */
      continue;
    }
    char host[256] = "?", line[320];
    if (gethostname(host, sizeof host))
      snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    int len = snprintf(line, sizeof line, "%ld %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) || pwrite(fd, line, (size_t)len, 0) != len) {
      const int e = errno;
      unlink(lock_path);
      close(fd);
      return errf(err, n, "%s %s: cannot write the lock file %s: %s", field, what, lock_path, strerror(e));
    }
    l->fd = fd;
    for (int i = 0; i < HELD_MAX; i++)
      if (!held[i]) {
        held[i] = l;
        break;
      }
    return 0;
  }
  return errf(err, n, "%s %s: cannot take the lock %s (it keeps being replaced)", field, what, lock_path);
}

int run_lock_held(const char *lock_path)
{
  struct stat a, b;
  if (lstat(lock_path, &b))
    return 0;
  for (int i = 0; i < HELD_MAX; i++)
    if (held[i] && held[i]->fd >= 0 && fstat(held[i]->fd, &a) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev)
      return 1;
  return 0;
}

void run_lock_release(struct run_lock *l)
{
  if (l->fd < 0)
    return;
  for (int i = 0; i < HELD_MAX; i++)
    if (held[i] == l)
      held[i] = NULL;
  unlink(l->path); /* while held: the next run creates and locks a new one */
  close(l->fd);
  l->fd = -1;
}
