/* The REPL's link (link.h): frames over a stream socket, Unix sockets, session tokens. */
#define _GNU_SOURCE
#include "repl/link.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include "util/err.h"

static int write_full(int fd, const void *p, size_t n)
{
  const char *s = p;
  while (n) {
    ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    s += w;
    n -= (size_t)w;
  }
  return 0;
}

int link_send(int fd, int type, const void *payload, size_t n, char *err, size_t err_size)
{
  if (n > LINK_MAX_PAYLOAD)
    return errf(err, err_size, "a REPL message of %zu bytes is over the link's limit of %d", n, LINK_MAX_PAYLOAD);
  unsigned char head[5] = { (unsigned char)type, (unsigned char)(n & 0xff), (unsigned char)((n >> 8) & 0xff),
                            (unsigned char)((n >> 16) & 0xff), (unsigned char)((n >> 24) & 0xff) };
  if (write_full(fd, head, sizeof head) || (n && write_full(fd, payload, n)))
    return errf(err, err_size, "the REPL's connection: %s", strerror(errno));
  return 0;
}

/* 0 read all; 1 EOF before any byte; −1 error (errno), EOF after some bytes (errno 0). */
static int read_full(int fd, void *p, size_t n, volatile int *stop)
{
  char *s = p;
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, s + got, n - got);
    if (r < 0 && errno == EINTR && !(stop && *stop))
      continue;
    if (r < 0)
      return -1;
    if (r == 0) {
      errno = 0;
      return got ? -1 : 1;
    }
    got += (size_t)r;
  }
  return 0;
}

int link_recv(int fd, int *type, char **payload, size_t *n, volatile int *stop, char *err, size_t err_size)
{
  *payload = NULL;
  *n = 0;
  unsigned char head[5];
  int rc = read_full(fd, head, sizeof head, stop);
  if (rc == 1)
    return 1;
  if (rc < 0) {
    if (errno == EINTR)
      return errf(err, err_size, "interrupted");
    return errf(err, err_size, "the REPL's connection: %s", errno ? strerror(errno) : "closed inside a message");
  }
  size_t len = (size_t)head[1] | (size_t)head[2] << 8 | (size_t)head[3] << 16 | (size_t)head[4] << 24;
  if (len > LINK_MAX_PAYLOAD)
    return errf(err, err_size, "the REPL's connection: a message of %zu bytes (over the limit of %d): not a tycho peer",
                len, LINK_MAX_PAYLOAD);
  char *buf = malloc(len + 1);
  if (!buf)
    return errf(err, err_size, "out of memory for a REPL message of %zu bytes", len);
  rc = len ? read_full(fd, buf, len, stop) : 0;
  if (rc != 0) {
    free(buf);
    if (rc < 0 && errno == EINTR)
      return errf(err, err_size, "interrupted");
    return errf(err, err_size, "the REPL's connection: %s", rc < 0 && errno ? strerror(errno) : "closed inside a message");
  }
  buf[len] = 0;
  *type = head[0];
  *payload = buf;
  *n = len;
  return 0;
}

static int unix_address(const char *path, struct sockaddr_un *a, char *err, size_t err_size)
{
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  if (strlen(path) >= sizeof a->sun_path)
    return errf(err, err_size, "%s: a socket path must be under %zu bytes", path, sizeof a->sun_path);
  memcpy(a->sun_path, path, strlen(path) + 1);
  return 0;
}

int link_listen_unix(const char *path, char *err, size_t err_size)
{
  struct sockaddr_un a;
  if (unix_address(path, &a, err, err_size))
    return -1;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return errf(err, err_size, "%s: cannot create a socket: %s", path, strerror(errno));
  mode_t old = umask(0177); /* the socket file is created 0600 */
  int rc = bind(fd, (struct sockaddr *)&a, sizeof a);
  int bind_errno = errno;
  umask(old);
  if (rc || listen(fd, 16)) {
    int e = rc ? bind_errno : errno;
    close(fd);
    return errf(err, err_size, "%s: cannot listen: %s", path, strerror(e));
  }
  return fd;
}

int link_connect_unix(const char *path, char *err, size_t err_size)
{
  struct sockaddr_un a;
  if (unix_address(path, &a, err, err_size))
    return -1;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return errf(err, err_size, "%s: cannot create a socket: %s", path, strerror(errno));
  if (connect(fd, (struct sockaddr *)&a, sizeof a)) {
    int e = errno;
    close(fd);
    return errf(err, err_size, "%s: cannot connect: %s", path, strerror(e));
  }
  return fd;
}

