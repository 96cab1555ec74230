/* fuzz_util.h - what the libFuzzer harnesses share: a scratch directory of
 * their own (tmpfs when there is one) and splitting an input into parts.
 *
 * Ownership: paths returned are static (one scratch dir per process). */
#ifndef PL_FUZZ_UTIL_H
#define PL_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* The process's scratch directory, created on first use: $PL_FUZZ_TMP or
 * /dev/shm (else /tmp), then "plfuzz-<harness>-<pid>". Removed at exit.
 * Aborts when it cannot be made (the harness cannot run at all). */
const char *fz_dir(const char *harness);
/* Write `n` bytes to `dir`/`name` (truncating), abort on failure. Returns
 * the full path (static buffer, valid until the next call). */
const char *fz_write(const char *name, const void *data, size_t n);
/* Remove `dir`/`name` if present. */
void fz_remove(const char *name);

/* Split data[0..n) at every occurrence of `sep` (not included): at most
 * `max` parts, the last one taking the rest. Returns the number of parts
 * (at least 1); parts[i] / lens[i] point into data. */
int fz_split(const uint8_t *data, size_t n, const char *sep, int max, const uint8_t **parts,
             size_t *lens);
/* A NUL-terminated malloc'd copy of n bytes (abort on failure). */
char *fz_strndup(const uint8_t *data, size_t n);

#endif
