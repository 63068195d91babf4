/* File-system helpers shared by the runtime's writers (metrics, exports, checkpoints). */
#define _POSIX_C_SOURCE 200809L
#include "util/path.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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
