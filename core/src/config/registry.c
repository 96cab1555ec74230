/* registry.c - plugin search path, dlopen and descriptor checks.
 * See registry.h for the rules. Handles are never closed. */
#define _GNU_SOURCE /* dladdr */
#include "registry.h"
#include "crash.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config_internal.h"
#include "pipeline/pipeline.h"

#ifndef PL_BUILD_PLUGIN_DIR
#define PL_BUILD_PLUGIN_DIR ""
#endif
#ifndef PL_INSTALL_PLUGIN_DIR
#define PL_INSTALL_PLUGIN_DIR ""
#endif
/* The SONAME is libpipeline_core.so.<PL_ABI_MAJOR> (core/CMakeLists.txt reads
 * the major from plugin.h): a plugin linked against another major cannot bind
 * to this core, and dlopen says so (see plugin_needs_other_core). */
#ifndef PL_CORE_SOVERSION
#define PL_CORE_SOVERSION PL_ABI_MAJOR
#endif
_Static_assert(PL_CORE_SOVERSION == PL_ABI_MAJOR,
               "libpipeline_core's SOVERSION must be the plugin ABI major (PL_ABI_MAJOR)");

typedef struct loaded {
    char *path;      /* as found (dir/name.so) */
    char *real;      /* realpath, identity of the file */
    char *stem;      /* file name without directory and ".so" */
    void *handle;    /* NULL if the load failed */
    const pl_plugin_desc *desc;
    pl_status status;
    char *error;     /* load error, owned */
    char *dup_error; /* pl_registry_list: another file has the same name (owned) */
} loaded;

struct pl_registry {
    int n_dirs, cap_dirs;
    char **dirs;
    int n_loaded, cap_loaded;
    loaded *loaded;
    int n_info;
    pl_plugin_info *info;
};

static char *xstrdup(const char *s) { return strdup(s ? s : ""); }

pl_registry *pl_registry_new(void) {
    pl_registry *r = calloc(1, sizeof *r);
    if (!r) pl_error_set(PL_ERR_NOMEM, "pl_registry_new: out of memory");
    return r;
}

void pl_registry_free(pl_registry *r) {
    if (!r) return;
    for (int i = 0; i < r->n_dirs; i++) free(r->dirs[i]);
    free(r->dirs);
    for (int i = 0; i < r->n_loaded; i++) {
        free(r->loaded[i].path);
        free(r->loaded[i].real);
        free(r->loaded[i].stem);
        free(r->loaded[i].error);
        free(r->loaded[i].dup_error);
        /* handles stay open: vtables and option tables must outlive us */
    }
    free(r->loaded);
    free(r->info);
    free(r);
}

