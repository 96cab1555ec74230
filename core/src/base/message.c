/* message.c - pl_message (plugin.h) and its sink (message.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "message.h"
#include "pipeline/plugin.h"

static pl_message_sink g_sink; /* NULL: stderr */
static void *g_sink_ud;

void pl_message_set_sink(pl_message_sink fn, void *ud) {
    g_sink = fn;
    g_sink_ud = fn ? ud : NULL;
}

void pl_message(const char *fmt, ...) {
    char line[2048 + 1]; /* the message, and the newline appended when missing */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, 2048, fmt, ap);
    va_end(ap);
    size_t n = strlen(line);
    if (!n || line[n - 1] != '\n') {
        line[n] = '\n';
        line[n + 1] = 0;
    }
    if (g_sink)
        g_sink(g_sink_ud, line);
    else
        fputs(line, stderr);
}
