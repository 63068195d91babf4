/* File-system helpers shared by the readers and writers of user paths (path.h). */
#define _POSIX_C_SOURCE 200809L
#include "util/path.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/err.h"

int path_make_parent_dirs(const char *path, char *err, size_t err_size)
{
  char dir[4096];
  if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
    return errf(err, err_size, "%s: path too long", path);
  char *slash = strrchr(dir, '/');
  if (!slash || slash == dir)
    return 0;
  *slash = '\0';
  for (char *c = dir + 1; ; c++) {
    if (*c != '/' && *c != '\0')
      continue;
    char saved = *c;
    *c = '\0';
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
      return errf(err, err_size, "cannot create the folder %s: %s", dir, strerror(errno));
    *c = saved;
    if (saved == '\0')
      break;
  }
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return errf(err, err_size, "%s: not a folder", dir);
  return 0;
}

int path_normalize(const char *in, char *out, size_t n)
{
  size_t used = 0;
  const int absolute = in[0] == '/';
  if (n < 2)
    return -1;
  if (absolute)
    out[used++] = '/';
  for (const char *c = in; *c;) {
    while (*c == '/')
      c++;
    const char *end = c;
    while (*end && *end != '/')
      end++;
    const size_t len = (size_t)(end - c);
    if (len && !(len == 1 && c[0] == '.')) {
      const int slash = used > (size_t)absolute;
      if (used + slash + len + 1 > n)
        return -1;
      if (slash)
        out[used++] = '/';
      memcpy(out + used, c, len);
      used += len;
    }
    c = end;
  }
  if (used == 0)
    out[used++] = '.';
  out[used] = '\0';
  return 0;
}

const char *path_kind(unsigned mode)
{
  if (S_ISREG(mode))
    return "a regular file";
  if (S_ISDIR(mode))
    return "a folder";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISLNK(mode))
    return "a symbolic link";
  return "a special file";
}

/* "WHAT " or "" for messages: `what` is optional. */
static const char *sep(const char *what)
{
  return what && what[0] ? " " : "";
}

/* fd (open on path) stat'ed and required to be a regular file; closed when it is not. 0 ok;
 * 1 (cannot stat) or 2 (not a regular file) with a message. */
static int require_regular(int fd, const char *w, const char *path, struct stat *st, char *err,
                           size_t err_size)
{
  if (fstat(fd, st)) {
    const int e = errno;
    close(fd);
    return errf(err, err_size, "%s%s%s: cannot stat: %s", w, sep(w), path, strerror(e));
  }
  if (!S_ISREG(st->st_mode)) {
    close(fd);
    errf(err, err_size, "%s%s%s: is %s, not a regular file", w, sep(w), path, path_kind(st->st_mode));
    return 2;
  }
  return 0;
}

int path_open_input(const char *what, const char *path, long long max_bytes, int *fd_out,
                    long long *size, char *err, size_t err_size)
{
  const char *w = what ? what : "";
  *fd_out = -1;
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer. */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0)
    return errf(err, err_size, "%s%s%s: cannot open: %s", w, sep(w), path, strerror(errno));
  struct stat st;
  const int regular = require_regular(fd, w, path, &st, err, err_size);
  if (regular)
    return regular;
  if (max_bytes > 0 && (long long)st.st_size > max_bytes) {
    close(fd);
    errf(err, err_size, "%s%s%s: is %lld bytes, more than the %lld such a file may have", w, sep(w), path,
         (long long)st.st_size, max_bytes);
    return 2;
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK)) {
    const int e = errno;
    close(fd);
    return errf(err, err_size, "%s%s%s: %s", w, sep(w), path, strerror(e));
  }
  *fd_out = fd;
  if (size)
    *size = (long long)st.st_size;
  return 0;
}

