/* ddp.c - data-parallel strategy over MPI (and NCCL for CUDA tensors).
 *
 * Semantics: PyTorch DistributedDataParallel / Horovod. Every process runs
 * the same config; the trainer (core/run/dist.c) shards the data and calls
 * the collectives below in the same order on every rank. This plugin owns
 * the transport:
 *  - MPI (Open MPI from Debian's libopenmpi-dev) launches the processes
 *    (mpirun), and all-reduces host f32 gradients in buckets of
 *    bucket_cap_mb (DDP's bucket_cap_mb, 25 MB default), double-buffered:
 *    bucket k+1 is packed while bucket k is on the wire (MPI_Iallreduce);
 *  - NCCL (when built with it) all-reduces CUDA tensors in place, its
 *    communicator bootstrapped over MPI (ncclUniqueId broadcast from rank 0);
 *  - every wait is bounded by `timeout` seconds (PyTorch's default process
 *    group timeout, 1800 s): a rank that never answers is an error that
 *    names the collective and the time waited, not a hang. A rank that dies
 *    is seen sooner by mpirun, which ends the job.
 *  - lr_scaling publishes the factor the trainer multiplies every group's
 *    learning rate by (meta "strategy.lr_scale"): none (default), linear
 *    (x world size, Goyal et al. 2017, "Accurate, Large Minibatch SGD"), sqrt
 *    (x sqrt(world size), Krizhevsky 2014 / Hoffer et al. 2017).
 *
 * Test hook: PL_DDP_FAULT_INJECT="RANK:N" makes rank RANK kill itself
 * (SIGKILL) at its N-th collective, "RANK:N:hang" makes it stop answering
 * (sleep forever), so tests can prove that the others do not hang.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pipeline/plugin.h"

#ifdef PL_DDP_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

typedef struct ddp {
    MPI_Comm comm;
    int rank, world;
    double timeout;      /* seconds a collective may wait */
    size_t bucket_elems; /* f32 elements per all-reduce bucket */
    float *buf[2];       /* double buffer of host buckets */
    long calls;          /* collectives so far (fault injection) */
    int fault_rank;
    long fault_call;
    bool fault_hang;
#ifdef PL_DDP_NCCL
    ncclComm_t nccl;
    bool have_nccl;
#endif
} ddp;

static bool g_mpi_started_here;

static void finalize_at_exit(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin && g_mpi_started_here) MPI_Finalize();
}

/* Open MPI loads its components with dlopen and resolves libmpi's symbols
 * from the global scope; the core loads plugins (and so libmpi) with
 * RTLD_LOCAL. Promote the libmpi already mapped to global scope, and keep
 * this plugin mapped until exit (the atexit handler lives here). */
static void make_mpi_global(void) {
    Dl_info info;
    if (dladdr((void *)&MPI_Init, &info) && info.dli_fname)
        dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    if (dladdr((void *)&make_mpi_global, &info) && info.dli_fname)
        dlopen(info.dli_fname, RTLD_NOW | RTLD_NODELETE | RTLD_NOLOAD);
}

static pl_status mpi_error(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return pl_error_set(PL_ERR_IO, "ddp: %s failed: %s", what, msg);
}

static void maybe_fault(ddp *d) {
    d->calls++;
    if (d->fault_rank == d->rank && d->calls == d->fault_call) {
        fprintf(stderr, "ddp: rank %d: PL_DDP_FAULT_INJECT: %s at collective %ld\n", d->rank,
                d->fault_hang ? "hanging" : "killing this process", d->calls);
        fflush(stderr);
        if (!d->fault_hang) raise(SIGKILL);
        for (;;) sleep(1000);
    }
}

