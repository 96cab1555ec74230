/* dtype.c - dtypes (names, sizes, parsing, the bf16 / f16 conversions) and
 * devices (names, parsing, equality): the bottom of the tensor layer. */
#include <errno.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- dtypes ---------------------------------------------------------- */

static const struct {
    const char *name, *alt;
    size_t size;
} g_dtypes[PL_DTYPE_COUNT] = {
    [PL_F32] = {"f32", "float32", 4}, [PL_BF16] = {"bf16", "bfloat16", 2},
    [PL_F16] = {"f16", "float16", 2}, [PL_I32] = {"i32", "int32", 4},
    [PL_I64] = {"i64", "int64", 8},   [PL_U8] = {"u8", "uint8", 1},
    [PL_NF4] = {"nf4", "nf4", 0},     [PL_F64] = {"f64", "float64", 8},
};

size_t pl_dtype_size(pl_dtype dt) { return (unsigned)dt < PL_DTYPE_COUNT ? g_dtypes[dt].size : 0; }
const char *pl_dtype_name(pl_dtype dt) {
    return (unsigned)dt < PL_DTYPE_COUNT ? g_dtypes[dt].name : "?";
}
size_t pl_dtype_nbytes(pl_dtype dt, int64_t numel) {
    if (dt == PL_NF4) return (size_t)((numel + 1) / 2);
    return (size_t)numel * pl_dtype_size(dt);
}
bool pl_dtype_is_float(pl_dtype dt) {
    return dt == PL_F32 || dt == PL_BF16 || dt == PL_F16 || dt == PL_F64;
}
pl_status pl_dtype_parse(const char *s, pl_dtype *out) {
    for (int i = 0; i < PL_DTYPE_COUNT; i++)
        if (!strcmp(s, g_dtypes[i].name) || !strcmp(s, g_dtypes[i].alt)) {
            *out = (pl_dtype)i;
            return PL_OK;
        }
    return pl_error_set(PL_ERR_INVALID,
                        "unknown dtype '%s' (expected f32, bf16, f16, i32, i64, u8, nf4, f64)", s);
}

/* RNE, NaN stays a quiet NaN: the bits every backend uses (kernel_math.h) */
uint16_t pl_f32_to_bf16(float f) {
    return pl_bf16_round(f);
}
float pl_bf16_to_f32(uint16_t h) {
    return pl_bf16_widen(h);
}
uint16_t pl_f32_to_f16(float f) {
    return pl_f16_round(f); /* IEEE binary16, RNE */
}
float pl_f16_to_f32(uint16_t u) {
    return pl_f16_widen(u);
}

/* ---- devices ----------------------------------------------------------- */

const char *pl_device_str(pl_device d, char *buf, size_t n) {
    const pl_backend *b = d.type == PL_DEVICE_CPU ? NULL : pl_backend_peek(d.type);
    if (d.type == PL_DEVICE_CPU)
        snprintf(buf, n, "cpu");
    else
        snprintf(buf, n, "%s:%d", b && b->name ? b->name : "cuda", d.index);
    return buf;
}
bool pl_device_eq(pl_device a, pl_device b) { return a.type == b.type && a.index == b.index; }

pl_status pl_device_spec(const char *s, char *name, size_t n, int *index) {
    size_t ln = strcspn(s, ":");
    long idx = 0;
    char *end = NULL;
    bool ok = ln > 0 && ln < n && strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789_") == ln;
    if (ok) {
        memcpy(name, s, ln);
        name[ln] = 0;
    }
    if (ok && s[ln] == ':') { /* an index, but not for cpu or auto */
        errno = 0;
        idx = strtol(s + ln + 1, &end, 10);
        ok = end != s + ln + 1 && !*end && errno == 0 && idx >= 0 && idx <= INT32_MAX &&
             strcmp(name, "cpu") != 0 && strcmp(name, "auto") != 0;
    }
    if (!ok)
        return pl_error_set(PL_ERR_INVALID, "bad device '%s' (expected cpu, auto, a backend name "
                            "such as cuda or strict, or NAME:N)", s);
    *index = (int)idx;
    return PL_OK;
}

pl_status pl_device_parse(const char *s, pl_device *out) {
    char name[64];
    int idx;
    if (pl_device_spec(s, name, sizeof name, &idx)) return pl_error_status();
    if (!strcmp(name, "cpu")) {
        *out = PL_CPU;
        return PL_OK;
    }
    const pl_backend *b = pl_backend_peek(PL_DEVICE_CUDA);
    if (!strcmp(name, "auto")) {
        *out = (b && b->device_count && b->device_count() > 0) ? (pl_device){PL_DEVICE_CUDA, 0}
                                                                : PL_CPU;
        return PL_OK;
    }
    /* NAME[:N]: the backend of that name must be the one holding the accelerator slot */
    if (!b)
        return pl_error_set(PL_ERR_DEVICE,
                            "device '%s' requested but no backend plugin is loaded for it", s);
    if (strcmp(b->name, name) != 0)
        return pl_error_set(PL_ERR_DEVICE,
                            "device '%s' requested but the accelerator backend loaded in this "
                            "process is '%s'",
                            s, b->name);
    *out = (pl_device){PL_DEVICE_CUDA, idx};
    return PL_OK;
}
