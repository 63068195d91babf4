/* Sharded checkpoints (docs/design.md, "Checkpoints"; plan field `checkpoint`).
 *
 * A checkpoint is a folder DIR/step_NNNNNNNN (N = optimizer steps done) holding manifest.json and
 * one shard file per rank, rank_RRRRR.bin: pieces in the build's element type (F32; F64 in the float64 build) written by the rank that owns them,
 * back to back. The manifest names, for every tensor (Hugging Face name, unpadded shape) and
 * every kind (param: the fp32 master weights; exp_avg, exp_avg_sq: AdamW's moments), each piece:
 * its file and byte offset, the block of the stored tensor it lies in (first row and column,
 * rows, columns: a tensor-parallel rank's block) and the range of that block's row-major
 * elements it holds (a ZeRO shard's slice; the whole block otherwise), with an FNV-1a 64
 * checksum of its bytes. Each element is written once: a replicated parameter by tensor-parallel
 * rank 0, whole (unsharded) state by data-parallel rank 0, a tied embedding by the first stage.
 * Vocabulary padding rows are not part of the tensor: not written, loaded as zeros. So a
 * checkpoint holds exactly 3 elements per model parameter (plus the manifest), whatever the mesh.
 *
 * Saving writes into step_N.tmp (every rank its file, fsync), then rank 0 the manifest (fsync),
 * renames the folder to step_N and syncs DIR, then removes the oldest beyond checkpoint.keep:
 * a crash leaves the last good checkpoint and at worst a .tmp folder, which loading ignores and
 * the next run removes (ckpt_remove_partial); a write that fails removes its .tmp folder.
 * Removing never follows a symbolic link below DIR: a step folder that is a link loses the link,
 * never its target's files.
 *
 * Loading works on any other mesh, tp / pp / dp / zero (resharding): each rank reads, from the
 * memory-mapped shard files, only the pieces that overlap the blocks and ranges it holds,
 * checks each such piece's checksum, and requires every element it holds to be covered. Every
 * manifest is read by one checked reader (manifest.h), for a resume, verify and inspect alike.
 * The data order, learning rate, dropout masks and AdamW's bias correction are functions of the step
 * and the seeds, so the step is the whole rest of the state; the manifest records the seeds too.
 *
 * Every function returns 0 ok, nonzero with a one-line message naming the checkpoint. */
#ifndef TYCHO_RUNTIME_CKPT_H
#define TYCHO_RUNTIME_CKPT_H
#include <stddef.h>
#include <stdio.h>

struct trainer;

#define CKPT_FORMAT_VERSION 1

/* The newest complete checkpoint in dir (a step_N folder with a manifest): its path and step.
 * 0 found; 1 none (dir missing or empty: not an error); -1 with a message. Local. */
int ckpt_find_latest(const char *dir, char *path, size_t path_size, long long *step,
                     char *err, size_t err_size);
/* Removes every step_N.tmp folder in dir (writes that did not finish: a crash, a full disk, a
 * killed run), naming each on out (may be NULL). Only for a dir this process holds locked
 * (train_run.c): another live run's .tmp is its write in progress. A step_N.tmp that is not a
 * folder (a link, say) is left alone. 0 ok (dir missing: nothing to do); −1 with a message. Local. */
int ckpt_remove_partial(const char *dir, FILE *out, char *err, size_t err_size);
/* Collective over the job: saves t (its parameters and optimizer state after `steps_done`
 * steps) as dir/step_N, then keeps the newest `keep`. Every rank returns the same status
 * (agreed). */
int ckpt_save(struct trainer *t, const char *dir, long long steps_done, int keep, char *err,
              size_t err_size);
/* checkpoint.async: ckpt_save in two halves, so that the step after a save does not wait for the
 * disk. ckpt_save_async (collective, agreed) copies the pieces this rank writes into a snapshot
 * in host memory (category ALLOC_CHECKPOINT, sized dp_snapshot_elems reals (layout/dp_buckets.h): the rank's whole
 * state, what the memory bill counts), gathers the piece lists, makes the manifest's text on
 * rank 0 and starts a thread that writes and syncs this rank's file into dir/step_N.tmp.
 * Training goes on: the snapshot is not the trainer's memory. ckpt_async_poll (collective,
 * agreed; every rank calls it at the same points, after each step while one is pending) asks
 * whether every rank's file is synced — with `wait` it first waits for this rank's — and if so
 * rank 0 commits as ckpt_save does (manifest, rename to step_N, keep) and *committed is the
 * step (else -1: still writing), *seconds the time since the snapshot. A failed write removes
 * step_N.tmp. One save is pending at a time: poll with wait before the next.
 * ckpt_async_abandon (local) waits for this rank's writer and drops the save (trainer_close):
 * step_N.tmp is left for the next run to remove. */
int ckpt_save_async(struct trainer *t, const char *dir, long long steps_done, int keep, char *err,
                    size_t err_size);
int ckpt_async_poll(struct trainer *t, int wait, long long *committed, double *seconds, char *err,
                    size_t err_size);
void ckpt_async_abandon(struct trainer *t);

/* Loads the checkpoint folder `path` into t's parameters and optimizer state (this rank's
 * blocks and shards) and sets t->step. Local (the caller agrees on the outcome). First it
 * compares what the run computes (the manifest's "computes": seeds, batch.global and .seq, the
 * data files and shuffle, the optimizer and lr schedule, norm_eps, rope_theta, dropout,
 * precision; plan.h plan_resume_field_name) with t's plan and returns TRAIN_PLAN_ERROR (−2),
 * naming every changed field, unless checkpoint.allow_changes lists it; the layout may change
 * freely. Else 0, or −1 with the message. */
int ckpt_load(struct trainer *t, const char *path, char *err, size_t err_size);
/* In memory: the state a checkpoint would hold, on every rank at once (trainer_replan, train.h).
 * ckpt_mem_gather (collective over t's world, agreed: every rank returns the same status) counts
 * the pieces each rank would write (ckpt_save's), refuses when their sum — the whole training
 * state, 3 × sizeof(real) bytes per model parameter, which every rank then holds — exceeds
 * max_bytes (0: no bound) or the allocator (category "comm") cannot give it, copies each rank's
 * pieces into its segment of one buffer, all-gathers the piece lists and broadcasts every
 * segment from its rank (counted model traffic on the world group). t is left as it was.
 * ckpt_mem_load (local) then reads it into any trainer of the same model exactly as ckpt_load
 * reads a checkpoint folder: the same overlap copies, checksums and coverage check, and the step.
 * ckpt_mem_free frees it (NULL is a no-op); ckpt_mem_bytes is the buffer's size. */
struct ckpt_mem;
int ckpt_mem_gather(struct trainer *t, size_t max_bytes, struct ckpt_mem **out, char *err, size_t err_size);
int ckpt_mem_load(struct trainer *t, struct ckpt_mem *cm, char *err, size_t err_size);
size_t ckpt_mem_bytes(const struct ckpt_mem *cm);
void ckpt_mem_free(struct ckpt_mem *cm);
/* `tycho ckpt verify`: the manifest reader's checks (every tensor and kind covered exactly once,
 * judged as a resume judges it), then every piece's bytes within its file, its checksum and
 * every element finite. Prints a summary on out. */
int ckpt_verify(const char *path, FILE *out, char *err, size_t err_size);
/* `tycho ckpt inspect`: the manifest's step, model, mesh, seeds, files and tensors, without
 * reading the shards. */
int ckpt_inspect(const char *path, FILE *out, char *err, size_t err_size);

#endif
