/* What fuzz_manifest.c and its driver share: the shard files a fuzzed manifest's pieces are read
 * from, each FUZZ_SHARD_BYTES bytes of a fixed pattern (so the driver's seeds can carry the right
 * checksums). */
#ifndef TYCHO_FUZZ_MANIFEST_H
#define TYCHO_FUZZ_MANIFEST_H

#define FUZZ_SHARD_BYTES 4096

void fuzz_manifest_shard(int f, unsigned char *out);
/* Inputs the reader accepted so far. */
extern long fuzz_manifest_accepted;

#endif
