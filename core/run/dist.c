/* dist.c - data-parallel training: the trainer's side of the strategy stage.
 *
 * What a data-parallel run does (PyTorch DistributedDataParallel and
 * Horovod semantics, which users know):
 *  - every process runs the same config with the same seed, so every rank
 *    builds the same model and the same batch order; the ranks' initial
 *    trainable parameters are compared (DDP broadcasts them from rank 0: we
 *    check instead, since a model whose initialization is not a pure
 *    function of the seed is a bug worth naming);
 *  - each rank takes its shard of every epoch: a loader that shards itself
 *    (pl_loader_vtable.shard: its part of every batch) or, by default, the
 *    batches r, r + N, r + 2N, ... of the single-process order
 *    (DistributedSampler interleaves samples; we interleave batches, which
 *    is the same thing for a loader whose order is a permutation of samples
 *    cut into batches). `batch_size` is per rank, as in Lightning: the global
 *    batch is batch_size x world_size x accumulate_grad_batches;
 *  - each training loss is averaged over ranks, weighted by the terms each
 *    rank's loss averages, before the non-finite check, so every rank takes
 *    the same decision (stop, or skip the step); the same all-reduce gives
 *    each rank its share of the global batch, which scales its backward, and
 *    tells every rank whether one has seen a signal;
 *  - at each optimizer step the (share-scaled) gradients are summed over
 *    ranks: the global batch's gradient (DDP averages the ranks' means, the
 *    same thing when the shares are equal), before clipping, the precision
 *    stage's unscale and inf check, and the step, so every rank steps its
 *    optimizer identically;
 *  - validation and test metrics are (sum, count) pairs summed over ranks,
 *    so they are the metrics of the whole split, and every rank takes the
 *    same early-stopping and checkpoint decisions;
 *  - only rank 0 writes the run directory;
 *  - every rank must run the same resolved configuration on the same data:
 *    checked at start (tr_dist_check_config), since a rank with another `lr`
 *    or another data file of the same shape trains on, silently diverging.
 */
#include "trainer_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config_internal.h"

static pl_status tr_dist_check_config(trainer *t);

/* processes a launcher started, from its environment (Open MPI, MPICH /
 * Intel MPI / Slurm's PMI); 1 when none says more */
static int launcher_world_size(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1) return atoi(v);
    }
    return 1;
}

int pl_launcher_rank(void) {
    static const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) return atoi(v);
    }
    return 0;
}

pl_status tr_dist_create(trainer *t) {
    t->rank = 0;
    t->world = 1;
    t->stride = 1;
    pl_status st = tr_stage_create(t, &t->strat, "strategy");
    if (st) return st;
    if (!t->strat.self && launcher_world_size() > 1) {
        /* mpirun -np N pipeline run X.ini with no [strategy]: the one strategy
         * plugin found, by kind (the core knows no strategy by name) */
        const pl_plugin_desc *d = NULL;
        const pl_plugin_info *info = NULL;
        int n = pl_registry_list(t->reg, &info), found = 0;
        char names[256] = "";
        for (int i = 0; i < n; i++)
            if (info[i].desc && info[i].desc->kind == PL_KIND_STRATEGY) {
                if (!found++) d = info[i].desc;
                size_t l = strlen(names);
                snprintf(names + l, sizeof names - l, "%s%s", l ? ", " : "", info[i].name);
            }
        pl_error_clear();
        if (found != 1) {
            if (!found)
                pl_hint_set("build with Open MPI (libopenmpi-dev) so the ddp plugin exists, or "
                            "run one process");
            else
                pl_hint_set("name one in [strategy] plugin = ...");
            return pl_error_set(PL_ERR_CONFIG,
                                "started as one of %d processes (mpirun) with no [strategy] "
                                "section, and %s strategy plugin%s found%s%s",
                                launcher_world_size(), found ? "more than one" : "no",
                                found ? "s were" : " was", found ? ": " : "", names);
        }
        st = pl_registry_find(t->reg, d->name, PL_KIND_STRATEGY, &d, NULL); /* its path */
        if (st) return st;
        t->strat.section = "strategy";
        t->strat.desc = d;
        t->strat.vt = d->vtable;
        st = pl_stage_fns_of(d, NULL, &t->strat.fns);
        if (!st) st = t->strat.fns.create(NULL, &t->ctx, &t->strat.self);
        if (st) return pl_error_prefix(st, "strategy '%s' (chosen because mpirun started %d "
                                       "processes)", d->name, launcher_world_size());
    }
    if (!t->strat.self) return PL_OK;
    t->rank = STRAT(t)->rank(t->strat.self);
    t->world = STRAT(t)->world_size(t->strat.self);
    if (t->world < 1 || t->rank < 0 || t->rank >= t->world)
        return pl_error_set(PL_ERR_INVALID, "strategy '%s': rank %d of world size %d",
                            t->strat.desc->name, t->rank, t->world);
    /* before anything is made or read: every rank fails here together (no
     * run directory, no hang), naming the first key that differs */
    return tr_dist_check_config(t);
}

