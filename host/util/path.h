/* File-system helpers shared by the runtime's writers. */
#ifndef TYCHO_UTIL_PATH_H
#define TYCHO_UTIL_PATH_H
#include <stddef.h>

/* mkdir -p of the folder that will hold the file `path` (nothing when it has no folder part).
 * 0 ok; 1 with a message naming the folder. */
int path_make_parent_dirs(const char *path, char *err, size_t err_size);

#endif
