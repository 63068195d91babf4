/* Host views of backend memory (hostview.h). */
#include "runtime/model/hostview.h"

#include "runtime/model/alloc.h"
#include "util/err.h"

void *hostview_open(const struct kernel_ops *k, void *ctx, const void *p, size_t n_bytes, int read)
{
  if (k->host_visible)
    return (void *)p;
  void *view = alloc_host_bytes(ALLOC_WORKSPACE, n_bytes);
  if (view && read)
    k->to_host(ctx, view, p, n_bytes);
  return view;
}

const void *hostview_read(const struct kernel_ops *k, void *ctx, const void *p, size_t n_bytes, char *err,
                          size_t err_size)
{
  void *view = hostview_open(k, ctx, p, n_bytes, 1);
  if (!view) {
    errf(err, err_size, "out of host memory for %zu bytes", n_bytes);
    return NULL;
  }
  if (k->status(ctx, err, err_size)) {
    hostview_close(k, ctx, (void *)p, view, n_bytes, 0);
    return NULL;
  }
  return view;
}

void hostview_close(const struct kernel_ops *k, void *ctx, void *p, void *view, size_t n_bytes,
                    int write)
{
  if (!view || k->host_visible)
    return;
  if (write)
    k->from_host(ctx, p, view, n_bytes);
  alloc_free(view);
}

enum { CHUNK = 1024 };

double hostview_sum(const struct kernel_ops *k, void *ctx, const real *x, size_t n_elems)
{
  double sum = 0.0;
  real buf[CHUNK];
  for (size_t at = 0; at < n_elems; at += CHUNK) {
    const size_t n = n_elems - at < CHUNK ? n_elems - at : CHUNK;
    k->to_host(ctx, buf, x + at, n * sizeof(real));
    for (size_t i = 0; i < n; i++) sum += buf[i];
  }
  return sum;
}

int hostview_argmax(const struct kernel_ops *k, void *ctx, const real *row, int n)
{
  int best = 0;
  real best_value = 0;
  real buf[CHUNK];
  for (int at = 0; at < n; at += CHUNK) {
    const int m = n - at < CHUNK ? n - at : CHUNK;
    k->to_host(ctx, buf, row + at, (size_t)m * sizeof(real));
    for (int i = 0; i < m; i++)
      if ((at == 0 && i == 0) || buf[i] > best_value)
        best = at + i, best_value = buf[i];
  }
  return best;
}