/* Wait for a nonblocking collective, at most d->timeout seconds. */
static pl_status wait_for(ddp *d, MPI_Request *req, const char *what) {
    double t0 = MPI_Wtime();
    long spins = 0;
    for (;;) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_error(rc, what);
        if (done) return PL_OK;
        double waited = MPI_Wtime() - t0;
        if (waited > d->timeout) {
            pl_hint_set("a rank died, hangs, or reached this point on another path; raise "
                        "[strategy] timeout for a slow step");
            return pl_error_set(PL_ERR_IO, "ddp: rank %d of %d waited %.0f s for %s (timeout = %g "
                                "s): the other ranks did not join", d->rank, d->world, waited,
                                what, d->timeout);
        }
        if (++spins > 2000) {
            struct timespec ts = {0, 50000}; /* 50 us: a long wait does not burn a core */
            nanosleep(&ts, NULL);
        }
    }
}

static void ddp_destroy(void *self) {
    ddp *d = self;
    if (!d) return;
#ifdef PL_DDP_NCCL
    if (d->have_nccl) ncclCommDestroy(d->nccl);
#endif
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && d->comm != MPI_COMM_NULL) MPI_Comm_free(&d->comm);
    free(d->buf[0]);
    free(d->buf[1]);
    free(d);
}

static pl_status ddp_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    int init = 0;
    MPI_Initialized(&init);
    if (!init) {
        make_mpi_global();
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Init_thread");
        g_mpi_started_here = true;
        atexit(finalize_at_exit);
    }
    ddp *d = calloc(1, sizeof *d);
    if (!d) return pl_error_set(PL_ERR_NOMEM, "ddp: state");
    d->comm = MPI_COMM_NULL;
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &d->comm);
    if (rc != MPI_SUCCESS) {
        ddp_destroy(d);
        return mpi_error(rc, "MPI_Comm_dup");
    }
    MPI_Comm_set_errhandler(d->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(d->comm, &d->rank);
    MPI_Comm_size(d->comm, &d->world);
    d->timeout = pl_cfg_float(cfg, "timeout", 1800);
    double cap_mb = pl_cfg_float(cfg, "bucket_cap_mb", 25);
    d->bucket_elems = (size_t)fmax(1024, cap_mb * 1048576.0 / sizeof(float));
    d->fault_rank = -1;
    const char *fi = getenv("PL_DDP_FAULT_INJECT");
    if (fi && sscanf(fi, "%d:%ld", &d->fault_rank, &d->fault_call) != 2) d->fault_rank = -1;
    d->fault_hang = fi && strstr(fi, ":hang");

    const char *rule = pl_cfg_str(cfg, "lr_scaling", "none");
    double f = !strcmp(rule, "linear") ? d->world : !strcmp(rule, "sqrt") ? sqrt(d->world) : 1.0;
    if (ctx && ctx->meta) pl_meta_set_float(ctx->meta, "strategy.lr_scale", f);

    const char *backend = pl_cfg_str(cfg, "backend", "auto");
    bool on_cuda = ctx && ctx->device.type == PL_DEVICE_CUDA;
    if (!strcmp(backend, "nccl") && !on_cuda) {
        ddp_destroy(d);
        return pl_error_set(PL_ERR_CONFIG, "ddp: backend = nccl needs pipeline.device = cuda "
                            "(this run is on the CPU)");
    }
#ifdef PL_DDP_NCCL
    if (on_cuda && strcmp(backend, "mpi") != 0 && d->world > 1) {
        ncclUniqueId id;
        if (d->rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) {
            ddp_destroy(d);
            return pl_error_set(PL_ERR_DEVICE, "ddp: ncclGetUniqueId failed");
        }
        rc = MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, d->comm);
        if (rc != MPI_SUCCESS) {
            ddp_destroy(d);
            return mpi_error(rc, "broadcasting the NCCL id");
        }
        if (cudaSetDevice(ctx->device.index) != cudaSuccess ||
            ncclCommInitRank(&d->nccl, d->world, id, d->rank) != ncclSuccess) {
            int r = d->rank, w = d->world;
            ddp_destroy(d);
            return pl_error_set(PL_ERR_DEVICE, "ddp: NCCL communicator for rank %d of %d on "
                                "cuda:%d could not be created", r, w, ctx->device.index);
        }
        d->have_nccl = true;
    }
