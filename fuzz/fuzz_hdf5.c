/* fuzz_hdf5.c - the HDF5 loaders' metadata and data checks (hdf5_rows,
 * hdf5_series, hdf5_graph in node and graphs mode, and the shared
 * checks of plugins/common/hdf5) on small generated files.
 *
 * libhdf5's own binary parser is not the target: the fuzzer's bytes drive
 * the CONSTRUCTION of a valid HDF5 file (on tmpfs) from a layout the loader
 * expects, then perturb it: datasets left out, other dtypes and ranks,
 * wrong or huge extents (chunked datasets of up to 2^63 rows that hold no
 * data), NaN / Inf / out-of-range values, decreasing CSR offsets, index
 * values outside their range; and the loader's [data] options. The loader
 * then runs through its plugin vtable (the real .so, found by the registry
 * as `pipeline run` finds it): create, batch_fields, and for every split
 * epoch_begin at a fuzzer-chosen batch and next() to the end.
 *
 * Each step must either succeed or return a clean error with a message;
 * besides sanitizer reports, a batch carrying a non-finite float value is
 * a finding (the loaders refuse NaN / Inf at load): abort().
 *
 * Storage the loaders must refuse (issue 34), picked by byte 0's bits 2..4
 * for the first dataset of the layout (the one every mode reads): a virtual
 * dataset whose source file is complete or missing, external raw storage
 * complete, cut short or on /dev/zero. A loader that accepts such a file is
 * a finding (abort()). Or the finished file is damaged: truncated to a
 * fuzzer-chosen length, or a byte of its superblock overwritten (the
 * "truncated" / "not an HDF5 file" diagnosis of pl_h5_open_read).
 *
 * Input layout: byte 0 picks the loader mode (bits 0..1) and the storage
 * (bits 2..4: 0 plain), the rest is consumed as needed (zeros once
 * exhausted), so short inputs give the valid layout. */
#include <hdf5.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_util.h"
#include "pipeline/pipeline.h"
#include "pipeline/testing.h"

/* ---- input bytes ------------------------------------------------------ */

typedef struct {
    const uint8_t *p;
    size_t n, i;
} bytes;

static unsigned u8(bytes *b) {
    return b->i < b->n ? b->p[b->i++] : 0;
}
static unsigned u16(bytes *b) {
    return u8(b) | u8(b) << 8;
}
/* true with probability about 1/k (never once the input is used up) */
static bool one_in(bytes *b, unsigned k) {
    return b->i < b->n && u8(b) % k == k - 1;
}

/* ---- building the file ------------------------------------------------ */

typedef enum { K_FEAT, K_INDEX, K_LABEL, K_MASK, K_PTR, K_DATE, K_TIME } kind;

/* Values of a valid dataset of `kind` (n elements): `lim` is the range of
 * index values, the total for CSR offsets (0 .. lim, never decreasing), the
 * class count for labels. Masks select about a third of the entries each. */
static void valid_values(kind k, int64_t n, int64_t lim, bytes *b, double *v) {
    for (int64_t i = 0; i < n; i++) {
        switch (k) {
        case K_FEAT:
            v[i] = (double)((int)u8(b) - 128) / 16.0;
            break;
        case K_INDEX:
            v[i] = lim > 0 ? (double)(u8(b) % lim) : 0;
            break;
        case K_LABEL:
            v[i] = lim > 0 ? (double)(u8(b) % lim) : -1;
            break;
        case K_MASK:
            v[i] = (i % 3) == (int64_t)(u8(b) % 3) ? 1 : 0;
            break;
        case K_PTR:
            v[i] = n > 1 ? (double)(i * lim / (n - 1)) : 0;
            break;
        case K_DATE:
            v[i] = 10000.0 + (double)i;
            break;
        case K_TIME: /* hourly seconds from 1997-05-19T00:00Z (time of day: /time) */
            v[i] = 864000000.0 + 3600.0 * (double)i;
            break;
        }
    }
}

static const double k_special[] = {NAN,    INFINITY, -INFINITY, -1,           -2,
                                   1e300,  -1e300,   3.5e38,    4294967296.0, 2147483648.0,
                                   9.3e18, 0,        1,         65535,        1e-320};
#define N_SPECIAL (sizeof k_special / sizeof k_special[0])

