/* fuzz_util.c - scratch files and input splitting for the harnesses. */
#include "fuzz_util.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_dir[512];
static char g_path[1024];

static void remove_dir(void) {
    DIR *d = opendir(g_dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(g_dir);
}

const char *fz_dir(const char *harness) {
    if (g_dir[0]) return g_dir;
    const char *base = getenv("PL_FUZZ_TMP");
    struct stat st;
    if (!base || !*base)
        base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/plfuzz-%s-%ld", base, harness, (long)getpid());
    if (mkdir(g_dir, 0700) != 0 && !(stat(g_dir, &st) == 0 && S_ISDIR(st.st_mode))) {
        fprintf(stderr, "fuzz: cannot create the scratch directory %s\n", g_dir);
        abort();
    }
    atexit(remove_dir);
    return g_dir;
}

const char *fz_write(const char *name, const void *data, size_t n) {
    snprintf(g_path, sizeof g_path, "%s/%s", g_dir, name);
    FILE *f = fopen(g_path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        fprintf(stderr, "fuzz: cannot write %s\n", g_path);
        abort();
    }
    return g_path;
}

void fz_remove(const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", g_dir, name);
    unlink(p);
}

int fz_split(const uint8_t *data, size_t n, const char *sep, int max, const uint8_t **parts,
             size_t *lens) {
    size_t sl = strlen(sep), start = 0;
    int k = 0;
    for (size_t i = 0; k < max - 1 && sl && i + sl <= n;) {
        if (memcmp(data + i, sep, sl) == 0) {
            parts[k] = data + start;
            lens[k++] = i - start;
            i += sl;
            start = i;
        } else {
            i++;
        }
    }
    parts[k] = data + start;
    lens[k++] = n - start;
    return k;
}

char *fz_strndup(const uint8_t *data, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    if (n) memcpy(s, data, n);
    s[n] = '\0';
    return s;
}
