/* qlora4.c - QLoRA precision (Dettmers et al. 2023): frozen base weights
 * stored as 4-bit NormalFloat (NF4), adapters and everything trainable in
 * f32, matmuls in compute_dtype (bf16 by default, autocast).
 *
 * setup(): every parameter tagged PL_TAG_BASE that is 2-D, frozen
 * (requires_grad false), floating and matches `targets` is quantized with
 * pl_nf4_quantize(block_size, double_quant) and replaced in the parameter
 * list (pl_params_replace): the float tensor is released right after it is
 * quantized, before the next one (its memory returns to the allocator, or
 * for a model's pl_st_view checkpoint view its pages are dropped, unless
 * the model still holds a reference of its own), so a bf16 backbone is
 * never resident whole next to its nf4 codes. Every other floating
 * parameter (trainable ones, frozen ones not quantized, buffers) is
 * converted to f32 in place (common/prec_convert.h). Models call
 * pl_nf4_matmul(x, W) for a base weight whose dtype is nf4; every other op
 * refuses nf4 with PL_ERR_DTYPE. A second setup() (after init_from) keeps
 * already-quantized parameters.
 *
 * Checkpoints: the trainer saves each nf4 parameter as U8 packed codes under
 * its own name; this plugin's state adds, under stable versioned names
 * (prefixed "precision." by the trainer), for every quantized parameter P:
 *   qlora4.v1.P.absmax        f32 [n_blocks] or u8 [n_blocks] (double quant)
 *   qlora4.v1.P.absmax_scale  f32 [ceil(n_blocks/256)] (double quant only)
 *   qlora4.v1.P.absmax_mean   scalar (double quant only)
 *   qlora4.v1.P.block         scalar, elements per block
 *   qlora4.v1.P.codes_fnv     scalar, 32-bit FNV-1a of the packed codes (the
 *                             base reference: a resume onto other base codes
 *                             is refused)
 * pl_nf4_load_into (pipeline/nf4.h) reads the same names to load a qlora4
 * checkpoint onto an fp32 / bf16 base (dequantized) or f32 weights onto a
 * quantized base (quantized).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pipeline/nf4.h>
#include <pipeline/pipeline.h>
#include "../common/prec_convert.h"
#include "../common/prec_load.h"

typedef struct qlora4 {
    pl_dtype compute;
    int64_t block;
    bool double_quant;
    char targets[512];
    int verbose;
    pl_params *params; /* borrowed from the run context */
    pl_run_context *ctx; /* borrowed from create: setup sets its autocast (plugin.h) */
    int n;          /* quantized parameters */
    char (*names)[PL_NAME_MAX];
    size_t bytes_before, bytes_after;
} qlora4;

static const pl_option_spec opts[] = {
    {"compute_dtype", PL_OPT_CHOICE, "bf16", PL_NO_BOUNDS, "bf16|f16|f32",
     "dtype matmuls run in (autocast); nf4 weights are dequantized into it"},
    {"block_size", PL_OPT_INT, "64", 2, 4096, NULL, "elements per absmax block (even)"},
    {"double_quant", PL_OPT_BOOL, "true", PL_NO_BOUNDS, NULL,
     "quantize the absmax constants to 8 bits in groups of 256 (0.5 -> 0.127 bit/param)"},
    {"targets", PL_OPT_STRING, "*", PL_NO_BOUNDS, NULL,
     "comma-separated globs: which PL_TAG_BASE 2-D frozen weights to quantize"},
    PL_OPTIONS_END};

static pl_status q_create(const pl_config_section *cfg, pl_run_context *ctx, void **self) {
    qlora4 *p = calloc(1, sizeof *p);
    if (!p) return pl_error_set(PL_ERR_NOMEM, "qlora4: out of memory");
    const char *cd = pl_cfg_str(cfg, "compute_dtype", "bf16");
    p->compute = !strcmp(cd, "f16") ? PL_F16 : !strcmp(cd, "f32") ? PL_F32 : PL_BF16;
    p->block = pl_cfg_int(cfg, "block_size", 64);
    if (p->block % 2) {
        free(p);
        return pl_error_set(PL_ERR_CONFIG, "qlora4: block_size %lld must be even (two codes per "
                            "byte never straddle blocks)", (long long)pl_cfg_int(cfg, "block_size", 64));
    }
    p->double_quant = pl_cfg_bool(cfg, "double_quant", true);
    snprintf(p->targets, sizeof p->targets, "%s", pl_cfg_str(cfg, "targets", "*"));
    p->verbose = ctx ? ctx->verbose : 0;
    p->params = ctx ? ctx->params : NULL;
    p->ctx = ctx;
    *self = p;
    return PL_OK;
}

static void q_destroy(void *self) {
    qlora4 *p = self;
    if (!p) return;
    free(p->names);
    free(p);
}

static bool known(const qlora4 *p, const char *name) {
    for (int i = 0; i < p->n; i++)
        if (!strcmp(p->names[i], name)) return true;
    return false;
}

static pl_status remember(qlora4 *p, const char *name) {
    if (known(p, name)) return PL_OK;
    void *nn = realloc(p->names, (size_t)(p->n + 1) * sizeof *p->names);
    if (!nn) return pl_error_set(PL_ERR_NOMEM, "qlora4: out of memory");
    p->names = nn;
    snprintf(p->names[p->n++], PL_NAME_MAX, "%s", name);
    return PL_OK;
}

/* Parameter i to NF4 when it is a frozen 2-D base weight the targets
 * name (from setup, or as the model seals it: q_convert_param). */
