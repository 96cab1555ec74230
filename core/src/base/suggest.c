/* suggest.c - "did you mean": edit distance and the nearest name, for the
 * messages of the config (sections, keys, choices) and the plugin registry
 * (plugin names). Base layer: calls nothing of the core. */
#include <ctype.h>
#include <limits.h>
#include <string.h>
#include <strings.h>

#include "config_internal.h"

int pl_edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 255 || m > 255) return (int)(n > m ? n : m);
    int row[256];
    for (size_t j = 0; j <= m; j++) row[j] = (int)j;
    for (size_t i = 1; i <= n; i++) {
        int prev = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= m; j++) {
            int cur = row[j];
            int sub = prev + (a[i - 1] != b[j - 1]);
            int del = row[j] + 1, ins = row[j - 1] + 1;
            row[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            prev = cur;
        }
    }
    return row[m];
}

/* Edit distance ignoring ASCII case ("adamW" is 0 from "adamw"). */
static int edit_distance_nocase(const char *a, const char *b) {
    char la[256], lb[256];
    size_t i;
    for (i = 0; a[i] && i < sizeof la - 1; i++) la[i] = (char)tolower((unsigned char)a[i]);
    la[i] = 0;
    for (i = 0; b[i] && i < sizeof lb - 1; i++) lb[i] = (char)tolower((unsigned char)b[i]);
    lb[i] = 0;
    return pl_edit_distance(la, lb);
}

const char *pl_suggest_name(const char *word, const char *const *cands, int n) {
    int len = (int)strlen(word);
    int limit = len / 3 > 2 ? len / 3 : 2;
    const char *best = NULL;
    int bestd = INT_MAX;
    for (int i = 0; n < 0 ? cands[i] != NULL : i < n; i++) {
        if (!cands[i] || strchr(cands[i], '*')) continue;
        /* a case-only difference first, then the fewest edits (case ignored) */
        int d = !strcmp(word, cands[i])       ? -1
                : !strcasecmp(word, cands[i]) ? 0
                                              : 1 + edit_distance_nocase(word, cands[i]);
        if (d < bestd) {
            bestd = d;
            best = cands[i];
        }
    }
    return (best && bestd <= limit + 1) ? best : NULL;
}
