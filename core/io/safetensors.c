/* safetensors.c - safetensors reader (mmap, fully bounds-checked) and an
 * atomic writer (temp file + fsync + rename + directory fsync).
 *
 * Format: https://huggingface.co/docs/safetensors - u64 little-endian header
 * length N, N bytes of JSON, then the data section. Offsets in the JSON are
 * relative to the start of the data section.
 *
 * Writer notes:
 *   - tensors are laid out in the order they were added, back to back;
 *   - the JSON header is padded with spaces to a multiple of 8 bytes, as the
 *     reference (Rust) implementation does, so the data section is aligned;
 *   - tensors on a non-CPU device, and strided views, are copied to a
 *     contiguous host tensor one at a time during commit;
 *   - nf4 tensors are written as dtype U8 with shape [ceil(numel/2)] (the
 *     packed codes, low nibble first). Their quantization state is NOT
 *     written: the caller stores absmax etc. as sibling tensors (see
 *     plugins/precision/qlora4). pl_st_load_into() accepts such a U8 entry
 *     for an nf4 destination with the same numel and copies the codes back.
 *
 * Reader notes:
 *   - the file is mmap'ed MAP_PRIVATE with PROT_READ | PROT_WRITE: a write
 *     through a view (pl_st_view) is copy-on-write into this process and
 *     never reaches the file; every entry is validated at open time
 *     (dtype, shape, offsets inside the data section, byte count equal to
 *     numel * dtype size, no two non-empty tensors overlapping), so later
 *     loads never read out of bounds;
 *   - pl_st_name_at() follows the order of the JSON header;
 *   - pl_st_load() returns a tensor owned by the caller (not adopted by an
 *     open autograd frame);
 *   - the mapping is reference counted (st_map): the file holds one
 *     reference and every view from pl_st_view() one more, so views outlive
 *     pl_st_close(). A view's release drops the pages it covers
 *     (madvise(MADV_DONTNEED) on the whole pages inside its byte range) and
 *     its reference; the last reference unmaps the file.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"
#include "pipeline/file.h"
#include "crash.h"

#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* refuse headers above 100 MB */
#define ST_MAX_INT 9007199254740992.0               /* 2^53: exact in a JSON double */

/* ---- dtype names ------------------------------------------------------- */

static const char *st_dtype_name(pl_dtype dt) {
    switch (dt) {
    case PL_F32: return "F32";
    case PL_BF16: return "BF16";
    case PL_F16: return "F16";
    case PL_F64: return "F64";
    case PL_I32: return "I32";
    case PL_I64: return "I64";
    case PL_U8: return "U8";
    case PL_NF4: return "U8"; /* packed codes */
    default: return NULL;
    }
}

static int st_dtype_parse(const char *s, pl_dtype *out) {
    static const struct {
        const char *name;
        pl_dtype dt;
    } map[] = {{"F32", PL_F32}, {"BF16", PL_BF16}, {"F16", PL_F16}, {"F64", PL_F64},
               {"I32", PL_I32}, {"I64", PL_I64},   {"U8", PL_U8}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(s, map[i].name)) {
            *out = map[i].dt;
            return 0;
        }
    return -1;
}

static void shape_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* ======================================================================= */
/* writer                                                                  */
/* ======================================================================= */

typedef struct st_wentry {
    char *name;
    pl_tensor *t; /* retained */
} st_wentry;

struct pl_st_writer {
    char *path;
    st_wentry *ents;
    int n, cap;
    char **meta_k, **meta_v;
    int n_meta, cap_meta;
    int committed;
};

pl_st_writer *pl_st_writer_new(const char *path) {
    if (!path || !*path) {
        pl_error_set(PL_ERR_INVALID, "safetensors writer: empty path");
        return NULL;
    }
    pl_st_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->path = strdup(path))) {
        free(w);
        pl_error_set(PL_ERR_NOMEM, "%s: out of memory (safetensors writer)", path);
        return NULL;
    }
    return w;
}

pl_status pl_st_writer_add(pl_st_writer *w, const char *name, pl_tensor *t) {
    if (!w || !name || !t)
        return pl_error_set(PL_ERR_INVALID, "safetensors add: NULL %s",
                            !w ? "writer" : !name ? "name" : "tensor");
    if (w->committed)
        return pl_error_set(PL_ERR_INVALID, "%s: add '%s' after commit", w->path, name);
    if (!*name || !strcmp(name, "__metadata__"))
        return pl_error_set(PL_ERR_INVALID, "%s: invalid tensor name '%s'", w->path, name);
    if (!st_dtype_name(t->dtype))
        return pl_error_set(PL_ERR_DTYPE, "%s: tensor '%s' has dtype %s, which safetensors "
                            "cannot store", w->path, name, pl_dtype_name(t->dtype));
    if (t->dtype == PL_NF4 && (!pl_tensor_is_contiguous(t) || (t->offset & 1)))
        return pl_error_set(PL_ERR_INVALID, "%s: nf4 tensor '%s' must be contiguous and start on "
                            "a byte boundary", w->path, name);
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->ents[i].name, name))
            return pl_error_set(PL_ERR_INVALID, "%s: tensor '%s' added twice", w->path, name);
    if (w->n == w->cap) {
        int nc = w->cap ? 2 * w->cap : 16;
        st_wentry *e = realloc(w->ents, (size_t)nc * sizeof *e);
        if (!e) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory adding '%s'", w->path, name);
        w->ents = e;
        w->cap = nc;
    }
    char *nm = strdup(name);
    if (!nm) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory adding '%s'", w->path, name);
    w->ents[w->n].name = nm;
    w->ents[w->n].t = pl_tensor_retain(t);
    w->n++;
    return PL_OK;
}

