/* See err.h. The class is per thread: a fault is recorded on the thread that finds it, and the
 * status it returns travels up the same thread to where the exit code is chosen. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local int input_class;

static void put(char *err, size_t err_size, const char *fmt, va_list ap)
{
  if (err && err_size)
    vsnprintf(err, err_size, fmt, ap);
}

int errf(char *err, size_t err_size, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  put(err, err_size, fmt, ap);
  va_end(ap);
  return -1;
}

int errf_input(char *err, size_t err_size, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  put(err, err_size, fmt, ap);
  va_end(ap);
  input_class = 1;
  return -1;
}

int err_mark_input(void)
{
  input_class = 1;
  return -1;
}

void err_class_reset(void)
{
  input_class = 0;
}

int err_class_is_input(void)
{
  return input_class;
}
