/* pl_h5_fd.h - the file driver behind pl_h5_create (private to libpipeline_hdf5).
 *
 * HDF5 1.10 cannot survive a write that fails while a file is being closed:
 * H5Fclose returns an error but leaves the file id registered over a freed
 * file, and HDF5's atexit handler then crashes in H5F__close_cb (issue 34:
 * a full disk during the teacher export or `pipeline predict` ended in
 * SIGSEGV, no summary.json). Files pl_h5 writes therefore go through this
 * POSIX driver (pread / pwrite, files sec2 reads as usual: no driver info in
 * the superblock): the first write (or truncate, or close) that fails is
 * recorded with its errno and every later write is discarded, so HDF5 always
 * completes its close, and pl_h5 reports the recorded error naming the file.
 * Reads past what was written give zeros, as sec2 gives past the end. Only
 * pl_h5.c calls these, under pl_h5_lock(). */
#ifndef PL_H5_FD_H
#define PL_H5_FD_H

#include <hdf5.h>
#include <stdbool.h>

/* A file access property list for creating a file through the driver, with
 * H5F_CLOSE_STRONG (H5Fclose closes the file's open objects too). Caller
 * closes it (H5Pclose). H5I_INVALID_HID when HDF5 refuses the driver. */
hid_t pl_h5_fd_fapl(void);

/* What the driver leaves when it closes a file (see pl_h5_fd_watch). */
typedef struct pl_h5_fd_report {
    bool closed; /* the driver closed the file */
    int err;     /* errno of the first failed write, truncate or close; 0 */
} pl_h5_fd_report;

/* errno of the first failed write of the file `obj` belongs to (a file,
 * dataset or group id); 0 when none failed or the file is not the driver's. */
int pl_h5_fd_error(hid_t obj);

/* Have the driver fill *rep when it closes `file` (call right before
 * H5Fclose); returns a token for pl_h5_fd_unwatch, NULL when `file` is not
 * the driver's. */
void *pl_h5_fd_watch(hid_t file, pl_h5_fd_report *rep);
/* After H5Fclose: when the driver did not close the file (another id keeps
 * it open), stop it writing to *rep later and copy the error so far. */
void pl_h5_fd_unwatch(void *token, pl_h5_fd_report *rep);

#endif
