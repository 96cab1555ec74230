/* message.h - where pl_message (plugin.h) writes (core only; base layer).
 *
 * pl_message is called by plugins that link libpipeline_core alone, so it
 * lives in the core; where its line goes is the run's business. The core
 * formats the line (a newline appended when missing) and hands it to the
 * sink installed here; with none (unit tests, the harness, `pipeline
 * predict`) it goes to stderr. The run (libpipeline_run) installs a sink
 * for the time its plugins run that writes the line where the trainer's own
 * messages go: the terminal above the progress line, and log.txt.
 */
#ifndef PL_MESSAGE_H
#define PL_MESSAGE_H

/* A sink: `line` is one whole line ending in '\n' (at most 2048 bytes and
 * the newline), borrowed for the call; `ud` is the pointer given with it. */
typedef void (*pl_message_sink)(void *ud, const char *line);

/* Install `fn` with `ud` (fn NULL: stderr again). Process-wide, not
 * synchronized with pl_message: set it before the plugins that write start
 * and clear it after they stop, from the thread that drives them. */
void pl_message_set_sink(pl_message_sink fn, void *ud);

#endif