pl_status pl_st_writer_meta(pl_st_writer *w, const char *key, const char *value) {
    if (!w || !key || !value)
        return pl_error_set(PL_ERR_INVALID, "safetensors meta: NULL %s",
                            !w ? "writer" : !key ? "key" : "value");
    if (w->committed)
        return pl_error_set(PL_ERR_INVALID, "%s: metadata '%s' after commit", w->path, key);
    for (int i = 0; i < w->n_meta; i++)
        if (!strcmp(w->meta_k[i], key)) { /* last value wins */
            char *v = strdup(value);
            if (!v) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory (metadata)", w->path);
            free(w->meta_v[i]);
            w->meta_v[i] = v;
            return PL_OK;
        }
    if (w->n_meta == w->cap_meta) {
        int nc = w->cap_meta ? 2 * w->cap_meta : 8;
        char **k = realloc(w->meta_k, (size_t)nc * sizeof *k);
        if (!k) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory (metadata)", w->path);
        w->meta_k = k;
        char **v = realloc(w->meta_v, (size_t)nc * sizeof *v);
        if (!v) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory (metadata)", w->path);
        w->meta_v = v;
        w->cap_meta = nc;
    }
    char *k = strdup(key), *v = strdup(value);
    if (!k || !v) {
        free(k);
        free(v);
        return pl_error_set(PL_ERR_NOMEM, "%s: out of memory (metadata)", w->path);
    }
    w->meta_k[w->n_meta] = k;
    w->meta_v[w->n_meta] = v;
    w->n_meta++;
    return PL_OK;
}

void pl_st_writer_free(pl_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->ents[i].name);
        pl_tensor_release(w->ents[i].t);
    }
    for (int i = 0; i < w->n_meta; i++) {
        free(w->meta_k[i]);
        free(w->meta_v[i]);
    }
    free(w->ents);
    free(w->meta_k);
    free(w->meta_v);
    free(w->path);
    free(w);
}

/* Shape as written: nf4 -> [ceil(numel/2)]. */
static int entry_shape(const pl_tensor *t, int64_t *shape) {
    if (t->dtype == PL_NF4) {
        shape[0] = (int64_t)pl_tensor_nbytes(t);
        return 1;
    }
    for (int i = 0; i < t->ndim; i++) shape[i] = t->shape[i];
    return t->ndim;
}

/* Build the padded JSON header. Returns malloc'ed text, *len = padded length. */
static char *build_header(const pl_st_writer *w, size_t *len) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    if (w->n_meta) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        if (!m) goto fail;
        for (int i = 0; i < w->n_meta; i++)
            if (!cJSON_AddStringToObject(m, w->meta_k[i], w->meta_v[i])) goto fail;
    }
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const pl_tensor *t = w->ents[i].t;
        int64_t shape[PL_MAX_DIMS];
        int nd = entry_shape(t, shape);
        uint64_t nb = pl_tensor_nbytes(t);
        /* integers are formatted here (cJSON would print doubles) */
        char sbuf[PL_MAX_DIMS * 24 + 4], obuf[64];
        size_t k = 0;
        sbuf[k++] = '[';
        for (int d = 0; d < nd; d++)
            k += (size_t)snprintf(sbuf + k, sizeof sbuf - k, "%s%" PRId64, d ? "," : "", shape[d]);
        snprintf(sbuf + k, sizeof sbuf - k, "]");
        snprintf(obuf, sizeof obuf, "[%" PRIu64 ",%" PRIu64 "]", off, off + nb);
        cJSON *e = cJSON_AddObjectToObject(root, w->ents[i].name);
        if (!e || !cJSON_AddStringToObject(e, "dtype", st_dtype_name(t->dtype)) ||
            !cJSON_AddRawToObject(e, "shape", sbuf) || !cJSON_AddRawToObject(e, "data_offsets", obuf))
            goto fail;
        off += nb;
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) return NULL;
    size_t n = strlen(s), padded = (n + 7) / 8 * 8;
    char *out = malloc(padded + 1);
    if (out) {
        memcpy(out, s, n);
        memset(out + n, ' ', padded - n);
        out[padded] = 0;
        *len = padded;
    }
    cJSON_free(s);
    return out;
