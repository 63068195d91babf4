/* Writing files whole and durably, and mapping them for reading, guarded against the file
 * shrinking under the mapping (file.h). */
#define _POSIX_C_SOURCE 200809L
#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"
#include "util/path.h"

int file_write_all(int fd, const char *path, const void *buf, size_t n, char *err, size_t err_size)
{
  const char *p = buf;
  while (n > 0) {
    /* at most 1 GiB a call: larger writes are cut short by the kernel anyway */
    ssize_t w = write(fd, p, n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      const int e = w == 0 ? EIO : errno;
      const int rc = errf(err, err_size, "cannot write %s: %s", path, strerror(e));
      errno = e; /* for callers that keep it */
      return rc;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* -1 with "PATH: is a FIFO, not a regular file" when `path` exists, not following a link, as
 * anything but a regular file or a link; 0 otherwise. */
static int refuse_special(const char *what, const char *path, char *err, size_t err_size)
{
  struct stat st;
  if (lstat(path, &st) != 0 || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode))
    return 0;
  return errf(err, err_size, "%s%s%s: is %s, not a regular file", what ? what : "", what && what[0] ? " " : "",
              path, path_kind(st.st_mode));
}

/* fd (opened O_NONBLOCK on path) required to be a regular file, then made blocking; closed on
 * failure. */
static int regular_blocking(int fd, const char *path, char *err, size_t err_size)
{
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    close(fd);
    return errf(err, err_size, "cannot create %s: %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return errf(err, err_size, "%s: is %s, not a regular file", path, path_kind(st.st_mode));
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int e = errno;
    close(fd);
    return errf(err, err_size, "cannot create %s: %s", path, strerror(e));
  }
  return 0;
}

int file_create(const char *path, int *fd_out, char *err, size_t err_size)
{
  *fd_out = -1;
  /* O_NOFOLLOW: a link is refused, not written through; O_NONBLOCK: a FIFO with no reader fails
   * at once (ENXIO) instead of waiting; no O_TRUNC until it is known to be a regular file. */
  int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY, 0644);
  if (fd < 0) {
    const int e = errno;
    const int special = refuse_special(NULL, path, err, err_size);
    return special ? special : errf(err, err_size, "cannot create %s: %s", path, strerror(e));
  }
  int rc = regular_blocking(fd, path, err, err_size);
  if (rc)
    return rc;
  if (ftruncate(fd, 0) != 0) {
    const int e = errno;
    close(fd);
    return errf(err, err_size, "cannot create %s: %s", path, strerror(e));
  }
  *fd_out = fd;
  return 0;
}

int file_sync_close(int fd, const char *path, char *err, size_t err_size)
{
  int rc = fsync(fd) != 0 ? errf(err, err_size, "cannot sync %s: %s", path, strerror(errno)) : 0;
  if (close(fd) != 0 && !rc)
    rc = errf(err, err_size, "cannot write %s: %s", path, strerror(errno));
  return rc;
}

int file_sync_folder(const char *dir, char *err, size_t err_size)
{
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return errf(err, err_size, "cannot sync %s: %s", dir, strerror(errno));
  int rc = fsync(fd) != 0 ? errf(err, err_size, "cannot sync %s: %s", dir, strerror(errno)) : 0;
  close(fd);
  return rc;
}

int file_write_synced(const char *path, const void *buf, size_t n, char *err, size_t err_size)
{
  int fd, rc = file_create(path, &fd, err, err_size);
  if (rc)
    return rc;
  if ((rc = file_write_all(fd, path, buf, n, err, err_size)) != 0) {
    close(fd);
    return rc;
  }
  return file_sync_close(fd, path, err, err_size);
}

/* The folder holding `path` ("." when it names none), synced: the rename is in it. */
static int sync_parent(const char *path, char *err, size_t err_size)
{
  const char *slash = strrchr(path, '/');
  if (!slash)
    return file_sync_folder(".", err, err_size);
  char *dir = strndup(path, slash == path ? 1 : (size_t)(slash - path));
  if (!dir)
    return errf(err, err_size, "%s: out of memory", path);
  int rc = file_sync_folder(dir, err, err_size);
  free(dir);
  return rc;
}

int file_atomic_begin(struct file_atomic *a, const char *what, const char *path, char *err,
                      size_t err_size)
{
  memset(a, 0, sizeof *a);
  a->fd = -1;
  a->what = what;
  if (path_check_output(what, path, err, err_size) != 0)
    return -1;
  int rc = 0;
  a->path = strdup(path);
  a->tmp = malloc(strlen(path) + 5);
  if (!a->path || !a->tmp) {
    free(a->path);
    free(a->tmp);
    return errf(err, err_size, "%s: out of memory", path);
  }
  sprintf(a->tmp, "%s.tmp", path);
  /* O_EXCL: made afresh, so neither a link nor a second name of another file (a hard link) at
   * PATH.tmp is written through; a leftover of a crashed write (or a link) is ours to remove. */
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY;
  a->fd = open(a->tmp, flags, 0644);
  if (a->fd < 0 && errno == EEXIST && !(rc = refuse_special(NULL, a->tmp, err, err_size)) &&
      (unlink(a->tmp) == 0 || errno == ENOENT))
    a->fd = open(a->tmp, flags, 0644);
  if (a->fd < 0 && !rc)
    rc = errf(err, err_size, "cannot create %s: %s", a->tmp, strerror(errno));
  if (rc) {
    free(a->path);
    free(a->tmp);
    memset(a, 0, sizeof *a);
    a->fd = -1;
  }
  return rc;
}

int file_atomic_write(struct file_atomic *a, const void *buf, size_t n, char *err, size_t err_size)
{
  return file_write_all(a->fd, a->tmp, buf, n, err, err_size);
}

int file_atomic_end(struct file_atomic *a, int ok, char *err, size_t err_size)
{
  int rc = 0, renamed = 0;
  if (!ok) {
    close(a->fd);
  } else if (file_sync_close(a->fd, a->tmp, err, err_size) != 0 ||
             path_check_output(a->what, a->path, err, err_size) != 0) { /* it may have changed since */
    rc = -1;
  } else if (rename(a->tmp, a->path) != 0) {
    rc = errf(err, err_size, "cannot rename %s to %s: %s", a->tmp, a->path, strerror(errno));
  } else {
    renamed = 1;
    rc = sync_parent(a->path, err, err_size);
  }
  if (!renamed)
    unlink(a->tmp);
  free(a->path);
  free(a->tmp);
  memset(a, 0, sizeof *a);
  a->fd = -1;
  return rc;
}

int file_write_atomic(const char *what, const char *path, const void *buf, size_t n, char *err,
                      size_t err_size)
{
  struct file_atomic a;
  int rc = file_atomic_begin(&a, what, path, err, err_size);
  if (rc)
    return rc;
  rc = file_atomic_write(&a, buf, n, err, err_size);
  const int end = file_atomic_end(&a, rc == 0, err, err_size);
  return rc ? rc : end;
}

int file_map(const char *what, const char *path, long long max_bytes, struct file_map *m, char *err,
             size_t err_size)
{
  m->data = NULL;
  m->bytes = 0;
  int fd;
  long long size;
  const int opened = path_open_input(what, path, max_bytes, &fd, &size, err, err_size);
  if (opened == 2) /* a FIFO or device given as an input (a shard named by an index): exit 2 */
    return err_mark_input();
  if (opened != 0)
    return -1;
  if (size > 0) { /* an empty mapping is refused (EINVAL): an empty file maps to nothing */
    void *data = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      const int e = errno;
      close(fd);
      return errf(err, err_size, "%s%s%s: cannot mmap %lld bytes: %s", what ? what : "",
                  what && what[0] ? " " : "", path, size, strerror(e));
    }
    m->data = data;
    m->bytes = (size_t)size;
    map_guard_add(data, (size_t)size, what, path); /* shrunk while mapped: one line, exit 1 */
  }
  close(fd); /* the mapping stays */
  return 0;
}

