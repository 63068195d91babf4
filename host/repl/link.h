/* The REPL's link: framed messages over a local stream socket between the front-end (`tycho repl
 * -n N`, `tycho repl --attach ADDR`: the process at the user's terminal) and the ranks that run
 * the chunks. A frame is one type byte, the payload's length (4 bytes, little-endian) and the
 * payload. Blocking reads and writes: a side waiting for the other sleeps in read(), it never
 * spins.
 *
 * Front-end → rank:
 *   LINK_CHUNK      selector '\0' code (the code's length is the rest of the payload)
 *   LINK_INTERRUPT  (empty) Ctrl-C at the front-end during a chunk
 *   LINK_QUIT       the exit code in decimal: the session ends
 *   LINK_COMPLETE   the word to complete (rank 0 at the prompt): answered by LINK_CANDIDATES
 * Rank → front-end:
 *   LINK_HELLO      "RANK SIZE PID TOKEN": the first frame of a connection
 *   LINK_OUTPUT     bytes a chunk printed, sent as they are produced (at each line's end)
 *   LINK_DONE       "FLAGS QUIT_CODE": the chunk ended on this rank (enum rank_status flags)
 *   LINK_CANDIDATES the completions of a LINK_COMPLETE, one per line */
#ifndef TYCHO_REPL_LINK_H
#define TYCHO_REPL_LINK_H
#include <stddef.h>
#include <stdint.h>

enum link_type {
  LINK_CHUNK = 'C',
  LINK_INTERRUPT = 'I',
  LINK_QUIT = 'Q',
  LINK_COMPLETE = 'K',
  LINK_HELLO = 'H',
  LINK_OUTPUT = 'O',
  LINK_DONE = 'D',
  LINK_CANDIDATES = 'k',
};

/* The largest payload a side accepts: a frame announcing more is a broken peer. */
enum { LINK_MAX_PAYLOAD = 64 << 20 };

/* Writes one frame (all of it, retrying short writes and EINTR). 0, or −1 with err. */
int link_send(int fd, int type, const void *payload, size_t n, char *err, size_t err_size);

/* Reads one frame into *payload (malloc'd, n + 1 bytes with a 0 after the payload; the caller
 * frees it). 0; 1 at a clean end of the connection (EOF before a frame began); −1 with err for a
 * read error, EOF inside a frame or a payload over LINK_MAX_PAYLOAD. EINTR is retried unless
 * *stop is nonzero (stop may be NULL), then −1 with errno EINTR and err "interrupted". */
int link_recv(int fd, int *type, char **payload, size_t *n, volatile int *stop, char *err, size_t err_size);

/* A Unix stream socket listening at path (created mode 0600, backlog 16). The fd, or −1 with err. */
int link_listen_unix(const char *path, char *err, size_t err_size);
/* A connection to the Unix socket at path. The fd, or −1 with err. */
int link_connect_unix(const char *path, char *err, size_t err_size);

/* An address of `tycho run --listen` / `tycho repl --attach`: "HOST:PORT" (PORT 1..65535; HOST a
 * name or an IPv4 address, empty for localhost) is TCP, anything else a Unix socket path. Its
 * token file: PATH.token next to a Unix socket; for TCP ./tycho-listen-PORT.token in the folder
 * the job was started in. */
struct link_addr {
  int tcp;
  char path[108];    /* a Unix socket's path */
  char host[256];    /* TCP: the host ("localhost" when empty) */
  int port;
  char token_file[4200];
};
/* Parses addr into a. 0, or −1 with err naming the address. */
int link_parse_addr(const char *addr, struct link_addr *a, char *err, size_t err_size);
/* Listens (a Unix socket created 0600; TCP on the address's host, SO_REUSEADDR) / connects. The
 * fd, or −1 with err. */
int link_listen_addr(const struct link_addr *a, char *err, size_t err_size);
int link_connect_addr(const struct link_addr *a, char *err, size_t err_size);
/* 1 when a is TCP and its host resolves (as for listening) to any address other than loopback
 * (127.0.0.0/8, ::1): other machines could connect there. 0 for a Unix socket, a loopback host
 * or a host that does not resolve (listening there fails with the resolver's reason). */
int link_addr_public(const struct link_addr *a);

/* Fills token with 32 random hex digits from the kernel's generator (getrandom) and a 0
 * (token_size ≥ 33). 0, or −1 with err. */
int link_new_token(char *token, size_t token_size, char *err, size_t err_size);

#endif