fail:
    cJSON_Delete(root);
    return NULL;
}

/* Host, contiguous bytes of tensor t: either t's own memory (*tmp = NULL) or
 * a staged copy in *tmp (caller releases). */
static const void *host_bytes(pl_tensor *t, pl_tensor **tmp) {
    *tmp = NULL;
    if (t->device.type == PL_DEVICE_CPU && pl_tensor_is_contiguous(t)) return pl_tensor_data(t);
    pl_tensor *h = pl_tensor_new_owned(t->dtype, t->ndim, t->shape, PL_CPU);
    if (!h) return NULL;
    if (pl_tensor_copy_(h, t)) {
        pl_tensor_release(h);
        return NULL;
    }
    *tmp = h;
    return pl_tensor_data(h);
}

/* Device tensors come back to the host in groups: consecutive contiguous
 * tensors (not nf4) on one device, together at most PL_ST_STAGE_BYTES, are
 * copied device to device into one staging buffer and read in one copy (a
 * GPU waits for the host once per group instead of once per tensor: a
 * checkpoint of 60 small tensors was 60 reads). A larger tensor comes alone.
 * The bytes written are the same. */
#define PL_ST_STAGE_BYTES ((size_t)16 << 20)

static bool stageable(const pl_tensor *t, const pl_tensor *first) {
    return t->device.type != PL_DEVICE_CPU && t->dtype != PL_NF4 && pl_tensor_is_contiguous(t) &&
           pl_device_eq(t->device, first->device) && pl_tensor_nbytes(t) > 0;
}

/* Entries i .. *end (exclusive) staged and written to f; *end = i when
 * entry i does not start a group of 2 or more (the caller writes it alone). */
static pl_status write_group(pl_st_writer *w, int i, int *end, FILE *f) {
    const pl_tensor *t0 = w->ents[i].t;
    size_t tot = 0;
    int j = i;
    while (j < w->n && stageable(w->ents[j].t, t0) &&
           tot + pl_tensor_nbytes(w->ents[j].t) <= PL_ST_STAGE_BYTES)
        tot += pl_tensor_nbytes(w->ents[j++].t);
    *end = i;
    if (j - i < 2) return PL_OK;
    const pl_backend *be = pl_backend_get(t0->device.type);
    pl_tensor *buf =
        be ? pl_tensor_new_owned(PL_U8, 1, (int64_t[]){(int64_t)tot}, t0->device) : NULL;
    void *host = buf ? malloc(tot) : NULL;
    pl_status st = host ? PL_OK : pl_error_status();
    if (buf && !host) st = pl_error_set(PL_ERR_NOMEM, "%s: out of host memory", w->path);
    char *d = buf ? pl_tensor_data(buf) : NULL;
    size_t off = 0;
    for (int k = i; !st && k < j; k++) {
        size_t nb = pl_tensor_nbytes(w->ents[k].t);
        st = be->memcpy(d + off, t0->device, pl_tensor_data(w->ents[k].t), t0->device, nb);
        off += nb;
    }
    if (!st) st = be->memcpy(host, PL_CPU, d, t0->device, tot); /* the one read */
    if (!st && fwrite(host, 1, tot, f) != tot)
        st = pl_error_set(PL_ERR_IO, "%s: writing failed: %s", w->path, strerror(errno));
    free(host);
    pl_tensor_release(buf);
    if (!st) *end = j;
    return st;
}

