/* See fault.h. */
#include "fault.h"

#include <stdarg.h>
#include <stdio.h>

int fault_set(struct fault *f, int level, const char *fmt, ...)
{
  if (!f->set || level > f->level) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof f->msg, fmt, ap);
    va_end(ap);
    f->set = 1;
    f->level = level;
  }
  return -1;
}

const char *fault_msg(const struct fault *f)
{
  return f->set ? f->msg : NULL;
}

void fault_clear(struct fault *f)
{
  f->set = 0;
  f->level = 0;
  f->msg[0] = '\0';
}