int path_read_input(const char *what, const char *path, long long max_bytes, char **data,
                    size_t *len, char *err, size_t err_size)
{
  const char *w = what ? what : "";
  *data = NULL;
  *len = 0;
  int fd;
  long long size;
  int rc = path_open_input(what, path, max_bytes, &fd, &size, err, err_size);
  if (rc)
    return rc;
  if ((unsigned long long)size >= SIZE_MAX) {
    close(fd);
    return errf(err, err_size, "%s%s%s: too large to read", w, sep(w), path);
  }
  char *buf = malloc((size_t)size + 1);
  if (!buf) {
    close(fd);
    return errf(err, err_size, "%s%s%s: out of memory reading %lld bytes", w, sep(w), path, size);
  }
  size_t got = 0;
  while (got < (size_t)size) { /* a file that grows as it is read is read to its size at open */
    ssize_t r = read(fd, buf + got, (size_t)size - got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      const int e = errno;
      free(buf);
      close(fd);
      return errf(err, err_size, "%s%s%s: cannot read: %s", w, sep(w), path, strerror(e));
    }
    if (r == 0)
      break; /* it shrank */
    got += (size_t)r;
  }
  close(fd);
  buf[got] = '\0';
  *data = buf;
  *len = got;
  return 0;
}

int path_check_output(const char *what, const char *path, char *err, size_t err_size)
{
  const char *w = what ? what : "";
  struct stat st;
  if (stat(path, &st) != 0) {
    if (errno == ENOENT)
      return 0;
    return errf(err, err_size, "%s%s%s: %s", w, sep(w), path, strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    errf(err, err_size, "%s%s%s: is %s, not a regular file", w, sep(w), path, path_kind(st.st_mode));
    return 2;
  }
  return 0;
}

int path_check_own(const char *what, const char *path, int fd, char *err, size_t err_size)
{
  const char *w = what ? what : "";
  struct stat st, at;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT && fd < 0)
      return 0;
    return errf(err, err_size, "%s%s%s: %s", w, sep(w), path, strerror(errno));
  }
  if (S_ISLNK(st.st_mode)) {
    errf(err, err_size, "%s%s%s: is a symbolic link; give the file itself", w, sep(w), path);
    return 2;
  }
  if (S_ISREG(st.st_mode) && st.st_nlink > 1) {
    errf(err, err_size, "%s%s%s: has %ld names (hard links); give a file of its own", w, sep(w), path,
         (long)st.st_nlink);
    return 2;
  }
  if (fd >= 0 && (fstat(fd, &at) != 0 || at.st_ino != st.st_ino || at.st_dev != st.st_dev))
    return errf(err, err_size, "%s%s%s: was replaced while it was opened", w, sep(w), path);
  return 0;
}

int path_open_output(const char *what, const char *path, int append, int *fd_out, char *err,
                     size_t err_size)
{
  const char *w = what ? what : "";
  *fd_out = -1;
  /* No O_TRUNC until it is known to be a regular file; O_NONBLOCK: a FIFO with no reader fails
   * at once (ENXIO) instead of waiting for one; O_NOFOLLOW: a link is not written through (nor,
   * dangling, made to create the file it names). */
  int fd = open(path, O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | O_NOFOLLOW | (append ? O_APPEND : 0),
                0644);
  if (fd < 0) {
    const int e = errno;
    if (path_check_output(what, path, err, err_size) == 2) /* a folder, a FIFO without reader */
      return 2;
    if (e == ELOOP) {
      errf(err, err_size, "%s%s%s: is a symbolic link; give the file itself", w, sep(w), path);
      return 2;
    }
    return errf(err, err_size, "%s%s%s: cannot open it for writing: %s", w, sep(w), path, strerror(e));
  }
  struct stat st;
  const int regular = require_regular(fd, w, path, &st, err, err_size);
  if (regular)
    return regular;
  const int flags = fcntl(fd, F_GETFL);
  if ((!append && ftruncate(fd, 0)) || flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK)) {
    const int e = errno;
    close(fd);
    return errf(err, err_size, "%s%s%s: cannot write it: %s", w, sep(w), path, strerror(e));
  }
  *fd_out = fd;
  return 0;
}

int path_fopen_output(const char *what, const char *path, int append, FILE **f, char *err,
                      size_t err_size)
{
  const char *w = what ? what : "";
  int fd;
  *f = NULL;
  int rc = path_open_output(what, path, append, &fd, err, err_size);
  if (rc)
    return rc;
  *f = fdopen(fd, append ? "a" : "w");
  if (!*f) {
    const int e = errno;
    close(fd);
    return errf(err, err_size, "%s%s%s: %s", w, sep(w), path, strerror(e));
  }
  return 0;
}
