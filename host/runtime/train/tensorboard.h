/* log.tensorboard: the run's metrics as a TensorBoard event file, so `tensorboard --logdir DIR`
 * shows a run live, beside the JSON lines of log.metrics (train_run.c feeds it the same lines).
 *
 * The file: DIR/events.out.tfevents.<unix time>.<host>.tycho (TensorBoard reads the files whose
 * name holds "tfevents", in name order), made new by every run — a resumed run adds its own file
 * to DIR; when a file of that name exists (two runs in one second) the next second's name is
 * taken, so the files of a run still sort in the order they were written. It is a sequence of
 * records (TFRecord framing): the payload's length as a little-endian uint64, the masked CRC32C
 * of those 8 bytes, the payload, the masked CRC32C of the payload. Each payload is an Event
 * message: the first carries file_version "brain.Event:2", the second a SessionLog START at the
 * run's first step (TensorBoard then drops the steps from there on that an earlier, interrupted
 * run of the same folder wrote past its checkpoint, so no step is shown twice), then one Event of
 * scalars per metrics line.
 *
 * Tags, from the metrics line's numbers (true counts as 1): a step's line under train/ (step
 * s + 1, the optimizer steps done, as evaluation counts them), its "moe" object under moe/
 * (moe/aux, moe/layer<L>/dropped, moe/layer<L>/tokens/expert<E>), an evaluation's under eval/
 * (val_loss as eval/loss) at its step, the memory record's peaks under memory/<category> and
 * what is held after the last step under memory/held/<category> at the last step written
 * (another rank's record under memory/rank<R>/).
 *
 * Records are kept in memory and written whole, by one write when a record comes TB_FLUSH_SECONDS
 * or more after the last write, and at the end (tb_flush): a fast run makes one write per 5 s
 * and a live reader sees its steps within about that (at once when steps take longer; records
 * kept before a long evaluation wait for it), and a write that fails part way is cut back so the
 * file never ends in half a record. Errors: "log.tensorboard PATH: ..." with 0 ok,
 * −1 a runtime failure, 2 a path that is not ours to write (a symbolic link, not a folder). */
#ifndef TYCHO_RUNTIME_TENSORBOARD_H
#define TYCHO_RUNTIME_TENSORBOARD_H
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define TB_FLUSH_SECONDS 5.0

struct tb_log {
  int fd;                /* -1: none (log.tensorboard unset, or not this rank's) */
  char path[4608];       /* the event file */
  int rank;              /* this rank: memory records of other ranks go under memory/rank<R>/ */
  unsigned char *buf;    /* records not yet written */
  size_t len, cap;
  off_t size;            /* bytes in the file */
  double last_write;     /* monotonic seconds */
  long long last_step;   /* the highest step written; -1 none */
  int started;           /* the SessionLog START is written */
};

enum tb_line { TB_TRAIN, TB_EVAL, TB_MEMORY };

/* CRC32C (Castagnoli, reflected 0x82F63B78) of n bytes; crc32c("123456789") is 0xE3069283. */
uint32_t tb_crc32c(const void *data, size_t n);
/* The record framing's mask: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t tb_masked_crc(uint32_t crc);

/* An empty writer (fd -1), safe to flush and close. */
void tb_init(struct tb_log *w);
/* Opens a new event file in DIR (per_rank: in DIR/rank<rank>/), making the folders (their
 * parent must exist), and writes the file_version record. A symbolic link at DIR or at the rank
 * folder, or anything there but a folder, is refused (2) with nothing written. */
int tb_open(struct tb_log *w, const char *dir, int rank, int per_rank, char *err, size_t n);
/* One metrics line (a JSON object, as log.metrics writes it) as one Event of scalars at `step`
 * (TB_MEMORY: step < 0 is the last step written). The record is written with the ones before it
 * when TB_FLUSH_SECONDS have passed since the last write. Nothing when w is closed. */
int tb_line(struct tb_log *w, enum tb_line kind, long long step, const char *line, char *err, size_t n);
/* Writes the records kept: now when force, else only when TB_FLUSH_SECONDS have passed. */
int tb_flush(struct tb_log *w, int force, char *err, size_t n);
/* Closes the file (what is kept and not flushed is dropped) and frees the writer's memory. */
void tb_close(struct tb_log *w);

#endif