static pl_status fsync_dir_of(const char *path) {
    char *dir = strdup(path);
    if (!dir) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", path);
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        dir[1] = 0;
    else
        *slash = 0;
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    pl_status s = PL_OK;
    if (fd < 0 || fsync(fd) != 0)
        s = pl_error_set(PL_ERR_IO, "%s: fsync of directory '%s' failed: %s", path, dir,
                         strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    return s;
}

pl_status pl_st_writer_commit(pl_st_writer *w) {
    if (!w) return pl_error_set(PL_ERR_INVALID, "safetensors commit: NULL writer");
    if (w->committed)
        return pl_error_set(PL_ERR_INVALID, "%s: safetensors writer committed twice", w->path);
    size_t hlen = 0;
    char *header = build_header(w, &hlen);
    if (!header) return pl_error_set(PL_ERR_NOMEM, "%s: out of memory building the header", w->path);

    size_t tlen = strlen(w->path) + 32;
    char *tmp = malloc(tlen);
    if (!tmp) {
        free(header);
        return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", w->path);
    }
    snprintf(tmp, tlen, "%s.tmp.%ld", w->path, (long)getpid());

    pl_status st = PL_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = pl_error_set(PL_ERR_IO, "%s: cannot create temp file '%s': %s", w->path, tmp,
                          strerror(errno));
        free(header);
        free(tmp);
        return st;
    }
    uint8_t lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    if (fwrite(lenb, 1, 8, f) != 8 || fwrite(header, 1, hlen, f) != hlen) goto io_fail;
    for (int i = 0; i < w->n; i++) {
        pl_tensor *hold = NULL;
        size_t nb = pl_tensor_nbytes(w->ents[i].t);
        if (nb && w->ents[i].t->device.type != PL_DEVICE_CPU) {
            int end = i;
            if ((st = write_group(w, i, &end, f))) {
                st = pl_error_prefix(st, "%s: staging tensors from '%s' to host", w->path,
                                     w->ents[i].name);
                goto fail;
            }
            if (end > i) {
                i = end - 1;
                continue;
            }
        }
        if (!nb) continue;
        const void *p = host_bytes(w->ents[i].t, &hold);
        if (!p) {
            st = pl_error_prefix(PL_ERR_IO, "%s: staging tensor '%s' to host", w->path,
                                 w->ents[i].name);
            goto fail;
        }
        size_t wr = fwrite(p, 1, nb, f);
        pl_tensor_release(hold);
        if (wr != nb) goto io_fail;
    }
    if (fflush(f) != 0 || fsync(fileno(f)) != 0) goto io_fail;
    if (fclose(f) != 0) {
        f = NULL;
        goto io_fail;
    }
    f = NULL;
    if (rename(tmp, w->path) != 0) {
        st = pl_error_set(PL_ERR_IO, "%s: rename from '%s' failed: %s", w->path, tmp,
                          strerror(errno));
        goto fail;
    }
    st = fsync_dir_of(w->path);
    w->committed = 1;
    free(header);
    free(tmp);
    return st;

io_fail:
    st = pl_error_set(PL_ERR_IO, "%s: writing '%s' failed: %s", w->path, tmp, strerror(errno));
fail:
    if (f) fclose(f);
    unlink(tmp);
    free(header);
    free(tmp);
    return st;
}

/* ======================================================================= */
/* reader                                                                  */
/* ======================================================================= */

typedef struct st_rentry {
    char *name;
    pl_dtype dtype;
    int ndim;
    int64_t shape[PL_MAX_DIMS];
    uint64_t begin, end; /* relative to the data section */
} st_rentry;

/* The file mapping, shared by the file and its views. */
typedef struct st_map {
    void *base;
    size_t size;
    int refcount; /* atomic: views may be released on any thread */
} st_map;

static st_map *st_map_retain(st_map *m) {
    __atomic_add_fetch(&m->refcount, 1, __ATOMIC_RELAXED);
    return m;
}

static void st_map_release(st_map *m) {
    if (!m || __atomic_sub_fetch(&m->refcount, 1, __ATOMIC_ACQ_REL) > 0) return;
    if (m->base && m->size) {
        pl_crash_map_unregister(m->base);
        munmap(m->base, m->size);
    }
    free(m);
}

struct pl_st_file {
    char *path;
    st_map *mapping;
    const uint8_t *map; /* mapping->base */
    size_t size;
    const uint8_t *data; /* start of the data section */
    uint64_t data_size;
    st_rentry *ents;
    int n;
    char **meta_k, **meta_v;
    int n_meta;
};

void pl_st_close(pl_st_file *f) {
    if (!f) return;
    st_map_release(f->mapping);
    for (int i = 0; i < f->n; i++) free(f->ents[i].name);
    for (int i = 0; i < f->n_meta; i++) {
        free(f->meta_k[i]);
        free(f->meta_v[i]);
    }
    free(f->ents);
    free(f->meta_k);
    free(f->meta_v);
    free(f->path);
    free(f);
}

/* Non-negative integer <= 2^53 from a JSON number. */
static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double v = j->valuedouble;
    if (!(v >= 0) || v > ST_MAX_INT || v != floor(v)) return -1;
    *out = (uint64_t)v;
    return 0;
}