#else
    if (!strcmp(backend, "nccl")) {
        ddp_destroy(d);
        return pl_error_set(PL_ERR_CONFIG, "ddp: backend = nccl, but this build has no NCCL "
                            "(configure with the CUDA toolkit and NCCL)");
    }
#endif
    *self = d;
    return PL_OK;
}

static int ddp_rank(void *self) { return ((ddp *)self)->rank; }
static int ddp_world_size(void *self) { return ((ddp *)self)->world; }

/* Host f32 tensors as one stream of floats, cut into buckets. */
typedef struct cursor {
    pl_tensor *const *ts;
    int n, i;   /* tensor */
    int64_t at; /* element within tensor i */
} cursor;

/* Copy up to `cap` floats from the stream at c into dst (pack) or from src
 * back into the stream (unpack); returns the count moved and advances c. */
static size_t move(cursor *c, float *buf, size_t cap, bool pack) {
    size_t k = 0;
    while (k < cap && c->i < c->n) {
        pl_tensor *t = c->ts[c->i];
        int64_t numel = pl_tensor_numel(t);
        int64_t take = numel - c->at;
        if ((size_t)take > cap - k) take = (int64_t)(cap - k);
        float *p = (float *)pl_tensor_data(t) + c->at;
        if (pack)
            memcpy(buf + k, p, (size_t)take * sizeof(float));
        else
            memcpy(p, buf + k, (size_t)take * sizeof(float));
        k += (size_t)take;
        c->at += take;
        if (c->at == numel) {
            c->i++;
            c->at = 0;
        }
    }
    return k;
}

static pl_status ddp_all_reduce_sum(void *self, pl_tensor *const *ts, int n) {
    ddp *d = self;
    maybe_fault(d);
    if (d->world == 1 || n == 0) return PL_OK;
    bool cuda = false;
    for (int i = 0; i < n; i++) {
        if (ts[i]->dtype != PL_F32)
            return pl_error_set(PL_ERR_INVALID, "ddp: all-reduce of tensor %d (%s): %s, expected "
                                "f32", i, ts[i]->name, pl_dtype_name(ts[i]->dtype));
        if (!pl_tensor_is_contiguous(ts[i]))
            return pl_error_set(PL_ERR_INVALID, "ddp: all-reduce of tensor %d (%s): not "
                                "contiguous", i, ts[i]->name);
        cuda |= ts[i]->device.type == PL_DEVICE_CUDA;
    }
    if (cuda) {
#ifdef PL_DDP_NCCL
        if (!d->have_nccl)
            return pl_error_set(PL_ERR_UNSUPPORTED, "ddp: CUDA gradients need the NCCL backend");
        if (ncclGroupStart() != ncclSuccess) return pl_error_set(PL_ERR_DEVICE, "ddp: ncclGroupStart");
        for (int i = 0; i < n; i++) {
            void *p = pl_tensor_data(ts[i]);
            if (ncclAllReduce(p, p, (size_t)pl_tensor_numel(ts[i]), ncclFloat, ncclSum, d->nccl,
                              0) != ncclSuccess) {
                ncclGroupEnd();
                return pl_error_set(PL_ERR_DEVICE, "ddp: ncclAllReduce of %s", ts[i]->name);
            }
        }
        if (ncclGroupEnd() != ncclSuccess || cudaStreamSynchronize(0) != cudaSuccess)
            return pl_error_set(PL_ERR_DEVICE, "ddp: NCCL all-reduce of %d gradients", n);
        return PL_OK;
#else
        return pl_error_set(PL_ERR_UNSUPPORTED, "ddp: CUDA gradients need NCCL, and this build "
                            "has none");
#endif
    }
    for (int b = 0; b < 2; b++)
        if (!d->buf[b] && !(d->buf[b] = malloc(d->bucket_elems * sizeof(float))))
            return pl_error_set(PL_ERR_NOMEM, "ddp: %zu-byte bucket", d->bucket_elems * sizeof(float));
    cursor pack = {ts, n, 0, 0}, unpack = {ts, n, 0, 0};
    MPI_Request req = MPI_REQUEST_NULL;
    size_t inflight = 0;
    int cur = 0;
    pl_status st = PL_OK;
    for (;;) {
        /* pack the next bucket while the previous one is reduced */
        size_t k = move(&pack, d->buf[cur], d->bucket_elems, true);
        if (inflight) {
            st = wait_for(d, &req, "the gradient all-reduce");
            if (st) return st;
            move(&unpack, d->buf[1 - cur], inflight, false);
            inflight = 0;
        }
        if (!k) break;
        int rc = MPI_Iallreduce(MPI_IN_PLACE, d->buf[cur], (int)k, MPI_FLOAT, MPI_SUM, d->comm, &req);
        if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Iallreduce (gradients)");
        inflight = k;
        cur = 1 - cur;
    }
    return st;
}