pl_status tr_dist_shard(trainer *t) {
    t->stride = 1;
    if (t->world <= 1) return PL_OK;
    const pl_plugin_desc *ld = t->loader.desc;
    if (ld->abi_minor >= 5 && LOADER(t)->shard) {
        pl_status st = LOADER(t)->shard(t->loader.self, t->rank, t->world);
        if (!st) {
            tr_log(t, "ddp: loader %s serves each of %d processes its part of every batch\n",
                   ld->name, t->world);
            return PL_OK;
        }
        if (st != PL_ERR_UNSUPPORTED)
            return pl_error_prefix(st, "[data] plugin '%s': sharding over %d ranks", ld->name,
                                   t->world);
        pl_error_clear(); /* this configuration of the loader declines: stride */
    }
    t->stride = t->world;
    return PL_OK;
}

pl_status tr_dist_share_run_dir(trainer *t) {
    if (t->world <= 1) return PL_OK;
    pl_status st = STRAT(t)->broadcast_bytes(t->strat.self, t->run_dir, sizeof t->run_dir, 0);
    if (st) return pl_error_prefix(st, "sharing the run directory");
    t->run_dir[sizeof t->run_dir - 1] = 0;
    snprintf(t->last_path, sizeof t->last_path, "%s/checkpoints/last.safetensors", t->run_dir);
    t->ctx.run_dir = t->run_dir;
    return PL_OK;
}

/* FNV-1a over a host tensor's bytes (contiguous parameters) */
static uint64_t fnv1a(const void *p, size_t n, uint64_t h) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

#define FNV_BASIS 1469598103934665603ull

/* ---- the ranks' configurations ------------------------------------------------------------
 * Each rank describes its resolved configuration as lines
 *   section US key US canonical US value US origin RS
 * (US = 0x1f, RS = 0x1e: INI values hold neither), hashes the first three
 * fields of every line, and the ranks compare hashes with rank 0's. On a
 * mismatch, the lowest differing rank and rank 0 broadcast their lines and
 * every rank names the first line that differs, so all of them fail at once
 * with the same message (tr_dist_create's caller then ends each process:
 * no run directory is made, no rank waits for another).
 *
 * canonical is the value, except where the value names, from the working
 * directory (as the loaders open it), an existing regular file: then the
 * file's identity "file SIZE FINGERPRINT", so the same data under another
 * path (another mount on another node) agrees and another file under the
 * same path does not. The fingerprint is FNV-1a over the size and 16 blocks
 * of 64 KiB (the first, the last, 14 evenly spaced; the whole file up to
 * 1 MiB): content, not the modification time, which a copy to another node
 * changes. A change confined to bytes outside those blocks of a file larger
 * than 1 MiB is not seen. A value naming a folder (a Hugging Face backbone)
 * takes the identities of its .safetensors, .json and .h5 files, by name.
 * Only regular files are opened (stat first, then O_NONBLOCK).
 *
 * Keys that may differ between ranks (not compared): [pipeline] run_dir and
 * name (rank 0 makes the run directory and shares it), threads and verbose
 * (how a process runs, not what it computes), and the index of [pipeline]
 * device (cuda:N per rank; the device type is compared). */