static pl_status parse_entry(pl_st_file *f, const cJSON *j, st_rentry *e) {
    const char *p = f->path, *nm = e->name;
    if (!cJSON_IsObject(j))
        return pl_error_set(PL_ERR_IO, "%s: tensor '%s': header entry is not a JSON object", p, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt))
        return pl_error_set(PL_ERR_IO, "%s: tensor '%s': missing or non-string \"dtype\"", p, nm);
    if (st_dtype_parse(dt->valuestring, &e->dtype))
        return pl_error_set(PL_ERR_IO, "%s: tensor '%s': unknown dtype '%s' (supported: F32, BF16, "
                            "F16, F64, I32, I64, U8)", p, nm, dt->valuestring);
    if (!cJSON_IsArray(sh))
        return pl_error_set(PL_ERR_IO, "%s: tensor '%s': \"shape\" is not a list", p, nm);
    int nd = cJSON_GetArraySize(sh);
    if (nd > PL_MAX_DIMS)
        return pl_error_set(PL_ERR_IO, "%s: tensor '%s': shape has %d dims, at most %d supported",
                            p, nm, nd, PL_MAX_DIMS);
    e->ndim = nd;
    uint64_t numel = 1;
    int overflow = 0;
    for (int d = 0; d < nd; d++) {
        uint64_t v;
        if (json_uint(cJSON_GetArrayItem(sh, d), &v))
            return pl_error_set(PL_ERR_IO, "%s: tensor '%s': shape entry %d is not a non-negative "
                                "integer", p, nm, d);
        e->shape[d] = (int64_t)v;
        if (v && numel > UINT64_MAX / v) overflow = 1;
        numel *= v;
    }
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
        return pl_error_set(PL_ERR_IO, "%s: tensor '%s': \"data_offsets\" is not a list [begin, "
                            "end]", p, nm);
    if (json_uint(cJSON_GetArrayItem(of, 0), &e->begin) ||
        json_uint(cJSON_GetArrayItem(of, 1), &e->end))
        return pl_error_set(PL_ERR_IO, "%s: tensor '%s': data_offsets entries are not non-negative "
                            "integers", p, nm);
    if (e->begin > e->end)
        return pl_error_set(PL_ERR_IO, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                            "] have begin > end", p, nm, e->begin, e->end);
    if (e->end > f->data_size)
        return pl_error_set(PL_ERR_IO, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                            "] out of range: end %" PRIu64 " is beyond the data section of %" PRIu64
                            " bytes", p, nm, e->begin, e->end, e->end, f->data_size);
    size_t es = pl_dtype_size(e->dtype);
    char sb[256];
    shape_str(e->ndim, e->shape, sb, sizeof sb);
    if (overflow || numel > UINT64_MAX / es)
        return pl_error_set(PL_ERR_IO, "%s: tensor '%s': shape %s is too large", p, nm, sb);
    if (e->end - e->begin != numel * es)
        return pl_error_set(PL_ERR_IO, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                            "] hold %" PRIu64 " bytes, expected %" PRIu64 " (%s %s = %" PRIu64
                            " elements x %zu bytes)", p, nm, e->begin, e->end, e->end - e->begin,
                            numel * es, dt->valuestring, sb, numel, es);
    return PL_OK;
}

static int cmp_begin(const void *a, const void *b) {
    const st_rentry *x = *(st_rentry *const *)a, *y = *(st_rentry *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : 0;
}

static pl_status parse_header(pl_st_file *f, const char *text, size_t len) {
    const char *p = f->path;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t at = end && end >= text && end <= text + len ? (size_t)(end - text) : 0;
        return pl_error_set(PL_ERR_IO, "%s: header is not valid JSON (parse error near byte %zu of "
                            "%zu)", p, at, len);
    }
    for (const char *q = end; q && q < text + len; q++)
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r' && *q != 0) {
            cJSON_Delete(root);
            return pl_error_set(PL_ERR_IO, "%s: header has trailing garbage after the JSON object "
                                "at byte %zu of %zu", p, (size_t)(q - text), len);
        }
    pl_status st = PL_OK;
    if (!cJSON_IsObject(root)) {
        st = pl_error_set(PL_ERR_IO, "%s: header JSON is not an object", p);
        goto done;
    }
    int cnt = cJSON_GetArraySize(root);
    f->ents = calloc((size_t)(cnt ? cnt : 1), sizeof *f->ents);
    if (!f->ents) {
        st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory (%d header entries)", p, cnt);
        goto done;
    }
    for (const cJSON *it = root->child; it; it = it->next) {
        const char *key = it->string ? it->string : "";
        if (!strcmp(key, "__metadata__")) {
            if (f->meta_k) {
                st = pl_error_set(PL_ERR_IO, "%s: \"__metadata__\" appears twice", p);
                goto done;
            }
            if (!cJSON_IsObject(it)) {
                st = pl_error_set(PL_ERR_IO, "%s: \"__metadata__\" is not an object", p);
                goto done;
            }
            int m = cJSON_GetArraySize(it);
            f->meta_k = calloc((size_t)(m ? m : 1), sizeof(char *));
            f->meta_v = calloc((size_t)(m ? m : 1), sizeof(char *));
            if (!f->meta_k || !f->meta_v) {
                st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory (metadata)", p);
                goto done;
            }
            for (const cJSON *kv = it->child; kv; kv = kv->next) {
                if (!cJSON_IsString(kv)) {
                    st = pl_error_set(PL_ERR_IO, "%s: metadata '%s' is not a string", p,
                                      kv->string ? kv->string : "");
                    goto done;
                }
                f->meta_k[f->n_meta] = strdup(kv->string ? kv->string : "");
                f->meta_v[f->n_meta] = strdup(kv->valuestring);
                if (!f->meta_k[f->n_meta] || !f->meta_v[f->n_meta]) {
                    f->n_meta++;
                    st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory (metadata)", p);
                    goto done;
                }
                f->n_meta++;
            }
            continue;
        }
        for (int i = 0; i < f->n; i++)
            if (!strcmp(f->ents[i].name, key)) {
                st = pl_error_set(PL_ERR_IO, "%s: tensor '%s' appears twice in the header", p, key);
                goto done;
            }
        st_rentry *e = &f->ents[f->n];
        if (!(e->name = strdup(key))) {
            st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", p);
            goto done;
        }
        f->n++;
        if ((st = parse_entry(f, it, e))) goto done;
    }
    /* overlap check over non-empty tensors, sorted by begin */
    if (f->n > 1) {
        st_rentry **ord = malloc((size_t)f->n * sizeof *ord);
        if (!ord) {
            st = pl_error_set(PL_ERR_NOMEM, "%s: out of memory", p);
            goto done;
        }
        int k = 0;
        for (int i = 0; i < f->n; i++)
            if (f->ents[i].end > f->ents[i].begin) ord[k++] = &f->ents[i];
        qsort(ord, (size_t)k, sizeof *ord, cmp_begin);
        for (int i = 1; i < k; i++)
            if (ord[i]->begin < ord[i - 1]->end) {
                st = pl_error_set(PL_ERR_IO, "%s: tensors '%s' [%" PRIu64 ", %" PRIu64 ") and '%s' ["
                                  "%" PRIu64 ", %" PRIu64 ") overlap in the data section", p,
                                  ord[i - 1]->name, ord[i - 1]->begin, ord[i - 1]->end,
                                  ord[i]->name, ord[i]->begin, ord[i]->end);
                break;
            }
        free(ord);
    }
