/* The names of the memory categories (categories.h). */
#include "layout/categories.h"

const char *alloc_category_name(enum alloc_category category)
{
  static const char *const names[] = { "params", "grads", "optimizer", "activations", "comm",
                                       "workspace", "checkpoint" };
  return (unsigned)category < ALLOC_N_CATEGORIES ? names[category] : "?";
}