#define FP_BLOCK 65536
#define FP_BLOCKS 16
#define US "\x1f"
#define RS '\x1e'

typedef struct sbuf_t {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf_t;

static void sb_add(sbuf_t *b, const char *text, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *ns = realloc(b->s, cap);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap = cap;
    }
    /* the separators cannot come from a value: a raw 0x1e / 0x1f byte in an
     * INI value becomes '?' here (both ranks alike) */
    for (size_t i = 0; i < n; i++) {
        char c = text[i];
        b->s[b->n + i] = c == US[0] || c == RS ? '?' : c;
    }
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_sep(sbuf_t *b, char c) {
    sb_add(b, "", 0); /* capacity for one more byte: sb_add keeps one spare */
    if (b->oom) return;
    if (b->n + 2 > b->cap) {
        char *ns = realloc(b->s, b->cap * 2);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns;
        b->cap *= 2;
    }
    b->s[b->n++] = c;
    b->s[b->n] = 0;
}

static void sb_str(sbuf_t *b, const char *text) { sb_add(b, text, strlen(text)); }

/* Size and fingerprint of regular file `path`; false when it is not one or
 * cannot be read (the value is then compared as text). */
static bool file_identity(const char *path, uint64_t *size, uint64_t *fp) {
    struct stat st;
    if (stat(path, &st) || !S_ISREG(st.st_mode)) return false;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st2;
    if (fstat(fd, &st2) || !S_ISREG(st2.st_mode)) {
        close(fd);
        return false;
    }
    uint64_t n = (uint64_t)st2.st_size, h = fnv1a(&n, sizeof n, FNV_BASIS);
    unsigned char *buf = malloc(FP_BLOCK);
    bool ok = buf != NULL;
    uint64_t blocks = (n + FP_BLOCK - 1) / FP_BLOCK;
    for (uint64_t k = 0; ok && k < blocks && k < FP_BLOCKS; k++) {
        /* block index: all of them for a small file, else spread from first to last */
        uint64_t b = blocks <= FP_BLOCKS ? k : k * (blocks - 1) / (FP_BLOCKS - 1);
        off_t off = (off_t)(b * FP_BLOCK);
        size_t want = (size_t)(n - (uint64_t)off < FP_BLOCK ? n - (uint64_t)off : FP_BLOCK);
        size_t got = 0;
        while (got < want) {
            ssize_t r = pread(fd, buf + got, want - got, off + (off_t)got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
        }
        ok = got == want;
        h = fnv1a(buf, got, h);
    }
    free(buf);
    close(fd);
    *size = n;
    *fp = h;
    return ok;
}

static bool identity_file_name(const char *n) {
    static const char *ext[] = {".safetensors", ".json", ".h5", ".hdf5"};
    size_t l = strlen(n);
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        size_t e = strlen(ext[i]);
        if (l > e && !strcmp(n + l - e, ext[i])) return true;
    }
    return false;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The canonical form of `value` into b: a file's or a folder's identity, or
 * the value itself. */
static void canonical_value(sbuf_t *b, const char *value) {
    char line[128];
    uint64_t size, fp;
    struct stat st;
    if (!*value || stat(value, &st)) {
        sb_str(b, value);
        return;
    }
    if (S_ISREG(st.st_mode) && file_identity(value, &size, &fp)) {
        snprintf(line, sizeof line, "file %llu bytes %016llx", (unsigned long long)size,
                 (unsigned long long)fp);
        sb_str(b, line);
        return;
    }
    DIR *d = S_ISDIR(st.st_mode) ? opendir(value) : NULL;
    if (!d) {
        sb_str(b, value);
        return;
    }
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        if (!identity_file_name(e->d_name)) continue;
        if (n == cap) {
            char **nn = realloc(names, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *nn);
            if (!nn) break;
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) break;
        n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_names);
    sb_str(b, "folder");
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", value, names[i]);
        if (file_identity(path, &size, &fp)) {
            snprintf(line, sizeof line, " %llu bytes %016llx", (unsigned long long)size,
                     (unsigned long long)fp);
            sb_str(b, " ");
            sb_str(b, names[i]);
            sb_str(b, line);
        }
        free(names[i]);
    }
    free(names);
}