done:
    cJSON_Delete(root);
    return st;
}

pl_status pl_st_open(const char *path, pl_st_file **out) {
    if (out) *out = NULL;
    if (!path || !out) return pl_error_set(PL_ERR_INVALID, "safetensors open: NULL argument");
    /* checked on the opened descriptor, opened without blocking: a FIFO
     * named as a checkpoint or shard is refused instead of waiting forever */
    int fd = pl_file_open_read(path, NULL);
    if (fd < 0) return pl_error_status();
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return pl_error_set(PL_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        close(fd);
        return pl_error_set(PL_ERR_IO, "%s: truncated: file is %" PRIu64 " bytes, shorter than the "
                            "8-byte header length", path, size);
    }
    /* writable but private: a write through a view is copy-on-write into
     * this process's memory and never reaches the file */
    void *map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    int merr = errno;
    close(fd);
    if (map == MAP_FAILED)
        return pl_error_set(PL_ERR_IO, "%s: mmap of %" PRIu64 " bytes failed: %s", path, size,
                            strerror(merr));
    pl_st_file *f = calloc(1, sizeof *f);
    st_map *m = calloc(1, sizeof *m);
    if (!f || !m || !(f->path = strdup(path))) {
        free(f);
        free(m);
        munmap(map, (size_t)size);
        return pl_error_set(PL_ERR_NOMEM, "%s: out of memory", path);
    }
    m->base = map;
    m->size = (size_t)size;
    /* a SIGBUS in here (the file truncated under us) names the file */
    pl_crash_map_register(map, (size_t)size, path);
    m->refcount = 1;
    f->mapping = m;
    f->map = map;
    f->size = (size_t)size;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)f->map[i] << (8 * i);
    pl_status st = PL_OK;
    if (hlen > size - 8) {
        st = pl_error_set(PL_ERR_IO, "%s: truncated or corrupt: header length %" PRIu64 " is larger "
                          "than the file allows (%" PRIu64 " bytes after the 8-byte length)", path,
                          hlen, size - 8);
    } else if (hlen > ST_MAX_HEADER) {
        st = pl_error_set(PL_ERR_IO, "%s: header length %" PRIu64 " exceeds the limit of %" PRIu64
                          " bytes", path, hlen, ST_MAX_HEADER);
    } else {
        f->data = f->map + 8 + hlen;
        f->data_size = size - 8 - hlen;
        st = parse_header(f, (const char *)f->map + 8, (size_t)hlen);
    }
    if (st) {
        pl_st_close(f);
        return st;
    }
    *out = f;
    return PL_OK;
}

int pl_st_count(const pl_st_file *f) { return f ? f->n : 0; }

const char *pl_st_name_at(const pl_st_file *f, int i) {
    return f && i >= 0 && i < f->n ? f->ents[i].name : NULL;
}

