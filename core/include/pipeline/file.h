/* file.h - open the files the product reads only when they are regular files.
 *
 * Every path the product reads comes from a user: a config file, a data file
 * (data.path), a checkpoint (--resume, init_from), a Hugging Face backbone's
 * config.json, shard index and shards. open() on a FIFO with nobody writing
 * blocks forever, a character device such as /dev/zero or /dev/urandom never
 * ends, and a directory fails later with a confusing message. So every
 * reader checks the type first and refuses anything that is not a regular
 * file (symbolic links are followed), naming the path, what it was given
 * for and what it is: "data.path /tmp/x.h5: is a FIFO, expected a regular
 * file".
 *
 * pl_file_check_regular() is a stat() before an open that the caller cannot
 * make itself (a library's, e.g. H5Fopen). Where the caller opens the file,
 * pl_file_open_read() / pl_file_fopen_read() check the very file they open:
 * open(O_RDONLY | O_NONBLOCK) (which returns at once even for a FIFO), then
 * fstat(), then the descriptor is switched back to blocking reads. That
 * leaves no window in which the path could be replaced by a FIFO between
 * the check and the open.
 *
 * Errors are PL_ERR_IO, set on the calling thread (status.h). errno is left
 * as the failing call set it (ENOENT for a missing file, so callers can tell
 * "absent" from "refused"); it is 0 for a file of the wrong type.
 */
#ifndef PIPELINE_FILE_H
#define PIPELINE_FILE_H

#include <stdio.h>

#include "pipeline/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The name of a stat() file type: "a regular file", "a directory",
 * "a FIFO", "a socket", "a character device", "a block device",
 * "a symbolic link" or "of unknown type". Static string. */
const char *pl_file_type_name(unsigned mode);

/* stat(path) and refuse anything but a regular file. `what` says what the
 * path was given for ("data.path", "backbone shard", "config file"); NULL or
 * "" leaves it out. Messages:
 *   "<what> <path>: cannot stat: <strerror>"        (missing, no permission)
 *   "<what> <path>: is a FIFO, expected a regular file"
 * Returns PL_OK or PL_ERR_IO with the error set. On PL_ERR_IO errno tells the
 * two apart: stat's errno when the path could not be examined, 0 when it is
 * something other than a regular file (a caller with its own "cannot open"
 * message refuses only the latter: `if (pl_file_check_regular(p, w) && !errno)`). */
pl_status pl_file_check_regular(const char *path, const char *what);

/* Open `path` read-only (O_CLOEXEC) after checking, on the opened
 * descriptor, that it is a regular file (see above; never blocks on a FIFO).
 * Returns the descriptor, in blocking mode, owned by the caller (close()),
 * or -1 with the error set (message as pl_file_check_regular's, "cannot
 * open" for a failed open). */
int pl_file_open_read(const char *path, const char *what);

/* pl_file_open_read wrapped in a FILE* opened "rb" (caller fclose()s), or
 * NULL with the error set. */
FILE *pl_file_fopen_read(const char *path, const char *what);

#ifdef __cplusplus
}
#endif
#endif
