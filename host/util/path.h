/* File-system helpers shared by every reader and writer of user paths: folders made for a file,
 * inputs opened without waiting and refused unless they are regular files of bounded size, and
 * outputs refused when they exist as something other than a regular file. */
#ifndef TYCHO_UTIL_PATH_H
#define TYCHO_UTIL_PATH_H
#include <stddef.h>
#include <stdio.h>

/* mkdir -p of the folder that will hold the file `path` (nothing when it has no folder part).
 * 0 ok; −1 with a message naming the folder. */
int path_make_parent_dirs(const char *path, char *err, size_t err_size);

/* `in` with its empty and "." components dropped: "X/." and "X/" give "X", "a//./b" gives
 * "a/b", "./X" gives "X"; ".." is kept (a link before it would change what it means). A path
 * of no other component gives "." or "/". Into out (n bytes). 0 ok; −1 too long. */
int path_normalize(const char *in, char *out, size_t n);

/* What a file is, in words for a message: "a folder", "a FIFO", "a character device", ... */
const char *path_kind(unsigned mode);

/* Text inputs tycho reads whole (a plan, a module it requires, a cluster file) are at most this
 * large: a bound well above any real plan that keeps a device such as /dev/zero, or a file grown
 * by mistake, from being read into memory. Binary inputs are bounded by their own headers. */
#define PATH_MAX_TEXT_BYTES (8LL << 20)

/* Opens the input `path` for reading without blocking on it (a FIFO without a writer or a
 * device opens at once), then refuses anything that is not a regular file, and a file larger
 * than max_bytes (0: no limit). On success *fd is an open, blocking descriptor and *size the
 * file's size (size may be NULL). `what` (the field or role, e.g. "init.from"; NULL or "" for
 * none) starts the message. 0 ok; −1 when it cannot be opened ("WHAT PATH: cannot open:
 * strerror"); 2 when it is not a regular file or too large ("WHAT PATH: is a FIFO, not a
 * regular file", "... is a character device, ...", "... is a folder, ..."). */
int path_open_input(const char *what, const char *path, long long max_bytes, int *fd,
                    long long *size, char *err, size_t err_size);

/* path_open_input, then the whole file read into a malloc'd buffer with a NUL after its last
 * byte (*len excludes it). 0 ok; −1 or 2 (as path_open_input) with a message. */
int path_read_input(const char *what, const char *path, long long max_bytes, char **data,
                    size_t *len, char *err, size_t err_size);

/* An output path tycho will write (create or replace): refused when it exists, after following
 * links, as anything but a regular file (a device such as /dev/null, a FIFO, a folder, a socket),
 * since writing or renaming onto it would replace or feed something that is not tycho's.
 * 0 ok (absent, or a regular file); 2 with "WHAT PATH: is a character device, not a regular
 * file"; −1 when it cannot be looked at (strerror). */
int path_check_output(const char *what, const char *path, char *err, size_t err_size);

/* An output tycho appends to that must be a file of its own (log.metrics: two runs writing one
 * file through two names would interleave their lines and each hold its own lock): refused when
 * `path` is a symbolic link ("WHAT PATH: is a symbolic link; give the file itself") or a regular
 * file of more than one name ("WHAT PATH: has N names (hard links); give a file of its own").
 * With fd >= 0 (open on path) it must also be the file at `path` now, so a link made between a
 * check and the open is caught. 0 ok (absent when fd < 0); 2 refused; −1 cannot look (strerror). */
int path_check_own(const char *what, const char *path, int fd, char *err, size_t err_size);

/* Opens the output `path` for writing, creating it (0644) when absent, without blocking and
 * without touching anything that is not a regular file: a FIFO, a device, a folder or a socket
 * at `path` (or a link to one) is refused before a byte is written, and only then is a regular
 * file truncated (append: kept, written at its end). A symbolic link at `path` is never written
 * through: 2 with "WHAT PATH: is a symbolic link; give the file itself". On success *fd is a
 * blocking descriptor. 0 ok; 2 not a regular file (as path_check_output) or a link; −1 cannot
 * open or truncate it (strerror). */
int path_open_output(const char *what, const char *path, int append, int *fd, char *err,
                     size_t err_size);

/* path_open_output as a stdio stream ("w", or "a" when append). 0 ok with *f; −1 or 2 with a
 * message, *f NULL. */
int path_fopen_output(const char *what, const char *path, int append, FILE **f, char *err,
                      size_t err_size);

#endif