static const st_rentry *find(const pl_st_file *f, const char *name) {
    if (!f || !name) {
        pl_error_set(PL_ERR_INVALID, "safetensors: NULL %s", !f ? "file" : "name");
        return NULL;
    }
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->ents[i].name, name)) return &f->ents[i];
    pl_error_set(PL_ERR_INVALID, "%s: no tensor named '%s' (file has %d tensors)", f->path, name,
                 f->n);
    return NULL;
}

pl_status pl_st_info(const pl_st_file *f, const char *name, pl_dtype *dt, int *ndim,
                     int64_t *shape) {
    const st_rentry *e = find(f, name);
    if (!e) return pl_error_status();
    if (dt) *dt = e->dtype;
    if (ndim) *ndim = e->ndim;
    if (shape)
        for (int d = 0; d < e->ndim; d++) shape[d] = e->shape[d];
    return PL_OK;
}

pl_tensor *pl_st_load(const pl_st_file *f, const char *name) {
    const st_rentry *e = find(f, name);
    if (!e) return NULL;
    pl_tensor *t = pl_tensor_new_owned(e->dtype, e->ndim, e->shape, PL_CPU);
    if (!t) {
        pl_error_prefix(pl_error_status(), "%s: loading tensor '%s'", f->path, name);
        return NULL;
    }
    if (e->end > e->begin) memcpy(pl_tensor_data(t), f->data + e->begin, e->end - e->begin);
    pl_tensor_set_name(t, "%s", name);
    return t;
}

/* What a view's free callback needs: its mapping and its byte range. */
typedef struct st_view_ref {
    st_map *m;
    size_t nbytes;
} st_view_ref;

/* Free callback of a view: drop the whole pages inside [data, data +
 * nbytes) from the process (their private copies too), then the view's
 * reference on the mapping. Pages shared with a neighbouring tensor stay. */
static void st_view_free(void *data, void *ctx) {
    st_view_ref *r = ctx;
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t ps = pg > 0 ? (uintptr_t)pg : 4096;
    uintptr_t lo = ((uintptr_t)data + ps - 1) / ps * ps;
    uintptr_t hi = ((uintptr_t)data + r->nbytes) / ps * ps;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: failure is harmless */
    st_map_release(r->m);
    free(r);
}

pl_tensor *pl_st_view(const pl_st_file *f, const char *name) {
    const st_rentry *e = find(f, name);
    if (!e) return NULL;
    /* bytes not aligned for the dtype (a foreign writer without header
     * padding): kernels need aligned elements, so copy */
    if ((uintptr_t)(f->data + e->begin) % pl_dtype_size(e->dtype)) return pl_st_load(f, name);
    st_view_ref *r = malloc(sizeof *r);
    if (!r) {
        pl_error_set(PL_ERR_NOMEM, "%s: out of memory viewing tensor '%s'", f->path, name);
        return NULL;
    }
    r->m = st_map_retain(f->mapping);
    r->nbytes = (size_t)(e->end - e->begin);
    /* its own frame, so the caller owns the view whatever frame is open */
    pl_frame_begin();
    pl_tensor *t = pl_tensor_from_external(e->dtype, e->ndim, e->shape,
                                           (void *)(f->data + e->begin), st_view_free, r);
    pl_frame_keep(t);
    pl_frame_end();
    if (!t) {
        st_map_release(r->m);
        free(r);
        pl_error_prefix(pl_error_status(), "%s: viewing tensor '%s'", f->path, name);
        return NULL;
    }
    pl_tensor_set_name(t, "%s", name);
    return t;
}

