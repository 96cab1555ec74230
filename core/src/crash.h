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
 * The context stack is per thread; messages are static strings or copies
 * made before the call (nothing is allocated in the handler).
 */
#ifndef PL_CRASH_H
#define PL_CRASH_H

/* Install the handler once per process (idempotent). */
void pl_crash_handler_install(void);
/* Enter / leave a call worth naming if it crashes: printf-style, copied
 * (truncated to 256 bytes); at most 8 nested on a thread (deeper ones are
 * counted but not kept). */
void pl_crash_context_push(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void pl_crash_context_pop(void);

#endif
