/* crash_handler.h - name the plugin and the call when the process dies of a
 * fatal signal (libpipeline_run; the CLI installs it).
 *
 * A plugin that crashes in its constructor, its entry point or a stage call
 * used to kill the process with no word. pl_crash_handler_install installs
 * a handler for SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT. On a fatal
 * signal it prints, to stderr: the signal, the innermost call the core and
 * the run bracketed (pl_crash_context_push of crash.h: "loading plugin X
 * (PATH)", "[model] plugin 'ilora': create"), the shared object and symbol
 * holding the faulting instruction (dladdr: names the plugin even for a
 * crash in forward), for a fault inside a memory-mapped file the core
 * recorded (pl_crash_map_register) the file and the offset (a SIGBUS there
 * means the file was truncated or rewritten while mapped), and the call
 * stack; then it hands the signal on (the previous handler, or the default
 * action: the exit status stays "killed by signal"). Nothing is allocated
 * in the handler.
 */
#ifndef PL_CRASH_HANDLER_H
#define PL_CRASH_HANDLER_H

/* Install the handler once per process (idempotent; on an alternate stack,
 * so a stack overflow is reported too). */
void pl_crash_handler_install(void);

#endif
