/* status.h - status codes and the per-thread error context.
 *
 * Every fallible function in the SDK returns a pl_status (or NULL for
 * functions returning a pointer) and, on failure, fills the calling thread's
 * error context with one line that names the file, key or tensor, what was
 * expected and what was found. Nothing below the CLI calls exit().
 *
 * Ownership: the string returned by pl_error_message() is owned by the thread's
 * error context and stays valid until the next pl_error_set() on that thread.
 */
#ifndef PIPELINE_STATUS_H
#define PIPELINE_STATUS_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum pl_status {
    PL_OK = 0,
    PL_ERR_INVALID,     /* bad argument or bad value */
    PL_ERR_CONFIG,      /* config file / override error (CLI exit code 2) */
    PL_ERR_IO,          /* file missing, unreadable, corrupt */
    PL_ERR_NOMEM,       /* allocation failed */
    PL_ERR_ABI,         /* plugin ABI mismatch or missing symbol */
    PL_ERR_SHAPE,       /* tensor shape mismatch */
    PL_ERR_DTYPE,       /* tensor dtype not accepted by an op */
    PL_ERR_DEVICE,      /* device mismatch or device unavailable */
    PL_ERR_NUMERIC,     /* NaN / Inf where a finite value was required */
    PL_ERR_UNSUPPORTED, /* feature or op not implemented on this backend */
    PL_ERR_INTERNAL
} pl_status;

/* Record an error for the calling thread; returns `status` so callers can
 * write `return pl_error_set(PL_ERR_IO, "%s: not an HDF5 file", path);`.
 * The message is printf-formatted, truncated to 1023 bytes. */
pl_status pl_error_set(pl_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Like pl_error_set but prepends "context: " to the current message; used to
 * add the file / section / tensor name while an error propagates up. When
 * there is no current message (a callee, e.g. a plugin's create(), failed
 * without setting one) the result is "context: failed without setting an
 * error message (status PL_ERR_...)". */
pl_status pl_error_prefix(pl_status status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The last error message of the calling thread ("" if none). Borrowed. */
const char *pl_error_message(void);

/* The last status recorded on the calling thread (PL_OK if none). */
pl_status pl_error_status(void);

/* Clear the calling thread's error context. */
void pl_error_clear(void);

/* A one-line "what to do" hint for the last error, printed by the CLI
 * under the error ("hint: ..."). Thread-local like the message; printf
 * format, truncated to 511 bytes. pl_hint_get returns "" when none is set
 * (borrowed); pl_error_clear does not clear it, pl_hint_clear does. */
void pl_hint_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *pl_hint_get(void);
void pl_hint_clear(void);

/* Human-readable name of a status code ("PL_ERR_SHAPE", ...). Static string. */
const char *pl_status_name(pl_status s);

#ifdef __cplusplus
}
#endif
#endif
