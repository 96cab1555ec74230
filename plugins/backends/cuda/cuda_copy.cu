/* cuda_copy.cu - the CUDA copy, cast and shape kernels: strided copies with dtype
 * conversion (pl_cu_strided_copy), copy / reshape / cast, permute / slice / concat. */
#include <cublas_v2.h>
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_common.cuh"

/* ---- strided copy / conversion ------------------------------------------------------ */

static __device__ __forceinline__ bool is_int_dt(int dt) {
    return dt == PL_I32 || dt == PL_I64 || dt == PL_U8;
}

static __device__ __forceinline__ double ld_any(const void *p, int dt, int64_t i) {
    switch (dt) {
    case PL_F32: return ((const float *)p)[i];
    case PL_F64: return ((const double *)p)[i];
    case PL_BF16: return pl_d_bf16_to_f32(((const uint16_t *)p)[i]);
    case PL_F16: return pl_d_f16_to_f32(((const uint16_t *)p)[i]);
    case PL_I32: return ((const int32_t *)p)[i];
    case PL_I64: return (double)((const int64_t *)p)[i];
    case PL_U8: return ((const uint8_t *)p)[i];
    default: return 0.0;
    }
}

static __device__ __forceinline__ void st_any(void *p, int dt, int64_t i, double v) {
    switch (dt) {
    case PL_F32: ((float *)p)[i] = (float)v; break;
    case PL_F64: ((double *)p)[i] = v; break;
    case PL_BF16: ((uint16_t *)p)[i] = pl_d_f32_to_bf16((float)v); break;
    case PL_F16: ((uint16_t *)p)[i] = pl_d_f32_to_f16((float)v); break;
    case PL_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case PL_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case PL_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    default: break;
    }
}