/* Dims beyond what fits in memory (no data is written: chunked, all fill). */
static const hsize_t k_huge[] = {(hsize_t)1 << 40, (hsize_t)1 << 50, (hsize_t)1 << 61,
                                 (hsize_t)1 << 62, ((hsize_t)1 << 63) + 5};

/* ---- storage the loaders must refuse ------------------------------------ */

typedef enum {
    ST_PLAIN,
    ST_VIRTUAL,         /* a virtual dataset over a complete source in another file */
    ST_VIRTUAL_MISSING, /* ... whose source file does not exist */
    ST_EXTERNAL,        /* external raw storage holding all the data */
    ST_EXTERNAL_SHORT,  /* ... cut to a fuzzer-chosen length */
    ST_EXTERNAL_ZERO,   /* ... on /dev/zero */
    ST_TRUNCATE,        /* the finished file truncated */
    ST_SUPERBLOCK,      /* a byte of the finished file's signature / version overwritten */
} storage;

static storage g_storage;
static bool g_hostile; /* the first dataset got a virtual / external layout */
static int g_puts;     /* datasets put so far in this input */
static char g_dir_path[512];

/* Give the dataset about to be created (dcpl, space sp, n elements of type)
 * the storage of g_storage when it is the layout's first one. Returns true
 * when the data must not be written through the dataset (virtual: written
 * to the source instead; external on /dev/zero). */