int link_new_token(char *token, size_t token_size, char *err, size_t err_size)
{
  unsigned char raw[16];
  if (token_size < 33)
    return errf(err, err_size, "a token needs 33 bytes");
  size_t got = 0;
  while (got < sizeof raw) {
    ssize_t r = getrandom(raw + got, sizeof raw - got, 0);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      return errf(err, err_size, "cannot draw a session token: %s", strerror(errno));
    got += (size_t)r;
  }
  for (size_t i = 0; i < sizeof raw; i++) snprintf(token + 2 * i, 3, "%02x", raw[i]);
  return 0;
}

int link_parse_addr(const char *addr, struct link_addr *a, char *err, size_t err_size)
{
  memset(a, 0, sizeof *a);
  if (!addr || !*addr)
    return errf(err, err_size, "an empty address: give a Unix socket path or HOST:PORT");
  const char *colon = strrchr(addr, ':');
  int digits = colon && colon[1] && !strchr(addr, '/');
  for (const char *c = colon ? colon + 1 : ""; digits && *c; c++) digits = *c >= '0' && *c <= '9';
  if (digits) {
    long port = strtol(colon + 1, NULL, 10);
    if (port < 1 || port > 65535 || strlen(colon + 1) > 5)
      return errf(err, err_size, "%s: the port must be 1..65535", addr);
    size_t hn = (size_t)(colon - addr);
    if (hn >= sizeof a->host)
      return errf(err, err_size, "%s: the host name is too long", addr);
    a->tcp = 1;
    a->port = (int)port;
    memcpy(a->host, addr, hn);
    a->host[hn] = 0;
    if (!a->host[0])
      snprintf(a->host, sizeof a->host, "localhost");
    snprintf(a->token_file, sizeof a->token_file, "tycho-listen-%d.token", a->port);
    return 0;
  }
  if (strlen(addr) >= sizeof a->path)
    return errf(err, err_size, "%s: a socket path must be under %zu bytes", addr, sizeof a->path);
  snprintf(a->path, sizeof a->path, "%s", addr);
  snprintf(a->token_file, sizeof a->token_file, "%s.token", addr);
  return 0;
}

static struct addrinfo *resolve(const struct link_addr *a, int passive, char *err, size_t err_size)
{
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  char port[16];
  snprintf(port, sizeof port, "%d", a->port);
  int rc = getaddrinfo(a->host, port, &hints, &res);
  if (rc) {
    errf(err, err_size, "%s:%d: %s", a->host, a->port, gai_strerror(rc));
    return NULL;
  }
  return res;
}

/* A TCP socket bound and listening (passive) or connected to a's address: the first of its
 * resolved addresses that works. The fd, or −1 with err. */
static int tcp_open(const struct link_addr *a, int passive, char *err, size_t err_size)
{
  struct addrinfo *res = resolve(a, passive, err, err_size);
  if (!res)
    return -1;
  int fd = -1, e = 0;
  for (struct addrinfo *r = res; r && fd < 0; r = r->ai_next) {
    fd = socket(r->ai_family, r->ai_socktype | SOCK_CLOEXEC, r->ai_protocol);
    if (fd < 0) {
      e = errno;
      continue;
    }
    int one = 1;
    if (passive)
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (passive ? bind(fd, r->ai_addr, r->ai_addrlen) || listen(fd, 16) : connect(fd, r->ai_addr, r->ai_addrlen)) {
      e = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0)
    return errf(err, err_size, "%s:%d: cannot %s: %s", a->host, a->port, passive ? "listen" : "connect", strerror(e));
  return fd;
}

int link_addr_public(const struct link_addr *a)
{
  if (!a->tcp)
    return 0;
  char why[256];
  struct addrinfo *res = resolve(a, 1, why, sizeof why);
  int public = 0;
  for (struct addrinfo *r = res; r; r = r->ai_next) {
    if (r->ai_family == AF_INET) {
      const struct sockaddr_in *in = (const struct sockaddr_in *)r->ai_addr;
      public |= (ntohl(in->sin_addr.s_addr) >> 24) != 127;
    } else if (r->ai_family == AF_INET6) {
      const struct in6_addr *in6 = &((const struct sockaddr_in6 *)r->ai_addr)->sin6_addr;
      public |= !IN6_IS_ADDR_LOOPBACK(in6) && !(IN6_IS_ADDR_V4MAPPED(in6) && in6->s6_addr[12] == 127);
    } else {
      public = 1;
    }
  }
  if (res)
    freeaddrinfo(res);
  return public;
}

int link_listen_addr(const struct link_addr *a, char *err, size_t err_size)
{
  return a->tcp ? tcp_open(a, 1, err, err_size) : link_listen_unix(a->path, err, err_size);
}

int link_connect_addr(const struct link_addr *a, char *err, size_t err_size)
{
  return a->tcp ? tcp_open(a, 0, err, err_size) : link_connect_unix(a->path, err, err_size);
}