bool pl_plugin_name_valid(const char *name) {
    if (!name || !*name) return false;
    size_t n = 0;
    for (const char *p = name; *p; p++, n++) {
        char c = *p;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return n < 64;
}

pl_status pl_registry_add_dir(pl_registry *r, const char *dir) {
    if (!r || !dir) return pl_error_set(PL_ERR_INVALID, "pl_registry_add_dir: NULL argument");
    if (!*dir) return PL_OK;
    /* strip trailing slashes (keep "/") */
    char buf[PATH_MAX];
    snprintf(buf, sizeof buf, "%s", dir);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    for (int i = 0; i < r->n_dirs; i++)
        if (strcmp(r->dirs[i], buf) == 0) return PL_OK;
    if (r->n_dirs == r->cap_dirs) {
        int cap = r->cap_dirs ? r->cap_dirs * 2 : 8;
        char **d = realloc(r->dirs, (size_t)cap * sizeof *d);
        if (!d) return pl_error_set(PL_ERR_NOMEM, "plugin search path: out of memory");
        r->dirs = d;
        r->cap_dirs = cap;
    }
    r->dirs[r->n_dirs] = xstrdup(buf);
    if (!r->dirs[r->n_dirs]) return pl_error_set(PL_ERR_NOMEM, "plugin search path: out of memory");
    r->n_dirs++;
    return PL_OK;
}

/* dlopen's error for a plugin whose libpipeline_core.so.N (another ABI major)
 * is missing: "libpipeline_core.so.1: cannot open shared object file: ...".
 * True with *major = N when the message is that one. */
static bool plugin_needs_other_core(const char *dl_error, unsigned *major) {
    static const char lib[] = "libpipeline_core.so.";
    const char *p = strstr(dl_error, lib);
    if (!p) return false;
    p += sizeof lib - 1;
    char *end = NULL;
    unsigned long n = strtoul(p, &end, 10);
    if (end == p || *end != ':' || n == (unsigned long)PL_CORE_SOVERSION || n > 1000000)
        return false;
    *major = (unsigned)n;
    return true;
}

static bool is_dir(const char *p) {
    struct stat st;
    return p && *p && stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

pl_status pl_registry_add_default_dirs(pl_registry *r) {
    const char *env = getenv("PIPELINE_PLUGIN_PATH");
    if (env && *env) {
        char *copy = xstrdup(env), *save = NULL;
        if (!copy) return pl_error_set(PL_ERR_NOMEM, "PIPELINE_PLUGIN_PATH: out of memory");
        for (char *tok = strtok_r(copy, ":", &save); tok; tok = strtok_r(NULL, ":", &save)) {
            pl_status s = pl_registry_add_dir(r, tok);
            if (s) {
                free(copy);
                return s;
            }
        }
        free(copy);
    }
    /* A binary running from the build tree, or any program using the build
     * tree's libpipeline_core (a benchmark built elsewhere), uses the build
     * tree's plugins; an installed one uses the install dirs (never both:
     * the same plugin found in two places is refused as a duplicate). */
    char exe[PATH_MAX] = "";
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    exe[len > 0 ? len : 0] = '\0';
    /* this library's own file: a program linked against an installed core
     * finds the plugins installed beside it (<libdir>/pipeline/plugins) */
    char lib[PATH_MAX] = "";
    Dl_info di;
    if (dladdr((void *)pl_registry_add_default_dirs, &di) && di.dli_fname &&
        !realpath(di.dli_fname, lib))
        lib[0] = '\0';
    char build_root[PATH_MAX];
    snprintf(build_root, sizeof build_root, "%s", PL_BUILD_PLUGIN_DIR);
    char *bslash = strrchr(build_root, '/');
    if (bslash) *bslash = '\0';
    size_t bl = strlen(build_root);
    bool in_build = bl > 0 && ((strncmp(exe, build_root, bl) == 0 && exe[bl] == '/') ||
                               (strncmp(lib, build_root, bl) == 0 && lib[bl] == '/'));
    if (in_build) {
        if (is_dir(PL_BUILD_PLUGIN_DIR)) pl_registry_add_dir(r, PL_BUILD_PLUGIN_DIR);
        return PL_OK;
    }
    char real[PATH_MAX];
    if (*PL_INSTALL_PLUGIN_DIR && is_dir(PL_INSTALL_PLUGIN_DIR) &&
        realpath(PL_INSTALL_PLUGIN_DIR, real))
        pl_registry_add_dir(r, real);
    char *slash = strrchr(exe, '/');
    if (slash) {
        *slash = '\0';
        char d[PATH_MAX + 64];
        snprintf(d, sizeof d, "%s/../lib/pipeline/plugins", exe);
        if (realpath(d, real)) pl_registry_add_dir(r, real);
    }
    slash = strrchr(lib, '/');
    if (slash) {
        *slash = '\0';
        char d[PATH_MAX + 64];
        snprintf(d, sizeof d, "%s/pipeline/plugins", lib);
        if (realpath(d, real)) pl_registry_add_dir(r, real);
    }
    return PL_OK;
}

int pl_registry_dir_count(const pl_registry *r) { return r ? r->n_dirs : 0; }
const char *pl_registry_dir_at(const pl_registry *r, int i) {
    return (r && i >= 0 && i < r->n_dirs) ? r->dirs[i] : NULL;
}

/* "dir1:dir2:..." for messages. */
static void dirs_string(const pl_registry *r, char *buf, size_t n) {
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < r->n_dirs && off < n; i++)
        off += (size_t)snprintf(buf + off, n - off, "%s%s", i ? ":" : "", r->dirs[i]);
    if (r->n_dirs == 0) snprintf(buf, n, "(none)");
}

/* Load (once) the .so at `path`; returns the entry (desc NULL on failure).
 * `crashed` non-NULL: record the entry as failed with that message, without
 * loading it (a probe process crashed loading it). */
static loaded *load_path_ex(pl_registry *r, const char *path, const char *real,
                            const char *crashed) {
    for (int i = 0; i < r->n_loaded; i++)
        if (strcmp(r->loaded[i].real, real) == 0) return &r->loaded[i];
    if (r->n_loaded == r->cap_loaded) {
        int cap = r->cap_loaded ? r->cap_loaded * 2 : 16;
        loaded *l = realloc(r->loaded, (size_t)cap * sizeof *l);
        if (!l) {
            pl_error_set(PL_ERR_NOMEM, "plugin registry: out of memory loading %s", path);
            return NULL;
        }
        r->loaded = l;
        r->cap_loaded = cap;
    }
    loaded *L = &r->loaded[r->n_loaded];
    memset(L, 0, sizeof *L);
    L->path = xstrdup(path);
    L->real = xstrdup(real);
    const char *base = strrchr(path, '/');
    L->stem = xstrdup(base ? base + 1 : path);
    if (L->stem && strlen(L->stem) > 3 && strcmp(L->stem + strlen(L->stem) - 3, ".so") == 0)
        L->stem[strlen(L->stem) - 3] = '\0';
    if (!L->path || !L->real || !L->stem) {
        free(L->path);
        free(L->real);
        free(L->stem);
        pl_error_set(PL_ERR_NOMEM, "plugin registry: out of memory loading %s", path);
        return NULL;
    }
    r->n_loaded++;

    char msg[1024];
    bool in_entry = false; /* the entry's crash context is pushed */
    if (crashed) {
        snprintf(msg, sizeof msg, "%s", crashed);
        L->status = PL_ERR_ABI;
        pl_hint_set("remove %s from the plugin path, or rebuild it", path);
        goto fail;
    }
    dlerror();
    pl_crash_context_push("loading plugin %s (dlopen: its constructors)", path);
    L->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    pl_crash_context_pop();
    if (!L->handle) {
        const char *e = dlerror();
        unsigned other = 0;
        if (e && plugin_needs_other_core(e, &other)) {
            /* built against another ABI major: its libpipeline_core.so.N is not this one */
            snprintf(msg, sizeof msg,
                     "plugin %s was built for plugin ABI %u (it links libpipeline_core.so.%u) but "
                     "this core provides ABI %d.%d (libpipeline_core.so.%d; the major version "
                     "must match)",
                     path, other, other, PL_ABI_MAJOR, PL_ABI_MINOR, PL_CORE_SOVERSION);
            pl_hint_set("rebuild the plugin against the headers of pipeline %s, or remove %s from "
                        "the plugin path",
                        PL_VERSION_STRING, path);
        } else {
            snprintf(msg, sizeof msg, "plugin %s could not be loaded: %s", path,
                     e ? e : "dlopen failed");
            pl_hint_set("check that the file is a plugin built against this pipeline (%s) and that "
                        "its libraries are installed (ldd %s)",
                        PL_VERSION_STRING, path);
        }
        L->status = PL_ERR_ABI;
        goto fail;
    }
    dlerror();
    void *sym = dlsym(L->handle, PL_PLUGIN_ENTRY_SYMBOL);
    if (!sym) {
        snprintf(msg, sizeof msg, "plugin %s does not export the entry symbol '%s'", path,
                 PL_PLUGIN_ENTRY_SYMBOL);
        L->status = PL_ERR_ABI;
        pl_hint_set("define the plugin with PL_PLUGIN_DEFINE(...) from <pipeline/plugin.h> "
                    "(check with: nm -D %s | grep %s)",
                    path, PL_PLUGIN_ENTRY_SYMBOL);
        goto fail;
    }
    pl_plugin_entry_fn entry;
    *(void **)&entry = sym;
    /* the context stays until the descriptor has been read and checked: an
     * entry returning a bad pointer crashes in the reads below, not in it */
    pl_crash_context_push("calling %s() of plugin %s and reading its descriptor",
                          PL_PLUGIN_ENTRY_SYMBOL, path);
    in_entry = true;
    const pl_plugin_desc *d = entry();
    if (!d) {
        snprintf(msg, sizeof msg, "plugin %s: %s() returned NULL instead of a descriptor", path,
                 PL_PLUGIN_ENTRY_SYMBOL);
        L->status = PL_ERR_ABI;
        pl_hint_set("the entry function must return a pointer to a static pl_plugin_desc");
        goto fail;
    }
    if (d->abi_major != PL_ABI_MAJOR) {
        snprintf(msg, sizeof msg,
                 "plugin %s was built for plugin ABI %u.%u but this core provides ABI %d.%d "
                 "(the major version must match)",
                 path, d->abi_major, d->abi_minor, PL_ABI_MAJOR, PL_ABI_MINOR);
        L->status = PL_ERR_ABI;
        pl_hint_set("rebuild the plugin against the headers of pipeline %s, or remove %s from "
                    "the plugin path",
                    PL_VERSION_STRING, path);
        goto fail;
    }
    if (d->abi_minor > PL_ABI_MINOR) {
        snprintf(msg, sizeof msg,
                 "plugin %s needs plugin ABI %u.%u but this core provides only ABI %d.%d "
                 "(the plugin is newer than the core)",
                 path, d->abi_major, d->abi_minor, PL_ABI_MAJOR, PL_ABI_MINOR);
        L->status = PL_ERR_ABI;
        pl_hint_set("upgrade pipeline, or rebuild the plugin against the headers of pipeline %s",
                    PL_VERSION_STRING);
        goto fail;
    }
    if ((int)d->kind < 0 || d->kind >= PL_KIND_COUNT || !d->name) {
        snprintf(msg, sizeof msg, "plugin %s has an invalid descriptor (%s)", path,
                 !d->name ? "name is NULL" : "unknown kind");
        L->status = PL_ERR_ABI;
        pl_hint_set("define the plugin with PL_PLUGIN_DEFINE(...) from <pipeline/plugin.h>");
        goto fail;
    }
    {
        /* read the strings `pipeline plugins` prints, while the context names the plugin */
        volatile size_t touch = strlen(d->name) + (d->version ? strlen(d->version) : 0) +
                                (d->summary ? strlen(d->summary) : 0);
        (void)touch;
    }
    pl_crash_context_pop();
    L->desc = d;
    L->status = PL_OK;
    return L;

fail:
    if (in_entry) pl_crash_context_pop();
    L->error = xstrdup(msg);
    pl_error_set(L->status, "%s", msg);
    return L;
}

static loaded *load_path(pl_registry *r, const char *path, const char *real) {
    return load_path_ex(r, path, real, NULL);
}

static loaded *find_loaded(pl_registry *r, const char *real) {
    for (int i = 0; i < r->n_loaded; i++)
        if (strcmp(r->loaded[i].real, real) == 0) return &r->loaded[i];
    return NULL;
}

/* Load the plugin at `path` in a forked child first (pl_registry_list): a
 * .so that crashes in its constructor, its entry point or while its
 * descriptor is read kills only the child (whose crash handler, inherited,
 * reports where on stderr). True with `why` set when the child did not
 * finish cleanly; false when it did, or when no child could be made (the
 * plugin is then loaded in-process as before). */
static bool probe_crashes(pl_registry *r, const char *path, const char *real, char *why,
                          size_t n) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
        (void)load_path(r, path, real); /* the child's copy of the registry */
        _exit(0);                       /* no atexit handlers, no stdio flush */
    }
    int st = 0;
    pid_t w;
    do w = waitpid(pid, &st, 0);
    while (w < 0 && errno == EINTR);
    if (w != pid || (WIFEXITED(st) && WEXITSTATUS(st) == 0)) return false;
    if (WIFSIGNALED(st))
        snprintf(why, n, "plugin %s crashed while being loaded in a probe process (signal %d, %s; "
                 "the report above names the call); it was not loaded",
                 path, WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(why, n, "plugin %s crashed while being loaded in a probe process (it ended "
                 "with exit status %d: a crash under a sanitizer, or exit() in its code; see "
                 "above); it was not loaded", path, WEXITSTATUS(st));
    return true;
}