static __device__ __forceinline__ int64_t ld_int(const void *p, int dt, int64_t i) {
    switch (dt) {
    case PL_I32: return ((const int32_t *)p)[i];
    case PL_I64: return ((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i];
    }
}

static __device__ __forceinline__ void st_int(void *p, int dt, int64_t i, int64_t v) {
    switch (dt) {
    case PL_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case PL_I64: ((int64_t *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = (uint8_t)v; break;
    }
}

/* element i (row-major over g.shape) -> (src offset, dst offset) */
static __device__ __forceinline__ void geom_offsets(const pl_cu_geom &g, int64_t i, bool dcontig,
                                                    int64_t *so, int64_t *dof) {
    int64_t s = 0, d = 0, r = i;
    for (int k = g.nd - 1; k >= 0; k--) {
        int64_t c = r % g.shape[k];
        r /= g.shape[k];
        s += c * g.sstride[k];
        d += c * g.dstride[k];
    }
    *so = s;
    *dof = dcontig ? i : d;
}

template <typename T>
__global__ void k_strided_same(T *dst, const T *src, pl_cu_geom g, int64_t n, bool dcontig) {
    GRID_LOOP(i, n) {
        int64_t so, dof;
        geom_offsets(g, i, dcontig, &so, &dof);
        dst[dof] = src[so];
    }
}

__global__ void k_strided_conv(void *dst, int ddt, const void *src, int sdt, pl_cu_geom g,
                               int64_t n, bool dcontig) {
    bool ints = is_int_dt(ddt) && is_int_dt(sdt);
    GRID_LOOP(i, n) {
        int64_t so, dof;
        geom_offsets(g, i, dcontig, &so, &dof);
        if (ints)
            st_int(dst, ddt, dof, ld_int(src, sdt, so));
        else if (sdt == PL_F64 && (ddt == PL_BF16 || ddt == PL_F16))
            st_any(dst, ddt, dof, (double)(float)ld_any(src, sdt, so)); /* CPU rounds via f32 too */
        else
            st_any(dst, ddt, dof, ld_any(src, sdt, so));
    }
}

pl_status pl_cu_strided_copy(void *dst, int ddt, const void *src, int sdt, const pl_cu_geom *g,
                             int64_t n, bool dst_contig) {
    if (n <= 0) return PL_OK;
    pl_cu_geom gg = *g;
    if (gg.nd == 0) {
        gg.nd = 1;
        gg.shape[0] = 1;
        gg.sstride[0] = gg.dstride[0] = 1;
    }
    unsigned nb = pl_cu_blocks(n);
    if (ddt == sdt) {
        switch (pl_dtype_size((pl_dtype)sdt)) {
        case 1: k_strided_same<uint8_t><<<nb, PL_CUDA_THREADS>>>((uint8_t *)dst, (const uint8_t *)src, gg, n, dst_contig); break;
        case 2: k_strided_same<uint16_t><<<nb, PL_CUDA_THREADS>>>((uint16_t *)dst, (const uint16_t *)src, gg, n, dst_contig); break;
        case 4: k_strided_same<uint32_t><<<nb, PL_CUDA_THREADS>>>((uint32_t *)dst, (const uint32_t *)src, gg, n, dst_contig); break;
        case 8: k_strided_same<uint64_t><<<nb, PL_CUDA_THREADS>>>((uint64_t *)dst, (const uint64_t *)src, gg, n, dst_contig); break;
        default:
            return pl_error_set(PL_ERR_DTYPE, "cuda copy: dtype %s not supported",
                                pl_dtype_name((pl_dtype)sdt));
        }
    } else {
        k_strided_conv<<<nb, PL_CUDA_THREADS>>>(dst, ddt, src, sdt, gg, n, dst_contig);
    }
    CUDA_LAUNCHED("copy");
    return PL_OK;
}

void pl_cu_geom_contig(pl_cu_geom *g, int nd, const int64_t *shape) {
    g->nd = nd;
    int64_t s = 1;
    for (int k = nd - 1; k >= 0; k--) {
        g->shape[k] = shape[k];
        g->sstride[k] = g->dstride[k] = s;
        s *= shape[k];
    }
}

const float *pl_cu_as_f32(const pl_tensor *t, pl_cu_scratch *s, pl_status *st) {
    if (t->dtype == PL_F32) return cf(t);
    int64_t n = pl_tensor_numel(t);
    float *p = (float *)pl_cu_scratch_get(s, t->device, (size_t)n * sizeof(float));
    if (!p) {
        *st = PL_ERR_NOMEM;
        return NULL;
    }
    pl_cu_geom g;
    pl_cu_geom_contig(&g, t->ndim, t->shape);
    *st = pl_cu_strided_copy(p, PL_F32, pl_tensor_data(t), t->dtype, &g, n, true);
    return *st ? NULL : p;
}

static bool copyable(pl_dtype dt) { return dt != PL_NF4 && pl_dtype_size(dt) > 0; }

/* PL_OP_COPY: out[0] (contiguous) <- in[0] (any strides, any non-nf4 dtype) */
static pl_status k_copy_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    pl_tensor *o = a->out[0];
    if (!copyable(x->dtype) || !copyable(o->dtype))
        return pl_error_set(PL_ERR_DTYPE, "cuda copy: cannot convert %s -> %s",
                            pl_dtype_name(x->dtype), pl_dtype_name(o->dtype));
    if (pl_cu_set_device(x)) return pl_error_status();
    int64_t n = pl_tensor_numel(x);
    if (n == 0) return PL_OK;
    if (x->dtype == o->dtype && pl_tensor_is_contiguous(x)) {
        CUDA_TRY(cudaMemcpy(pl_tensor_data(o), pl_tensor_data(x), pl_tensor_nbytes(x),
                            cudaMemcpyDeviceToDevice));
        return PL_OK;
    }
    pl_cu_geom g;
    pl_cu_geom_contig(&g, x->ndim, x->shape);
    for (int k = 0; k < x->ndim; k++)
        g.sstride[k] = x->stride[k];
    return pl_cu_strided_copy(pl_tensor_data(o), o->dtype, pl_tensor_data(x), x->dtype, &g, n, true);
}

/* The gradient of copy / reshape / cast is the incoming f32 gradient. */
static pl_status k_grad_identity_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(a->in[0])) return pl_error_status();
    CUDA_TRY(cudaMemcpy(pl_tensor_data(a->out[0]), pl_tensor_data(a->in[0]),
                        (size_t)pl_tensor_numel(a->out[0]) * sizeof(float),
                        cudaMemcpyDeviceToDevice));
    return PL_OK;
}