static pl_status quantize_at(qlora4 *p, pl_params *ps, int i) {
    pl_param *pp = pl_params_at(ps, i);
    if (!pp) return pl_error_status();
    pl_tensor *t = pp->t;
    if (t->dtype == PL_NF4) return remember(p, pp->name);
    if (!(pp->tags & PL_TAG_BASE) || t->requires_grad || t->ndim != 2 ||
        !(t->dtype == PL_F32 || t->dtype == PL_BF16 || t->dtype == PL_F16) ||
        !pl_name_matches(pp->name, p->targets))
        return PL_OK;
    size_t before = pl_tensor_nbytes(t);
    /* a new reference of ours, never adopted by a frame the caller (a model's
     * create, sealing a parameter) has open (nf4.h) */
    pl_tensor *q = pl_nf4_quantize(t, p->block, p->double_quant);
    if (!q) return pl_error_prefix(pl_error_status(), "qlora4: quantizing '%s'", pp->name);
    pl_status st = pl_params_replace(ps, i, q);
    pl_tensor_release(q);
    if (!st) st = remember(p, pp->name);
    if (st) return st;
    p->bytes_before += before;
    p->bytes_after += pl_tensor_storage_nbytes(q);
    return PL_OK;
}

static pl_status q_convert_param(void *self, pl_params *ps, int i) {
    return quantize_at(self, ps, i);
}

static pl_status q_setup(void *self, pl_params *ps) {
    qlora4 *p = self;
    p->params = ps;
    if (p->ctx) p->ctx->autocast = p->compute;
    for (int i = 0; i < pl_params_count(ps); i++) {
        pl_status st = quantize_at(p, ps, i);
        if (st) return st;
    }
    pl_status st = pl_prec_convert_params(ps, PL_F32, "qlora4", NULL);
    if (st) return st;
    if (p->verbose)
        pl_message("qlora4: %d base weights in nf4 (%zu -> %zu bytes), compute %s", p->n,
                   p->bytes_before, p->bytes_after, pl_dtype_name(p->compute));
    return PL_OK;
}

static double q_loss_scale(void *self) {
    (void)self;
    return 1.0;
}

static bool q_before_step(void *self, pl_params *ps) {
    (void)self;
    (void)ps;
    return true;
}

static uint32_t fnv1a(const uint8_t *d, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ d[i]) * 16777619u;
    return h;
}

/* FNV of the codes (host copy for device tensors). */
static pl_status codes_hash(const pl_tensor *q, double *out) {
    size_t nb = pl_nf4_code_nbytes(q);
    if (q->device.type == PL_DEVICE_CPU) {
        *out = (double)fnv1a(pl_tensor_data(q), nb);
        return PL_OK;
    }
    pl_frame_begin();
    pl_tensor *h = pl_tensor_to(q, PL_NF4, PL_CPU);
    if (h) *out = (double)fnv1a(pl_tensor_data(h), nb);
    pl_frame_end();
    return h ? PL_OK : pl_error_status();
}

static pl_status q_state(void *self, const pl_state_visitor *v) {
    qlora4 *p = self;
    char key[PL_NAME_MAX + 64];
    pl_status st = PL_OK;
    for (int i = 0; i < p->n && !st; i++) {
        const char *name = p->names[i];
        pl_param *pp = p->params ? pl_params_find(p->params, name) : NULL;
        if (!pp || pp->t->dtype != PL_NF4)
            return pl_error_set(PL_ERR_INTERNAL, "qlora4: quantized parameter '%s' is no longer in "
                                "the parameter list as nf4", name);
        pl_tensor *q = pp->t;
        double block = (double)q->quant.block;
        snprintf(key, sizeof key, "qlora4.v1.%s.block", name);
        st = v->scalar(v->ctx, key, &block);
        if (!st && (int64_t)block != q->quant.block)
            st = pl_error_set(PL_ERR_IO, "qlora4: checkpoint quantized '%s' with block %lld, this run "
                              "uses %lld", name, (long long)block, (long long)q->quant.block);
        snprintf(key, sizeof key, "qlora4.v1.%s.absmax", name);
        if (!st) st = v->tensor(v->ctx, key, q->quant.absmax);
        if (!st && q->quant.absmax_scale) {
            snprintf(key, sizeof key, "qlora4.v1.%s.absmax_scale", name);
            st = v->tensor(v->ctx, key, q->quant.absmax_scale);
            double mean = (double)q->quant.absmax_mean;
            snprintf(key, sizeof key, "qlora4.v1.%s.absmax_mean", name);
            if (!st) st = v->scalar(v->ctx, key, &mean);
            if (!st) q->quant.absmax_mean = (float)mean;
        }
        /* base reference: the codes in the parameter (loaded before the state
         * on resume) must be the codes the state belongs to */
        double h = 0, rec = 0;
        if (!st) st = codes_hash(q, &h);
        rec = h;
        snprintf(key, sizeof key, "qlora4.v1.%s.codes_fnv", name);
        if (!st) st = v->scalar(v->ctx, key, &rec);
        if (!st && rec != h)
            st = pl_error_set(PL_ERR_IO, "qlora4: nf4 codes of '%s' (fnv %.0f) are not the base the "
                              "checkpoint's quantization state belongs to (fnv %.0f)", name, h, rec);
    }
    return st;
}

static const pl_precision_vtable vt = {
    .create = q_create,
    .destroy = q_destroy,
    .setup = q_setup,
    .loss_scale = q_loss_scale,
    .before_step = q_before_step,
    .state = q_state,
    .load_param = pl_prec_load_param,
    .convert_param = q_convert_param,
};

PL_PLUGIN_DEFINE(qlora4, PL_KIND_PRECISION, "1.0.0",
                 "QLoRA: frozen base weights in NF4 (+double quant), bf16 compute", opts, &vt)