pl_status pl_st_load_into(const pl_st_file *f, const char *name, pl_tensor *dst) {
    const st_rentry *e = find(f, name);
    if (!e) return pl_error_status();
    if (!dst) return pl_error_set(PL_ERR_INVALID, "%s: load '%s' into NULL tensor", f->path, name);
    char want[256], got[256];
    shape_str(dst->ndim, dst->shape, want, sizeof want);
    shape_str(e->ndim, e->shape, got, sizeof got);

    /* nf4 destination: the file holds the packed codes as U8 [ceil(numel/2)] */
    if (dst->dtype == PL_NF4) {
        uint64_t nb = pl_tensor_nbytes(dst);
        if (e->dtype != PL_U8 || e->ndim != 1 || (uint64_t)e->shape[0] != nb)
            return pl_error_set(PL_ERR_SHAPE, "%s: tensor '%s': nf4 destination %s expects U8 [%"
                                PRIu64 "] packed codes, found %s %s", f->path, name, want, nb,
                                st_dtype_name(e->dtype), got);
        if (!pl_tensor_is_contiguous(dst) || (dst->offset & 1))
            return pl_error_set(PL_ERR_INVALID, "%s: tensor '%s': nf4 destination must be "
                                "contiguous", f->path, name);
        if (!nb) return PL_OK;
        if (dst->device.type == PL_DEVICE_CPU) {
            memcpy(pl_tensor_data(dst), f->data + e->begin, (size_t)nb);
            return PL_OK;
        }
        const pl_backend *b = pl_backend_get(dst->device.type);
        if (!b) return pl_error_prefix(pl_error_status(), "%s: tensor '%s'", f->path, name);
        pl_status s = b->memcpy(pl_tensor_data(dst), dst->device, f->data + e->begin, PL_CPU,
                                (size_t)nb);
        return s ? pl_error_prefix(s, "%s: tensor '%s'", f->path, name) : PL_OK;
    }

    bool same = e->ndim == dst->ndim;
    for (int d = 0; same && d < e->ndim; d++) same = e->shape[d] == dst->shape[d];
    if (!same)
        return pl_error_set(PL_ERR_SHAPE, "%s: tensor '%s': shape mismatch: expected %s "
                            "(destination), found %s in the file", f->path, name, want, got);
    if (e->dtype != dst->dtype && !(pl_dtype_is_float(e->dtype) && pl_dtype_is_float(dst->dtype)))
        return pl_error_set(PL_ERR_DTYPE, "%s: tensor '%s': stored dtype %s cannot be converted to "
                            "the destination's %s (only float dtypes convert)", f->path, name,
                            st_dtype_name(e->dtype), pl_dtype_name(dst->dtype));

    /* a stored tensor whose bytes are not aligned for its dtype (a foreign
     * writer without header padding) is staged through an aligned copy */
    if ((uintptr_t)(f->data + e->begin) % pl_dtype_size(e->dtype)) {
        pl_tensor *al = pl_st_load(f, name);
        if (!al) return pl_error_status();
        pl_status s = pl_tensor_copy_(dst, al);
        pl_tensor_release(al);
        return s ? pl_error_prefix(s, "%s: loading tensor '%s'", f->path, name) : PL_OK;
    }
    /* temporary CPU view of the mapped bytes; its own frame so that the
     * handle is ours whatever frame the caller has open */
    pl_frame_begin();
    pl_tensor *src = pl_tensor_from_external(e->dtype, e->ndim, e->shape,
                                             (void *)(f->data + e->begin), NULL, NULL);
    pl_frame_keep(src);
    pl_frame_end();
    if (!src) return pl_error_prefix(pl_error_status(), "%s: tensor '%s'", f->path, name);
    pl_status s = pl_tensor_copy_(dst, src);
    pl_tensor_release(src);
    if (s) return pl_error_prefix(s, "%s: loading tensor '%s'", f->path, name);
    return PL_OK;
}

const char *pl_st_meta(const pl_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta_k[i], key)) return f->meta_v[i];
    return NULL;
}

/* Flat index and kind of the first non-finite element, and their count;
 * exponent bits all ones is NaN or +-Inf in every IEEE layout (and bf16). */
#define ST_SCAN(T, EXP, MANT)                                                                   \
    do {                                                                                        \
        const T *v = (const T *)(const void *)p;                                                \
        for (uint64_t i = 0; i < n; i++) {                                                      \
            T u;                                                                                \
            memcpy(&u, v + i, sizeof u); /* the stored bytes may be unaligned */               \
            if ((u & (EXP)) == (EXP)) {                                                         \
                if (!bad++) {                                                                   \
                    first = i;                                                                  \
                    first_nan = (u & (MANT)) != 0;                                              \
                    first_neg = (u & ~((T)-1 >> 1)) != 0;                                       \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
    } while (0)

pl_status pl_st_check_finite(const pl_st_file *f, const char *name) {
    const st_rentry *e = find(f, name);
    if (!e) return pl_error_status();
    const uint8_t *p = f->data + e->begin;
    uint64_t n = (e->end - e->begin) / (e->end > e->begin ? pl_dtype_size(e->dtype) : 1);
    uint64_t bad = 0, first = 0;
    bool first_nan = false, first_neg = false;
    switch (e->dtype) {
    case PL_F32: ST_SCAN(uint32_t, 0x7f800000u, 0x007fffffu); break;
    case PL_F64: ST_SCAN(uint64_t, 0x7ff0000000000000ull, 0x000fffffffffffffull); break;
    case PL_BF16: ST_SCAN(uint16_t, (uint16_t)0x7f80u, (uint16_t)0x007fu); break;
    case PL_F16: ST_SCAN(uint16_t, (uint16_t)0x7c00u, (uint16_t)0x03ffu); break;
    default: return PL_OK;
    }
    if (!bad) return PL_OK;
    char sb[256];
    shape_str(e->ndim, e->shape, sb, sizeof sb);
    return pl_error_set(PL_ERR_NUMERIC, "%s: tensor '%s' (%s %s) holds %" PRIu64 " non-finite "
                        "values of %" PRIu64 " (first at flat index %" PRIu64 ": %s)", f->path,
                        name, st_dtype_name(e->dtype), sb, bad, n, first,
                        first_nan ? "nan" : first_neg ? "-inf" : "inf");
}