/* Reproduce the error of a failed entry as the thread's error. */
static pl_status replay(const loaded *L) { return pl_error_set(L->status, "%s", L->error); }

static bool regular_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* "a" or "an" before a kind name ("an optimizer", "a loader") */
static const char *article(const char *word) {
    return word[0] && strchr("aeiou", word[0]) ? "an" : "a";
}

/* For a plugin `name` not found: the nearest loadable plugin of `kind` (any
 * kind: PL_KIND_COUNT) into sug ("" when none is near, pl_suggest_name) and
 * the names of that kind into names ("adamw, sgd"). Loads every plugin of
 * the search path (pl_registry_list), so only on this error path. */
static void nearest_plugins(pl_registry *r, const char *name, pl_plugin_kind kind, char *sug,
                            size_t sn, char *names, size_t nn) {
    sug[0] = names[0] = 0;
    const pl_plugin_info *info;
    int n = pl_registry_list(r, &info);
    const char **cands = calloc((size_t)(n > 0 ? n : 1), sizeof *cands);
    if (!cands) return;
    int nc = 0;
    size_t used = 0;
    for (int i = 0; i < n; i++) {
        if (!info[i].desc || (kind != PL_KIND_COUNT && info[i].desc->kind != kind)) continue;
        if (nc && !strcmp(cands[nc - 1], info[i].name)) continue; /* same name in two dirs */
        cands[nc++] = info[i].name;
        if (used < nn) {
            int k = snprintf(names + used, nn - used, "%s%s", nc > 1 ? ", " : "", info[i].name);
            used = k < 0 ? nn : used + (size_t)k;
        }
    }
    if (used >= nn && nn > 4) snprintf(names + nn - 4, 4, "...");
    const char *best = pl_suggest_name(name, cands, nc);
    if (best) snprintf(sug, sn, "%s", best);
    free(cands);
}