void file_unmap(struct file_map *m)
{
  if (m->data) {
    map_guard_remove(m->data);
    munmap(m->data, m->bytes);
  }
  m->data = NULL;
  m->bytes = 0;
}

/* ---- the mapping guard (file.h). The SIGBUS handler reads a fixed table filled beforehand,
 * formats with its own digit loop and writes with write(2): nothing it calls may allocate or
 * lock (async-signal safety). ---- */

struct guarded {
  volatile sig_atomic_t used;
  uintptr_t start, end;
  char head[768];   /* "tycho: WHAT PATH: the file shrank ...: byte " */
  size_t head_len;
};

static struct guarded table[MAP_GUARD_MAX];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction previous; /* the SIGBUS handler before ours (Open MPI's after MPI_Init) */

static size_t put_u64(char *out, uint64_t v)
{
  char digits[24];
  size_t n = 0, k = 0;
  do digits[n++] = (char)('0' + v % 10); while ((v /= 10) != 0);
  while (n) out[k++] = digits[--n];
  return k;
}

static void on_sigbus(int sig, siginfo_t *info, void *ctx)
{
  const uintptr_t a = (uintptr_t)info->si_addr;
  for (int i = 0; i < MAP_GUARD_MAX; i++) {
    const struct guarded *g = &table[i];
    if (!g->used || a < g->start || a >= g->end)
      continue;
    char line[900];
    size_t n = g->head_len;
    memcpy(line, g->head, n);
    n += put_u64(line + n, (uint64_t)(a - g->start));
    static const char of[] = " of the ";
    memcpy(line + n, of, sizeof of - 1);
    n += sizeof of - 1;
    n += put_u64(line + n, (uint64_t)(g->end - g->start));
    static const char tail[] = " mapped is gone\n";
    memcpy(line + n, tail, sizeof tail - 1);
    n += sizeof tail - 1;
    (void)!write(2, line, n);
    _exit(1);
  }
  /* not ours: the handler that was there before, or the default action (the fault repeats on
   * return and kills the process as it would have) */
  if (previous.sa_flags & SA_SIGINFO) {
    if (previous.sa_sigaction) {
      previous.sa_sigaction(sig, info, ctx);
      return;
    }
  } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
    previous.sa_handler(sig);
    return;
  }
  signal(SIGBUS, SIG_DFL);
}