/* May differ between ranks (see above); *device_type: compare only up to ':' */
static bool per_rank_key(const char *sec, const char *key, bool *device_type) {
    *device_type = false;
    if (strcmp(sec, "pipeline")) return false;
    if (!strcmp(key, "device")) {
        *device_type = true;
        return false;
    }
    return !strcmp(key, "run_dir") || !strcmp(key, "name") || !strcmp(key, "threads") ||
           !strcmp(key, "verbose");
}

static char *config_lines(const pl_config *cfg) {
    sbuf_t b = {0};
    for (int i = 0; i < pl_config_section_count(cfg); i++) {
        const pl_config_section *s = pl_config_section_at(cfg, i);
        const char *sec = pl_cfg_section_name(s);
        for (int j = 0; j < pl_cfg_count(s); j++) {
            const char *key = pl_cfg_key_at(s, j), *value = pl_cfg_value_at(s, j);
            bool dev;
            if (per_rank_key(sec, key, &dev)) continue;
            const char *origin = pl_cfg_origin(s, key);
            sb_str(&b, sec);
            sb_sep(&b, US[0]);
            sb_str(&b, key);
            sb_sep(&b, US[0]);
            if (dev)
                sb_add(&b, value, strcspn(value, ":"));
            else
                canonical_value(&b, value);
            sb_sep(&b, US[0]);
            sb_str(&b, value);
            sb_sep(&b, US[0]);
            sb_str(&b, origin ? origin : "");
            sb_sep(&b, RS);
        }
    }
    if (b.oom || !b.s) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* Field k (0..4) of the line at l: pointer and length (the line's end when
 * it has fewer fields). */
static const char *field(const char *l, int k, int *len) {
    for (int i = 0; i < k; i++) {
        size_t n = strcspn(l, US "\x1e");
        if (l[n] != US[0]) {
            l += n;
            break;
        }
        l += n + 1;
    }
    *len = (int)strcspn(l, US "\x1e");
    return l;
}

/* Hash of the compared part (section, key, canonical) of every line. */
static uint64_t config_lines_hash(const char *text) {
    uint64_t h = FNV_BASIS;
    for (const char *l = text; *l;) {
        int len;
        const char *f = field(l, 3, &len), *end = strchr(l, RS);
        h = fnv1a(l, (size_t)(f - l), h);
        if (!end) break;
        l = end + 1;
    }
    return h;
}


/* One side of a difference: "[sec] key = value (origin)" or a file's. */
static void describe(char *buf, size_t n, const char *l) {
    int sl, kl, cl, vl, ol;
    const char *sec = field(l, 0, &sl), *key = field(l, 1, &kl), *can = field(l, 2, &cl),
               *val = field(l, 3, &vl), *org = field(l, 4, &ol);
    bool file = (cl > 5 && !strncmp(can, "file ", 5)) || (cl >= 6 && !strncmp(can, "folder", 6));
    snprintf(buf, n, "[%.*s] %.*s = %.*s (%.*s%s%.*s)", sl, sec, kl, key, vl, val, ol, org,
             file ? "; " : "", file ? cl : 0, can);
}

/* The first line where text a (rank 0's) and text b (rank r's) differ. */
static pl_status config_difference(const char *a, const char *b, int r, int n_diff) {
    const char *la = a, *lb = b;
    while (*la && *lb) {
        int fa, fb;
        const char *ea = field(la, 3, &fa), *eb = field(lb, 3, &fb);
        if (ea - la != eb - lb || memcmp(la, lb, (size_t)(ea - la))) break;
        const char *na = strchr(la, RS), *nb = strchr(lb, RS);
        la = na ? na + 1 : la + strlen(la);
        lb = nb ? nb + 1 : lb + strlen(lb);
    }
    char da[2048] = "no further key", db[2048] = "no further key";
    if (*la) describe(da, sizeof da, la);
    if (*lb) describe(db, sizeof db, lb);
    char others[64] = "";
    if (n_diff > 1) snprintf(others, sizeof others, " (and %d other rank(s))", n_diff - 1);
    pl_hint_set("run every rank with the same INI and overrides, on the same data (a copy of a "
                "file agrees wherever it lies); only [pipeline] run_dir, name, threads, verbose "
                "and the device index may differ");
    return pl_error_set(PL_ERR_CONFIG,
                        "ddp: rank %d%s runs another configuration than rank 0: the first "
                        "difference is %s on rank %d, %s on rank 0",
                        r, others, db, r, da);
}

/* Rank `root`'s text to every rank (its length first); *out owned by the caller. */
static pl_status share_text(trainer *t, const char *mine, int root, char **out) {
    uint64_t len = t->rank == root ? strlen(mine) : 0;
    pl_status st = STRAT(t)->broadcast_bytes(t->strat.self, &len, sizeof len, root);
    if (st) return st;
    char *buf = malloc(len + 1);
    if (!buf) return pl_error_set(PL_ERR_NOMEM, "ddp: %llu bytes of configuration",
                                  (unsigned long long)len);
    if (t->rank == root) memcpy(buf, mine, len);
    st = STRAT(t)->broadcast_bytes(t->strat.self, buf, len, root);
    buf[len] = 0;
    if (st) {
        free(buf);
        return st;
    }
    *out = buf;
    return PL_OK;
}

static pl_status tr_dist_check_config(trainer *t) {
    if (t->world <= 1) return PL_OK;
    char *mine = config_lines(t->cfg);
    /* out of memory on one rank: it still takes part (with hash 0), so none waits */
    uint64_t h = mine ? config_lines_hash(mine) : 0, h0 = h;
    pl_status st = STRAT(t)->broadcast_bytes(t->strat.self, &h0, sizeof h0, 0);
    double *v = st ? NULL : calloc((size_t)t->world, sizeof *v);
    if (!st && !v) st = pl_error_set(PL_ERR_NOMEM, "ddp: configuration check");
    if (!st) {
        v[t->rank] = h != h0 || !mine;
        st = STRAT(t)->all_reduce_f64(t->strat.self, v, t->world);
    }
    int r = -1, n_diff = 0;
    for (int i = 0; !st && i < t->world; i++)
        if (v[i] > 0) {
            if (r < 0) r = i;
            n_diff++;
        }
    free(v);
    if (st || r < 0) {
        free(mine);
        return st ? pl_error_prefix(st, "ddp: comparing the ranks' configurations") : PL_OK;
    }
    char *a = NULL, *b = NULL;
    st = share_text(t, mine ? mine : "", 0, &a);
    if (!st) st = share_text(t, mine ? mine : "", r, &b);
    free(mine);
    if (!st) st = config_difference(a, b, r, n_diff);
    else st = pl_error_prefix(st, "ddp: comparing the ranks' configurations");
    free(a);
    free(b);
    return st;
}

pl_status tr_dist_check_params(trainer *t) {
    if (t->world <= 1) return PL_OK;
    int n = pl_params_count(t->ctx.params);
    uint64_t *mine = calloc((size_t)n + 1, sizeof *mine), *root = calloc((size_t)n + 1, sizeof *root);
    if (!mine || !root) {
        free(mine);
        free(root);
        return pl_error_set(PL_ERR_NOMEM, "ddp: parameter hashes");
    }
    for (int i = 0; i < n; i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        if (!p->t->requires_grad) continue;
        pl_frame_begin();
        pl_tensor *h = p->t;
        if (h->device.type != PL_DEVICE_CPU || !pl_tensor_is_contiguous(h))
            h = pl_tensor_to(p->t, p->t->dtype, PL_CPU);
        if (h) mine[i] = fnv1a(pl_tensor_data(h), pl_tensor_nbytes(h), 1469598103934665603ull);
        pl_frame_end();
        if (!h) {
            free(mine);
            free(root);
            return pl_error_prefix(pl_error_status(), "ddp: reading parameter %s", p->name);
        }
    }
    memcpy(root, mine, (size_t)n * sizeof *mine);
    root[n] = (uint64_t)n;
    pl_status st = STRAT(t)->broadcast_bytes(t->strat.self, root, ((size_t)n + 1) * sizeof *root, 0);
    if (!st && root[n] != (uint64_t)n)
        st = pl_error_set(PL_ERR_CONFIG, "ddp: rank %d has %d parameters, rank 0 has %llu", t->rank,
                          n, (unsigned long long)root[n]);
    for (int i = 0; i < n && !st; i++)
        if (root[i] != mine[i])
            st = pl_error_set(PL_ERR_CONFIG, "ddp: rank %d's initial value of trainable parameter "
                              "'%s' differs from rank 0's: every rank must start from the same "
                              "weights (same seed, same init_from / resume checkpoint)", t->rank,
                              pl_params_at(t->ctx.params, i)->name);
    free(mine);
    free(root);
    /* every rank learns whether one failed: a lone failure would leave the
     * others waiting in the first all-reduce */
    double bad = st ? 1 : 0;
    pl_status st2 = STRAT(t)->all_reduce_f64(t->strat.self, &bad, 1);
    if (st) return st;
    if (st2) return st2;
    if (bad > 0)
        return pl_error_set(PL_ERR_CONFIG, "ddp: another rank's initial parameters differ from "
                            "rank 0's (see its message)");
    return PL_OK;
}

pl_status tr_dist_reduce_grads(trainer *t) {
    if (t->world <= 1) return PL_OK;
    int n = pl_params_count(t->ctx.params);
    if (t->dist_grads_cap < n + 1) { /* once: the parameter list does not change in a fit */
        pl_tensor **g = realloc(t->dist_grads, ((size_t)n + 1) * sizeof *g);
        if (!g) return pl_error_set(PL_ERR_NOMEM, "ddp: gradient list");
        t->dist_grads = g;
        t->dist_grads_cap = n + 1;
    }
    pl_tensor **gs = t->dist_grads;
    int k = 0;
    pl_status st = PL_OK;
    for (int i = 0; i < n && !st; i++) {
        pl_param *p = pl_params_at(t->ctx.params, i);
        if (!p->t->requires_grad) continue;
        if (!p->t->grad) {
            /* unused by this rank's batch (a gated branch): it adds zeros, as in DDP with
             * find_unused_parameters */
            p->t->grad = pl_tensor_zeros_owned(p->t->dtype, p->t->ndim, p->t->shape, p->t->device);
            if (!p->t->grad) {
                st = pl_error_prefix(pl_error_status(), "ddp: zero gradient of %s", p->name);
                break;
            }
        }
        if (p->t->grad->dtype != PL_F32)
            st = pl_error_set(PL_ERR_UNSUPPORTED, "ddp: the gradient of %s is %s; data-parallel "
                              "training all-reduces f32 gradients (use precision fp32, bf16-mixed "
                              "or fp16-mixed, whose master weights are f32)", p->name,
                              pl_dtype_name(p->t->grad->dtype));
        gs[k++] = p->t->grad;
    }
    if (!st && k) st = STRAT(t)->all_reduce_sum(t->strat.self, gs, k);
    if (st) return pl_error_prefix(st, "ddp: summing gradients at step %lld", (long long)t->step);
    return PL_OK;
}

pl_status tr_dist_loss(trainer *t, double *lv, const pl_metrics *m, int64_t size, double *share,
                       int signal, int *any_signal) {
    *share = 1.0;
    *any_signal = signal;
    if (t->world <= 1) return PL_OK;
    double w = (double)size;
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->name[i], "loss") && m->count[i] > 0) w = m->count[i];
    /* sum of weighted losses, total weight, and the signals (max via the sum's sign:
     * every signal number is positive, so any rank's makes it non-zero) */
    double v[3] = {*lv * w, w, (double)signal};
    pl_status st = STRAT(t)->all_reduce_f64(t->strat.self, v, 3);
    if (st) return pl_error_prefix(st, "ddp: the training loss at step %lld", (long long)t->step);
    *any_signal = v[2] > 0 ? (signal ? signal : SIGTERM) : 0;
    if (!(v[1] > 0)) { /* nothing to weight by: the plain mean */
        *lv = v[0];
        *share = 1.0 / t->world;
        return PL_OK;
    }
    *lv = v[0] / v[1];
    *share = w / v[1];
    return PL_OK;
}