pl_status pl_registry_find_for(pl_registry *r, const char *name, pl_plugin_kind kind,
                               const char *section, const char *origin,
                               const pl_plugin_desc **desc) {
    if (desc) *desc = NULL;
    if (!r) return pl_error_set(PL_ERR_INVALID, "pl_registry_find: NULL registry");
    char where[300] = "";
    if (section)
        snprintf(where, sizeof where, "%s%s[%s] plugin = %s: ", origin ? origin : "",
                 origin ? ": " : "", section, name ? name : "");
    if (!pl_plugin_name_valid(name)) {
        pl_hint_set("a plugin name is the file name of the .so without '.so' and may contain only "
                    "letters, digits, '_' and '-'; use --plugin-path DIR to add a directory");
        return pl_error_set(PL_ERR_CONFIG,
                            "%sinvalid plugin name '%s' (expected [A-Za-z0-9_-]+, never a path)",
                            where, name ? name : "(null)");
    }
    /* every distinct file NAME.so in the search path */
    char first[PATH_MAX + 80] = "", first_real[PATH_MAX] = "";
    for (int i = 0; i < r->n_dirs; i++) {
        char p[PATH_MAX + 80], real[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s.so", r->dirs[i], name);
        if (!regular_file(p) || !realpath(p, real)) continue;
        if (!first[0]) {
            snprintf(first, sizeof first, "%s", p);
            snprintf(first_real, sizeof first_real, "%s", real);
        } else if (strcmp(real, first_real) != 0) {
            pl_hint_set("remove one of the two files or drop one directory from the plugin path "
                        "(--plugin-path / PIPELINE_PLUGIN_PATH)");
            return pl_error_set(PL_ERR_CONFIG, "%splugin name '%s' is provided by two files: %s and %s",
                                where, name, first, p);
        }
    }
    if (!first[0]) {
        char dirs[2048], sug[128], names[320];
        dirs_string(r, dirs, sizeof dirs);
        nearest_plugins(r, name, kind, sug, sizeof sug, names, sizeof names);
        const char *kn = kind == PL_KIND_COUNT ? "" : pl_plugin_kind_name(kind);
        if (names[0])
            pl_hint_set("%s%s plugins here: %s (`pipeline plugins` describes them); add a "
                        "directory with --plugin-path DIR or PIPELINE_PLUGIN_PATH",
                        kn, kn[0] ? "" : "all", names);
        else
            pl_hint_set("list available plugins with `pipeline plugins`; add a directory with "
                        "--plugin-path DIR or PIPELINE_PLUGIN_PATH");
        return pl_error_set(PL_ERR_CONFIG, "%splugin '%s' not found (no %s.so in %s)%s%s%s", where,
                            name, name, dirs, sug[0] ? "; did you mean '" : "", sug,
                            sug[0] ? "'?" : "");
    }
    loaded *L = load_path(r, first, first_real);
    if (!L) return pl_error_status();
    if (!L->desc) {
        pl_status s = replay(L);
        if (section)
            pl_error_prefix(s, "%s%s[%s] plugin = %s", origin ? origin : "", origin ? ": " : "",
                            section, name);
        return s;
    }
    if (strcmp(L->desc->name, name) != 0) {
        pl_hint_set("rename the file to %s.so or fix the name in PL_PLUGIN_DEFINE", L->desc->name);
        return pl_error_set(PL_ERR_ABI, "%splugin file %s declares the name '%s', expected '%s'",
                            where, first, L->desc->name, name);
    }
    if (kind != PL_KIND_COUNT && L->desc->kind != kind) {
        const char *is = pl_plugin_kind_name(L->desc->kind), *want = pl_plugin_kind_name(kind);
        pl_hint_set("'%s' belongs in %s [%s] section; pick %s %s plugin for [%s] (see `pipeline "
                    "plugins`)",
                    name, article(is), is, article(want), want, section ? section : want);
        return pl_error_set(PL_ERR_CONFIG, "%splugin '%s' (%s) is %s %s plugin, expected %s %s plugin",
                            where, name, first, article(is), is, article(want), want);
    }
    if (desc) *desc = L->desc;
    return PL_OK;
}

pl_status pl_registry_find(pl_registry *r, const char *name, pl_plugin_kind kind,
                           const pl_plugin_desc **desc, const char **err) {
    pl_status s = pl_registry_find_for(r, name, kind, NULL, NULL, desc);
    if (err) *err = s ? pl_error_message() : NULL;
    return s;
}

const char *pl_registry_path_of(const pl_registry *r, const char *name) {
    if (!r || !name) return NULL;
    for (int i = 0; i < r->n_loaded; i++)
        if (r->loaded[i].desc && strcmp(r->loaded[i].desc->name, name) == 0) return r->loaded[i].path;
    return NULL;
}

static int cmp_info(const void *a, const void *b) {
    const pl_plugin_info *x = a, *y = b;
    return strcmp(x->name, y->name);
}

int pl_registry_list(pl_registry *r, const pl_plugin_info **out) {
    if (out) *out = NULL;
    if (!r) return 0;
    /* load every *.so of every dir (cached per real path) */
    int *order = NULL, n_order = 0, cap_order = 0;
    for (int i = 0; i < r->n_dirs; i++) {
        DIR *d = opendir(r->dirs[i]);
        if (!d) continue;
        struct dirent *e;
        char **names = NULL;
        int nn = 0, cn = 0;
        while ((e = readdir(d))) {
            size_t len = strlen(e->d_name);
            if (len < 4 || strcmp(e->d_name + len - 3, ".so") != 0) continue;
            if (nn == cn) {
                cn = cn ? cn * 2 : 16;
                char **t = realloc(names, (size_t)cn * sizeof *t);
                if (!t) break;
                names = t;
            }
            names[nn++] = xstrdup(e->d_name);
        }
        closedir(d);
        for (int k = 0; k < nn; k++) {
            char p[PATH_MAX + 300], real[PATH_MAX];
            snprintf(p, sizeof p, "%s/%s", r->dirs[i], names[k]);
            free(names[k]);
            if (!regular_file(p) || !realpath(p, real)) continue;
            /* every plugin is loaded here, wanted or not: probe each new one
             * in a child so that one crashing .so cannot take the listing down */
            loaded *L = find_loaded(r, real);
            if (!L) {
                char why[1024];
                L = load_path_ex(r, p, real,
                                 probe_crashes(r, p, real, why, sizeof why) ? why : NULL);
            }
            if (!L) continue;
            int idx = (int)(L - r->loaded);
            bool seen = false;
            for (int j = 0; j < n_order; j++) seen |= order[j] == idx;
            if (seen) continue;
            if (n_order == cap_order) {
                cap_order = cap_order ? cap_order * 2 : 32;
                int *t = realloc(order, (size_t)cap_order * sizeof *t);
                if (!t) break;
                order = t;
            }
            order[n_order++] = idx;
        }
        free(names);
    }
    free(r->info);
    r->info = calloc((size_t)(n_order ? n_order : 1), sizeof *r->info);
    if (!r->info) {
        free(order);
        pl_error_set(PL_ERR_NOMEM, "pl_registry_list: out of memory");
        return -1;
    }
    for (int j = 0; j < n_order; j++) {
        loaded *L = &r->loaded[order[j]];
        if (L->desc && strcmp(L->desc->name, L->stem) != 0 && !L->error) {
            char msg[1024];
            snprintf(msg, sizeof msg, "plugin file %s declares the name '%s', expected '%s'",
                     L->path, L->desc->name, L->stem);
            L->error = xstrdup(msg);
        }
        bool refused = !L->desc || L->error;
        r->info[j].name = L->stem;
        r->info[j].path = L->path;
        r->info[j].desc = refused ? NULL : L->desc;
        r->info[j].error = refused ? L->error : NULL;
    }
    r->n_info = n_order;
    free(order);
    /* stable insertion sort by name: equal names keep search order */
    for (int i = 1; i < r->n_info; i++) {
        pl_plugin_info x = r->info[i];
        int j = i - 1;
        while (j >= 0 && cmp_info(&r->info[j], &x) > 0) {
            r->info[j + 1] = r->info[j];
            j--;
        }
        r->info[j + 1] = x;
    }
    /* one name from two different files: pl_registry_find_for refuses that
     * name, so neither is listed as usable */
    for (int i = 0; i < r->n_info;) {
        int j = i + 1;
        while (j < r->n_info && !strcmp(r->info[j].name, r->info[i].name)) j++;
        if (j - i > 1)
            for (int k = i; k < j; k++) {
                loaded *L = NULL;
                for (int m = 0; m < r->n_loaded && !L; m++)
                    if (r->loaded[m].path == r->info[k].path) L = &r->loaded[m];
                if (!L) continue;
                if (!L->dup_error) {
                    char msg[2 * PATH_MAX + 256];
                    snprintf(msg, sizeof msg,
                             "plugin name '%s' is provided by two files: %s and %s; a config "
                             "naming '%s' is refused (remove one file or one directory from "
                             "the plugin path)",
                             r->info[i].name, r->info[i].path, r->info[i + 1].path,
                             r->info[i].name);
                    L->dup_error = xstrdup(msg);
                }
                if (!r->info[k].error) r->info[k].error = L->dup_error;
                r->info[k].desc = NULL;
            }
        i = j;
    }
    pl_error_clear();
    if (out) *out = r->info;
    return r->n_info;
}
