/* crash.h - what a crash report names (core only; base layer).
 *
 * The core keeps two records that the fatal-signal handler of the run
 * (core/run/crash_handler.h, installed by the CLI) prints when the process
 * dies: the calls into plugins the core and the run bracket
 * (pl_crash_context_push/pop: "loading plugin X (PATH)", "[model] plugin
 * 'ilora': create"), and the memory-mapped files (pl_crash_map_register), so
 * a fault inside one names the file and the offset. Without an installed
 * handler both are only bookkeeping. The context stack is per thread;
 * messages are copies made before the call, so the handler allocates
 * nothing.
 */
#ifndef PL_CRASH_H
#define PL_CRASH_H

#include <stddef.h>

/* Enter / leave a call worth naming if it crashes: printf-style, copied
 * (truncated to 256 bytes); at most 8 nested on a thread (deeper ones are
 * counted but not kept). */
void pl_crash_context_push(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void pl_crash_context_pop(void);
/* The innermost kept context of this thread (the deepest of 8 when more are
 * nested), NULL when none. Async-signal-safe; for the handler. */
const char *pl_crash_context_top(void);

/* Memory-mapped files, so that a SIGBUS (or SIGSEGV) inside one is reported
 * with the file's name: a file truncated or rewritten by another process
 * while mapped (a backbone shard viewed by bf16-true) faults on the next
 * touch of a page past its new end. pl_crash_map_register records
 * [base, base + size) with a copy of `path` (truncated to 511 bytes) in a
 * fixed table of 256 slots (further mappings are not recorded: the crash
 * then names no file, nothing else changes); pl_crash_map_unregister(base)
 * forgets it (call it before munmap). Thread-safe; the handler reads the
 * table without locks or allocation. */
void pl_crash_map_register(const void *base, size_t size, const char *path);
void pl_crash_map_unregister(const void *base);
/* The recorded file holding `addr` (copied into buf, n bytes) and the
 * offset of addr in it; false when none. Async-signal-safe: the handler's
 * lookup, and the tests'. */
_Bool pl_crash_map_lookup(const void *addr, char *buf, size_t n, size_t *offset);

#endif