static pl_status ddp_all_reduce_f64(void *self, double *v, int64_t n) {
    ddp *d = self;
    maybe_fault(d);
    if (d->world == 1 || n == 0) return PL_OK;
    if (n > INT32_MAX) return pl_error_set(PL_ERR_INVALID, "ddp: %lld values", (long long)n);
    MPI_Request req;
    int rc = MPI_Iallreduce(MPI_IN_PLACE, v, (int)n, MPI_DOUBLE, MPI_SUM, d->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Iallreduce");
    return wait_for(d, &req, "an all-reduce of losses or metrics");
}

static pl_status ddp_broadcast_bytes(void *self, void *buf, size_t n, int root) {
    ddp *d = self;
    maybe_fault(d);
    if (d->world == 1 || n == 0) return PL_OK;
    if (n > INT32_MAX) return pl_error_set(PL_ERR_INVALID, "ddp: broadcast of %zu bytes", n);
    MPI_Request req;
    int rc = MPI_Ibcast(buf, (int)n, MPI_BYTE, root, d->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Ibcast");
    return wait_for(d, &req, "a broadcast from rank 0");
}

static pl_status ddp_barrier(void *self) {
    ddp *d = self;
    maybe_fault(d);
    if (d->world == 1) return PL_OK;
    MPI_Request req;
    int rc = MPI_Ibarrier(d->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_error(rc, "MPI_Ibarrier");
    return wait_for(d, &req, "a barrier");
}

static void ddp_abort(void *self, int code) {
    ddp *d = self;
    fprintf(stderr, "ddp: rank %d of %d failed (exit %d): stopping every rank\n", d->rank,
            d->world, code);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
    _exit(code ? code : 1);
}

static const pl_option_spec ddp_options[] = {
    {"backend", PL_OPT_CHOICE, "auto", PL_NO_BOUNDS, "auto|mpi|nccl",
     "transport of CUDA gradients: auto = NCCL on cuda when built with it, MPI otherwise"},
    {"bucket_cap_mb", PL_OPT_FLOAT, "25", 0.001, 4096, NULL,
     "MiB of gradients per all-reduce message (PyTorch DDP bucket_cap_mb)"},
    {"timeout", PL_OPT_FLOAT, "1800", 0.001, 1e9, NULL,
     "seconds a collective waits for the other ranks before failing (torch.distributed "
     "default timeout)"},
    {"lr_scaling", PL_OPT_CHOICE, "none", PL_NO_BOUNDS, "none|linear|sqrt",
     "learning rate x world size (linear, Goyal et al. 2017) or x sqrt(world size); none keeps "
     "the configured lr"},
    PL_OPTIONS_END};

static const pl_strategy_vtable ddp_vtable = {
    .create = ddp_create,
    .destroy = ddp_destroy,
    .rank = ddp_rank,
    .world_size = ddp_world_size,
    .all_reduce_sum = ddp_all_reduce_sum,
    .all_reduce_f64 = ddp_all_reduce_f64,
    .broadcast_bytes = ddp_broadcast_bytes,
    .barrier = ddp_barrier,
    .abort = ddp_abort,
};

PL_PLUGIN_DEFINE(ddp, PL_KIND_STRATEGY, "1.0.0",
                 "data-parallel training over MPI processes (NCCL for CUDA gradients): "
                 "PyTorch DDP semantics",
                 ddp_options, &ddp_vtable)
