/* crash.h - name the plugin and the call when the process dies of a fatal
 * signal (core only).
 *
 * A plugin that crashes in its constructor, its entry point or a stage call
 * used to kill the process with no word. The CLI installs a handler for
 * SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT (pl_crash_handler_install);
 * the core brackets the calls into plugins it makes at load and create time
 * with pl_crash_context_push/pop. On a fatal signal the handler prints, to
 * stderr: the signal, the innermost context ("loading plugin X (PATH)",
 * "[model] plugin 'ilora': create"), the shared object and symbol holding the
 * faulting instruction (dladdr: names the plugin even for a crash in
 * forward), and the call stack; then it hands the signal on (the previous
 * handler, or the default action: the exit status stays "killed by signal").
 * For a fault inside a memory-mapped file (pl_crash_map_register) it also
 * names the file and the offset: a SIGBUS there means the file was
 * truncated or rewritten while mapped.
 * The context stack is per thread; messages are static strings or copies
 * made before the call (nothing is allocated in the handler).
 */
#ifndef PL_CRASH_H
#define PL_CRASH_H

#include <stddef.h>

/* Install the handler once per process (idempotent). */
void pl_crash_handler_install(void);
/* Enter / leave a call worth naming if it crashes: printf-style, copied
 * (truncated to 256 bytes); at most 8 nested on a thread (deeper ones are
 * counted but not kept). */
void pl_crash_context_push(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void pl_crash_context_pop(void);

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
 * offset of addr in it; false when none. Async-signal-safe; for tests. */
_Bool pl_crash_map_lookup(const void *addr, char *buf, size_t n, size_t *offset);

#endif