/* PL_OP_RESHAPE forward (when run as a copy): same bytes */
static pl_status k_bytes_fwd(const pl_kernel_args *a) {
    if (pl_cu_set_device(a->in[0])) return pl_error_status();
    size_t n = pl_tensor_nbytes(a->in[0]);
    if (n) CUDA_TRY(cudaMemcpy(pl_tensor_data(a->out[0]), pl_tensor_data(a->in[0]), n,
                               cudaMemcpyDeviceToDevice));
    return PL_OK;
}

/* PL_OP_CAST: contiguous conversion between f32 / bf16 / f16 / f64 */
static pl_status k_cast_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    pl_tensor *o = a->out[0];
    if (!pl_dtype_is_float(x->dtype) || !pl_dtype_is_float(o->dtype))
        return pl_error_set(PL_ERR_DTYPE, "cuda cast: %s -> %s is not a float conversion",
                            pl_dtype_name(x->dtype), pl_dtype_name(o->dtype));
    if (pl_cu_set_device(x)) return pl_error_status();
    pl_cu_geom g;
    pl_cu_geom_contig(&g, x->ndim, x->shape);
    return pl_cu_strided_copy(pl_tensor_data(o), o->dtype, pl_tensor_data(x), x->dtype, &g,
                              pl_tensor_numel(x), true);
}

/* ---- permute / slice / concat (strided copies) ----------------------------------------- */

/* dst (contiguous, shape = sshape permuted by perm) <- src contiguous [sshape] */
static pl_status permute_copy(void *dst, const void *src, int dt, int nd, const int64_t *sshape,
                              const int64_t *perm) {
    int64_t ss[PL_MAX_DIMS], s = 1, dshape[PL_MAX_DIMS];
    for (int i = nd - 1; i >= 0; i--) {
        ss[i] = s;
        s *= sshape[i];
    }
    pl_cu_geom g;
    for (int i = 0; i < nd; i++)
        dshape[i] = sshape[perm[i]];
    pl_cu_geom_contig(&g, nd, dshape);
    for (int i = 0; i < nd; i++)
        g.sstride[i] = ss[perm[i]];
    return pl_cu_strided_copy(dst, dt, src, dt, &g, s, true);
}

static pl_status k_permute_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    if (pl_cu_set_device(x)) return pl_error_status();
    return permute_copy(pl_tensor_data(a->out[0]), pl_tensor_data(x), x->dtype, x->ndim, x->shape,
                        a->p.perm);
}

static pl_status k_permute_bwd(const pl_kernel_args *a) {
    const pl_tensor *g = a->in[0];
    if (!a->out[0]) return PL_OK;
    if (pl_cu_set_device(g)) return pl_error_status();
    int64_t inv[PL_MAX_DIMS];
    for (int i = 0; i < g->ndim; i++)
        inv[a->p.perm[i]] = i;
    return permute_copy(pl_tensor_data(a->out[0]), pl_tensor_data(g), PL_F32, g->ndim, g->shape,
                        inv);
}

#define split3 pl_dim_split /* t as [outer, t.shape[dim], inner] (backend_util.h) */