static bool hostile_layout(bool first, hid_t dcpl, hid_t sp, int rank, hid_t type, hsize_t numel,
                           const char *name, bytes *b, char *ext, size_t ext_n) {
    if (!first || rank == 0 || numel == 0 || numel > 4096) return false;
    size_t bytes_n = (size_t)numel * H5Tget_size(type);
    char src[600];
    switch (g_storage) {
    case ST_VIRTUAL:
    case ST_VIRTUAL_MISSING:
        snprintf(src, sizeof src, "%s/%s", g_dir_path,
                 g_storage == ST_VIRTUAL ? "src.h5" : "no_such_source.h5");
        if (H5Pset_virtual(dcpl, sp, src, name, sp) < 0) return false;
        g_hostile = true;
        if (g_storage == ST_VIRTUAL_MISSING) return true;
        { /* the source: the same dataset, contiguous, in src.h5 */
            hid_t sf = H5Fcreate(src, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
            hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
            H5Pset_create_intermediate_group(lcpl, 1);
            hid_t sd = sf < 0 ? -1 : H5Dcreate2(sf, name, type, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
            if (sd >= 0) {
                double *v = calloc(numel, sizeof *v);
                if (!v) abort();
                valid_values(K_FEAT, (int64_t)numel, 0, b, v);
                H5Dwrite(sd, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
                free(v);
                H5Dclose(sd);
            }
            H5Pclose(lcpl);
            if (sf >= 0) H5Fclose(sf);
        }
        return true;
    case ST_EXTERNAL:
    case ST_EXTERNAL_SHORT:
        snprintf(ext, ext_n, "%s/ext.bin", g_dir_path);
        if (!fz_write("ext.bin", "", 0) || H5Pset_external(dcpl, ext, 0, (hsize_t)bytes_n) < 0) {
            ext[0] = 0;
            return false;
        }
        g_hostile = true;
        return false; /* written through the dataset into ext.bin */
    case ST_EXTERNAL_ZERO:
        if (H5Pset_external(dcpl, "/dev/zero", 0, (hsize_t)bytes_n) < 0) return false;
        g_hostile = true;
        return true;
    default:
        return false;
    }
}

static hid_t file_type(bytes *b, hid_t dflt) {
    if (!one_in(b, 6)) return dflt;
    static const hid_t *const types[] = {
        &H5T_NATIVE_FLOAT_g,  &H5T_NATIVE_DOUBLE_g, &H5T_NATIVE_INT_g,
        &H5T_NATIVE_LLONG_g,  &H5T_NATIVE_UCHAR_g,  &H5T_NATIVE_SCHAR_g,
        &H5T_NATIVE_USHORT_g, &H5T_NATIVE_UINT_g,   &H5T_NATIVE_ULLONG_g};
    H5open();
    return *types[u8(b) % (sizeof types / sizeof types[0])];
}

/* Write dataset `name` (rank, dims) of kind k into `file`, perturbed by the
 * input: maybe absent, another type, rank or extent, special values. */
static void put(hid_t file, const char *name, hid_t type, int rank, const int64_t *dims0, kind k,
                int64_t lim, bytes *b) {
    bool first = g_puts++ == 0; /* the layout's first dataset: the one every mode reads */
    if (one_in(b, 24)) return; /* absent */
    hsize_t dims[4];
    for (int d = 0; d < rank; d++)
        dims[d] = (hsize_t)dims0[d];
    if (one_in(b, 16)) rank = (int)(u8(b) % 4); /* rank 0..3 */
    for (int d = 0; d < rank; d++)
        if (d >= 4 || one_in(b, 16)) dims[d] = u8(b) % 9;
    bool huge = false;
    if (rank > 0 && one_in(b, 24)) {
        dims[u8(b) % rank] = k_huge[u8(b) % (sizeof k_huge / sizeof k_huge[0])];
        huge = true;
    }
    type = file_type(b, type);
    hsize_t numel = 1;
    for (int d = 0; d < rank; d++)
        numel *= dims[d];
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t sp;
    if (huge) {
        hsize_t maxd[4], chunk[4];
        for (int d = 0; d < rank; d++) {
            maxd[d] = H5S_UNLIMITED;
            chunk[d] = 1;
        }
        H5Pset_chunk(dcpl, rank, chunk);
        if (H5Tget_class(type) == H5T_FLOAT && one_in(b, 2)) {
            double fill = k_special[u8(b) % 3]; /* NaN / Inf fill value */
            H5Pset_fill_value(dcpl, H5T_NATIVE_DOUBLE, &fill);
        }
        sp = H5Screate_simple(rank, dims, maxd);
    } else {
        sp = rank ? H5Screate_simple(rank, dims, NULL) : H5Screate(H5S_SCALAR);
    }
    char ext[600] = "";
    bool no_write =
        !huge && hostile_layout(first, dcpl, sp, rank, type, numel, name, b, ext, sizeof ext);
    hid_t ds = H5Dcreate2(file, name, type, sp, lcpl, dcpl, H5P_DEFAULT);
    if (ds >= 0 && !huge && !no_write && numel > 0 && numel <= 4096) {
        double *v = malloc(numel * sizeof *v);
        if (!v) abort();
        valid_values(k, (int64_t)numel, lim, b, v);
        for (unsigned m = one_in(b, 3) ? 1 + u8(b) % 3 : 0; m > 0; m--)
            v[u16(b) % numel] = k_special[u8(b) % N_SPECIAL];
        H5Dwrite(ds, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
        free(v);
    }
    if (ds >= 0) H5Dclose(ds);
    if (ext[0] && g_storage == ST_EXTERNAL_SHORT) { /* cut the external file short */
        size_t have = (size_t)numel * H5Tget_size(type);
        if (truncate(ext, (off_t)(u16(b) % have)) != 0) abort();
    }
    H5Sclose(sp);
    H5Pclose(dcpl);
    H5Pclose(lcpl);
}

static void put_attr_int(hid_t file, const char *name, int64_t v) {
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(file, name, H5T_NATIVE_LLONG, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) {
        H5Awrite(a, H5T_NATIVE_LLONG, &v);
        H5Aclose(a);
    }
    H5Sclose(sp);
}

/* ---- the four layouts --------------------------------------------------- */

typedef struct {
    const char *plugin;
    char ini[2048];
    size_t len;
} setup;

static void ini_add(setup *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ini_add(setup *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int w = vsnprintf(s->ini + s->len, sizeof s->ini - s->len, fmt, ap);
    va_end(ap);
    if (w > 0)
        s->len += (size_t)w < sizeof s->ini - s->len ? (size_t)w : sizeof s->ini - s->len - 1;
}

static const char *flag(bytes *b) {
    return u8(b) & 1 ? "true" : "false";
}

/* hdf5_rows: /train, /val, /test groups with x [N, F] and y [N]. */
static void layout_rows(hid_t f, bytes *b, setup *s) {
    int64_t F = 1 + u8(b) % 3;
    static const char *const grp[] = {"train", "val", "test"};
    for (int g = 0; g < 3; g++) {
        int64_t N = 1 + u8(b) % 12, C = 1 + u8(b) % 5;
        char name[64];
        snprintf(name, sizeof name, "/%s/x", grp[g]);
        put(f, name, H5T_NATIVE_FLOAT, 2, (int64_t[]){N, F}, K_FEAT, 0, b);
        snprintf(name, sizeof name, "/%s/y", grp[g]);
        put(f, name, H5T_NATIVE_LLONG, 1, (int64_t[]){N}, K_LABEL, C, b);
        if (g > 0 && one_in(b, 3)) { /* CSR history: offsets [N+1], items [nnz] */
            int64_t nnz = u8(b) % 16;
            snprintf(name, sizeof name, "/%s/hist/offsets", grp[g]);
            put(f, name, H5T_NATIVE_LLONG, 1, (int64_t[]){N + 1}, K_PTR, nnz, b);
            snprintf(name, sizeof name, "/%s/hist/items", grp[g]);
            put(f, name, H5T_NATIVE_INT, 1, (int64_t[]){nnz}, K_INDEX, 50, b);
        }
    }
    if (one_in(b, 2)) put_attr_int(f, "num_items", (int64_t)u16(b) - 100);
    s->plugin = "hdf5_rows";
    ini_add(s, "datasets = %s\n", one_in(b, 8) ? "x,missing" : u8(b) & 1 ? "x,y" : "in=x,y");
    if (one_in(b, 4)) ini_add(s, "history = hist\n");
    if (one_in(b, 6)) ini_add(s, "split_fractions = 0.%u,0.%u,0.1\n", u8(b) % 9, u8(b) % 9);
    ini_add(s, "batch_size = %u\neval_batch_size = %u\n", 1 + u8(b) % 6, u8(b) % 5);
    /* 1..16 rows a chunk, or 64: every split resident */
    unsigned cs = u8(b) % 18;
    ini_add(s, "chunk_samples = %u\n", cs == 17 ? 64 : cs + 1);
    ini_add(s, "shuffle = %s\ndrop_last = %s\nprefetch = %s\n", flag(b), flag(b), flag(b));
    if (one_in(b, 4)) ini_add(s, "convert = f32\n");
}

/* hdf5_series: /series [T, F], /date [T] (days) or /time [T] (seconds:
 * splits at a time of day, multi-timeframe windows). */
static void layout_series(hid_t f, bytes *b, setup *s) {
    int64_t T = 4 + u8(b) % 24, F = 1 + u8(b) % 3;
    bool secs = one_in(b, 3);
    put(f, "/series", H5T_NATIVE_FLOAT, 2, (int64_t[]){T, F}, K_FEAT, 0, b);
    if (secs)
        put(f, "/time", H5T_NATIVE_LLONG, 1, (int64_t[]){T}, K_TIME, 0, b);
    else
        put(f, "/date", H5T_NATIVE_LLONG, 1, (int64_t[]){T}, K_DATE, 0, b);
    s->plugin = "hdf5_series";
    ini_add(s, "window = %u\nhorizon = %u\n", 1 + u8(b) % 4, 1 + u8(b) % 3);
    if (one_in(b, 3)) /* multi-timeframe: bars of 1 and k rows, a window of each */
        ini_add(s, "timeframes = 1,%u\nwindows = %u,%u\n", 1 + u8(b) % 4, 1 + u8(b) % 4,
                1 + u8(b) % 3);
    if (u8(b) & 1)
        ini_add(s, "split_fractions = 0.%u,0.2,0.2\n", 3 + u8(b) % 6);
    else if (secs)
        ini_add(s, "train_end = 1997-05-19T%02u:%02u%s\nval_end = 1997-05-%02uT12:00Z\n",
                u8(b) % 25, u8(b) % 61, one_in(b, 4) ? "" : one_in(b, 2) ? "Z" : "+07:00",
                19 + u8(b) % 3);
    else
        ini_add(s, "train_end = 1997-%02u-%02u\nval_end = 1997-%02u-10\n", 1 + u8(b) % 12,
                1 + u8(b) % 28, 1 + u8(b) % 12);
    ini_add(s, "target_columns = %u\n", u8(b) % 4);
    if (one_in(b, 3)) ini_add(s, "feature_columns = 0,%u\n", u8(b) % 4);
    ini_add(s, "batch_size = %u\nshuffle = %s\nstandardize = %s\n", 1 + u8(b) % 5, flag(b),
            flag(b));
}

/* hdf5_graph node mode: one graph of N nodes. */
static void layout_node(hid_t f, bytes *b, setup *s) {
    int64_t N = 1 + u8(b) % 10, F = 1 + u8(b) % 3, E = u8(b) % 16, C = 1 + u8(b) % 4;
    put(f, "/features", H5T_NATIVE_FLOAT, 2, (int64_t[]){N, F}, K_FEAT, 0, b);
    put(f, "/edge_index", H5T_NATIVE_LLONG, 2, (int64_t[]){2, E}, K_INDEX, N, b);
    put(f, "/labels", H5T_NATIVE_LLONG, 1, (int64_t[]){N}, K_LABEL, C, b);
    put(f, "/train_mask", H5T_NATIVE_UCHAR, 1, (int64_t[]){N}, K_MASK, 0, b);
    put(f, "/val_mask", H5T_NATIVE_UCHAR, 1, (int64_t[]){N}, K_MASK, 0, b);
    put(f, "/test_mask", H5T_NATIVE_UCHAR, 1, (int64_t[]){N}, K_MASK, 0, b);
    if (one_in(b, 2)) put_attr_int(f, "num_classes", (int64_t)(u8(b) % 8) - 1);
    s->plugin = "hdf5_graph";
    ini_add(s, "add_self_loops = %s\nrow_normalize = %s\n", flag(b), flag(b));
}

/* hdf5_graph graphs mode: G small graphs in CSR storage. */
static void layout_graphs(hid_t f, bytes *b, setup *s) {
    int64_t G = 1 + u8(b) % 6, per = 1 + u8(b) % 3, F = 1 + u8(b) % 3, K = 1 + u8(b) % 2;
    int64_t N = G * per, E = G * (u8(b) % 3);
    put(f, "/x", H5T_NATIVE_FLOAT, 2, (int64_t[]){N, F}, K_FEAT, 0, b);
    put(f, "/edge_index", H5T_NATIVE_LLONG, 2, (int64_t[]){2, E}, K_INDEX, per, b);
    put(f, "/node_ptr", H5T_NATIVE_LLONG, 1, (int64_t[]){G + 1}, K_PTR, N, b);
    put(f, "/edge_ptr", H5T_NATIVE_LLONG, 1, (int64_t[]){G + 1}, K_PTR, E, b);
    if (K == 1)
        put(f, "/y", H5T_NATIVE_FLOAT, 1, (int64_t[]){G}, K_FEAT, 0, b);
    else
        put(f, "/y", H5T_NATIVE_FLOAT, 2, (int64_t[]){G, K}, K_FEAT, 0, b);
    put(f, "/train_mask", H5T_NATIVE_UCHAR, 1, (int64_t[]){G}, K_MASK, 0, b);
    put(f, "/val_mask", H5T_NATIVE_UCHAR, 1, (int64_t[]){G}, K_MASK, 0, b);
    put(f, "/test_mask", H5T_NATIVE_UCHAR, 1, (int64_t[]){G}, K_MASK, 0, b);
    s->plugin = "hdf5_graph";
    ini_add(s, "mode = graphs\nbatch_size = %u\nshuffle = %s\ndrop_last = %s\n", 1 + u8(b) % 4,
            flag(b), flag(b));
    ini_add(s, "add_self_loops = %s\nrow_normalize = %s\nstandardize_targets = %s\n", flag(b),
            flag(b), flag(b));
}

/* ---- running the loader ------------------------------------------------ */

/* Every float value a loader hands out must be finite. */
static void check_batch(const pl_batch *bt, const char *ini) {
    for (int i = 0; i < bt->n; i++) {
        const pl_tensor *t = bt->fields[i];
        if (t->dtype != PL_F32 && t->dtype != PL_F64) continue;
        pl_tensor *h = pl_tensor_to(t, t->dtype, PL_CPU); /* contiguous copy */
        if (!h) continue;
        int64_t n = pl_tensor_numel(h);
        for (int64_t j = 0; j < n; j++) {
            double v = t->dtype == PL_F32 ? ((const float *)pl_tensor_data(h))[j]
                                          : ((const double *)pl_tensor_data(h))[j];
            if (!isfinite(v)) {
                fprintf(stderr,
                        "fuzz_hdf5: batch %lld field '%s' element %lld is %g\n--- [data]\n%s",
                        (long long)bt->index, bt->names[i], (long long)j, v, ini);
                abort();
            }
        }
        pl_tensor_release(h);
    }
}

/* Runs the loader; true when its create() accepted the file. */
static bool run_loader(const setup *s, bytes *b) {
    bool created = false;
    pl_harness *h = pl_harness_new_in(PL_FUZZ_PLUGIN_DIR, "data", s->plugin, s->ini);
    if (!h) return false;
    const pl_loader_vtable *vt = pl_harness_vtable(h);
    pl_field_list fields = {0};
    (void)vt->batch_fields(pl_harness_section(h), &fields);
    void *self = NULL;
    if (pl_harness_create(h, &self) == PL_OK) {
        created = true;
        for (int sp = 0; sp < PL_SPLIT_COUNT; sp++) {
            int64_t nb = vt->num_batches(self, (pl_data_split)sp);
            int64_t start = one_in(b, 8) ? (int64_t)(u8(b) % 6) - 1 : 0;
            if (vt->epoch_begin(self, (pl_data_split)sp, u8(b) % 2, start) != PL_OK) continue;
            pl_batch bt;
            for (int k = 0; k <= nb + 1 && vt->next(self, &bt) == 1; k++)
                check_batch(&bt, s->ini);
        }
        if (vt->stats) (void)vt->stats(self);
    }
    pl_harness_destroy(h, self);
    pl_harness_free(h);
    return created;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    H5open();
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    /* HDF5 keeps what it frees on its own free lists without bound: each
     * file open callocs a metadata cache of more than 512 KiB, which ASan
     * would otherwise map fresh (page faults) at every execution */
    H5set_free_list_limits(-1, -1, -1, -1, -1, -1);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 4096) return 0;
    fz_dir("hdf5");
    bytes b = {data, size, 0};
    unsigned b0 = u8(&b), mode = b0 % 4;
    g_storage = (storage)((b0 >> 2) % 8);
    g_hostile = false;
    g_puts = 0;
    fz_remove("src.h5");
    fz_remove("ext.bin");
    const char *path = fz_write("in.h5", "", 0);
    snprintf(g_dir_path, sizeof g_dir_path, "%s", path);
    char *slash = strrchr(g_dir_path, '/');
    if (slash) *slash = 0;
    char file_path[1024];
    snprintf(file_path, sizeof file_path, "%s", path);
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_libver_bounds(fapl, H5F_LIBVER_LATEST, H5F_LIBVER_LATEST);
    hid_t f = H5Fcreate(file_path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    if (f < 0) abort();
    setup s = {0};
    ini_add(&s, "path = %s\n", file_path);
    switch (mode) {
    case 0:
        layout_rows(f, &b, &s);
        break;
    case 1:
        layout_series(f, &b, &s);
        break;
    case 2:
        layout_node(f, &b, &s);
        break;
    default:
        layout_graphs(f, &b, &s);
        break;
    }
    if (H5Fclose(f) < 0) abort();
    if (g_storage == ST_TRUNCATE || g_storage == ST_SUPERBLOCK) {
        FILE *fp = fopen(file_path, "r+b");
        if (!fp || fseek(fp, 0, SEEK_END) != 0) abort();
        long size = ftell(fp);
        if (size <= 0) abort();
        if (g_storage == ST_TRUNCATE) {
            fclose(fp);
            if (truncate(file_path, (off_t)((u16(&b) << 8 | u8(&b)) % size)) != 0) abort();
        } else {
            /* the signature or the version byte: libhdf5 1.10 itself leaks
             * when later superblock fields are bad (not this harness's target) */
            long at = (long)(u8(&b) % 9);
            unsigned char v = (unsigned char)u8(&b);
            if (at < size && (fseek(fp, at, SEEK_SET) != 0 || fwrite(&v, 1, 1, fp) != 1)) abort();
            fclose(fp);
        }
    }
    bool created = run_loader(&s, &b);
    if (created && g_hostile) {
        fprintf(stderr,
                "fuzz_hdf5: a file whose first dataset has %s storage was accepted\n"
                "--- [data]\n%s",
                g_storage <= ST_VIRTUAL_MISSING ? "virtual" : "external", s.ini);
        abort();
    }
    return 0;
}