pl_status tr_dist_reduce_metrics(trainer *t, pl_metrics *m) {
    if (t->world <= 1) return PL_OK;
    /* rank 0 has served batch 0 of every split, so its names are all there are; the
     * others line theirs up with rank 0's */
    char names[PL_METRICS_MAX][48];
    int n = m->n;
    memset(names, 0, sizeof names);
    for (int i = 0; i < m->n; i++) memcpy(names[i], m->name[i], sizeof names[i]);
    pl_status st = STRAT(t)->broadcast_bytes(t->strat.self, names, sizeof names, 0);
    double cnt = n;
    if (!st) st = STRAT(t)->broadcast_bytes(t->strat.self, &cnt, sizeof cnt, 0);
    if (st) return pl_error_prefix(st, "ddp: reducing metrics");
    int n0 = (int)cnt;
    double v[2 * PL_METRICS_MAX] = {0};
    int missing = -1;
    for (int i = 0; i < m->n; i++) {
        int j = 0;
        while (j < n0 && strncmp(names[j], m->name[i], sizeof names[j])) j++;
        if (j == n0) {
            missing = i;
            continue;
        }
        v[2 * j] = m->sum[i];
        v[2 * j + 1] = m->count[i];
    }
    st = STRAT(t)->all_reduce_f64(t->strat.self, v, 2 * (int64_t)n0);
    if (st) return pl_error_prefix(st, "ddp: reducing metrics");
    if (missing >= 0)
        return pl_error_set(PL_ERR_INVALID, "ddp: rank %d reports metric '%s', which rank 0 does "
                            "not", t->rank, m->name[missing]);
    unsigned char kind[PL_METRICS_MAX];
    memcpy(kind, m->kind, sizeof kind); /* rank 0's, in the order of its names */
    st = STRAT(t)->broadcast_bytes(t->strat.self, kind, sizeof kind, 0);
    if (st) return pl_error_prefix(st, "ddp: reducing metrics");
    pl_metrics_reset(m);
    for (int j = 0; j < n0; j++) {
        names[j][sizeof names[j] - 1] = 0;
        pl_metrics_add(m, names[j], v[2 * j], v[2 * j + 1]);
        m->kind[j] = kind[j];
    }
    return PL_OK;
}

pl_status tr_dist_barrier(trainer *t) {
    if (t->world <= 1) return PL_OK;
    return STRAT(t)->barrier(t->strat.self);
}

void tr_dist_abort(trainer *t, int code) {
    if (t->world <= 1 || !t->strat.self) return;
    fflush(stdout);
    fflush(stderr);
    STRAT(t)->abort(t->strat.self, code);
}

int tr_next_batch(trainer *t, pl_batch *b) {
    const pl_loader_vtable *L = LOADER(t);
    if (t->stride > 1) {
        int skip = t->pass_start ? t->rank : t->stride - 1;
        for (int i = 0; i < skip; i++) {
            int r = L->next(t->loader.self, b);
            if (r <= 0) {
                t->pass_start = false;
                return r;
            }
        }
    }
    t->pass_start = false;
    return L->next(t->loader.self, b);
}