/* Copy a [O, L, I] block between [O, Ks, I] (at ks0) and [O, Kd, I] (at kd0). */
static pl_status block_copy(void *dst, int64_t Kd, int64_t kd0, const void *src, int64_t Ks,
                            int64_t ks0, int64_t O, int64_t L, int64_t I, int dt) {
    size_t es = pl_dtype_size((pl_dtype)dt);
    if (O * L * I == 0) return PL_OK;
    CUDA_TRY(cudaMemcpy2D((char *)dst + (size_t)(kd0 * I) * es, (size_t)(Kd * I) * es,
                          (const char *)src + (size_t)(ks0 * I) * es, (size_t)(Ks * I) * es,
                          (size_t)(L * I) * es, (size_t)O, cudaMemcpyDeviceToDevice));
    return PL_OK;
}

static pl_status k_slice_fwd(const pl_kernel_args *a) {
    const pl_tensor *x = a->in[0];
    if (pl_cu_set_device(x)) return pl_error_status();
    int64_t O, K, I, L = a->p.end - a->p.start;
    split3(x, (int)a->p.dim, &O, &K, &I);
    return block_copy(pl_tensor_data(a->out[0]), L, 0, pl_tensor_data(x), K, a->p.start, O, L, I,
                      x->dtype);
}

static pl_status k_slice_bwd(const pl_kernel_args *a) {
    if (!a->out[0]) return PL_OK;
    const pl_tensor *x = a->in[1];
    if (pl_cu_set_device(x)) return pl_error_status();
    int64_t O, K, I, L = a->p.end - a->p.start;
    split3(x, (int)a->p.dim, &O, &K, &I);
    CUDA_TRY(cudaMemset(pl_tensor_data(a->out[0]), 0, (size_t)pl_tensor_numel(x) * sizeof(float)));
    return block_copy(pl_tensor_data(a->out[0]), K, a->p.start, pl_tensor_data(a->in[0]), L, 0, O,
                      L, I, PL_F32);
}

static pl_status k_concat_fwd(const pl_kernel_args *a) {
    const pl_tensor *out = a->out[0];
    int d = (int)a->p.dim;
    if (pl_cu_set_device(out)) return pl_error_status();
    int64_t O, Kt, I, koff = 0;
    split3(out, d, &O, &Kt, &I);
    for (int j = 0; j < a->n_in; j++) {
        int64_t Kj = a->in[j]->shape[d];
        if (block_copy(pl_tensor_data(out), Kt, koff, pl_tensor_data(a->in[j]), Kj, 0, O, Kj, I,
                       out->dtype))
            return pl_error_status();
        koff += Kj;
    }
    return PL_OK;
}

static pl_status k_concat_bwd(const pl_kernel_args *a) {
    int d = (int)a->p.dim, n = (int)a->p.start;
    const pl_tensor *g = a->in[0];
    if (pl_cu_set_device(g)) return pl_error_status();
    int64_t O, Kt, I, koff = 0;
    split3(g, d, &O, &Kt, &I);
    for (int j = 0; j < n; j++) {
        int64_t Kj = a->in[1 + j]->shape[d];
        if (a->out[j] && block_copy(pl_tensor_data(a->out[j]), Kj, 0, pl_tensor_data(g), Kt, koff,
                                    O, Kj, I, PL_F32))
            return pl_error_status();
        koff += Kj;
    }
    return PL_OK;
}

/* ---- registration ------------------------------------------------------------------------ */

void pl_cuda_register_copy(pl_kernel_table *t) {
    pl_kernel_table_set(t, PL_OP_COPY, k_copy_fwd, k_grad_identity_bwd);
    pl_kernel_table_set(t, PL_OP_RESHAPE, k_bytes_fwd, k_grad_identity_bwd);
    pl_kernel_table_set(t, PL_OP_CAST, k_cast_fwd, k_grad_identity_bwd);
    pl_kernel_table_set(t, PL_OP_PERMUTE, k_permute_fwd, k_permute_bwd);
    pl_kernel_table_set(t, PL_OP_SLICE, k_slice_fwd, k_slice_bwd);
    pl_kernel_table_set(t, PL_OP_CONCAT, k_concat_fwd, k_concat_bwd);
}