/* Ours unless it is already the current handler; called under lock. */
static void install(void)
{
  struct sigaction now;
  if (sigaction(SIGBUS, NULL, &now) != 0)
    return;
  if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigbus)
    return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  previous = now;
  sigaction(SIGBUS, &sa, NULL);
}

void map_guard_add(const void *addr, size_t bytes, const char *what, const char *path)
{
  if (!addr || !bytes)
    return;
  pthread_mutex_lock(&lock);
  install();
  for (int i = 0; i < MAP_GUARD_MAX; i++) {
    struct guarded *g = &table[i];
    if (g->used)
      continue;
    g->start = (uintptr_t)addr;
    g->end = (uintptr_t)addr + bytes;
    int n = snprintf(g->head, sizeof g->head, "tycho: %s%s%s: the file shrank while the run had it "
                     "mapped (truncated or rewritten in place): byte ", what ? what : "",
                     what && what[0] ? " " : "", path ? path : "(a mapped file)");
    g->head_len = n < 0 ? 0 : (size_t)n < sizeof g->head ? (size_t)n : sizeof g->head - 1;
    __atomic_thread_fence(__ATOMIC_RELEASE);
    g->used = 1;
    break;
  }
  pthread_mutex_unlock(&lock);
}

void map_guard_remove(const void *addr)
{
  if (!addr)
    return;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAP_GUARD_MAX; i++)
    if (table[i].used && table[i].start == (uintptr_t)addr) {
      table[i].used = 0;
      break;
    }
  pthread_mutex_unlock(&lock);
}
