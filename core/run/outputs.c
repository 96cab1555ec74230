/* outputs.c - a model's outputs (plugin.h pl_outputs, ABI 2.9) into an HDF5
 * file: what `pipeline predict` (core/services/predict.c) and the run's
 * export phase (trainer_phases.c) write. The model names tensors in its
 * outputs_begin / outputs_batch; the file is written here with
 * libpipeline_hdf5's pl_h5_outputs_* (plugins/common/hdf5), under a temporary
 * name renamed when complete, so no model writes HDF5 for these commands and
 * libpipeline_core stays free of HDF5 (docs/architecture.md, "Model outputs").
 */
#include <stdio.h>
#include <string.h>

#include "pl_h5.h"
#include "trainer_internal.h"

bool tr_outputs_supported(const trainer *t) {
    const pl_model_vtable *M = MODEL(t);
    /* an older plugin's vtable ends before the ABI 2.9 members: never read them */
    return t->model.desc->abi_minor >= 9 && M->outputs_begin && M->outputs_batch;
}

pl_status tr_outputs_begin(trainer *t, pl_outputs_purpose purpose, const char *dest,
                           pl_meta *attrs, struct pl_h5_out **file, char *path_out, size_t n) {
    const char *model = t->model.desc->name;
    pl_outputs out;
    memset(&out, 0, sizeof out);
    out.attrs = attrs;
    *file = NULL;
    pl_frame_begin(); /* the tensors a model declares live until they are written */
    pl_status st = MODEL(t)->outputs_begin(t->model.self, purpose, &out);
    char path[4096];
    if (!st && purpose == PL_OUTPUTS_EXPORT && (!out.file[0] || strchr(out.file, '/')))
        st = pl_error_set(PL_ERR_INVALID, "model '%s': outputs_begin named the export file "
                          "'%s'; expected a file name without '/' (outputs_begin sets "
                          "out->file)", model, out.file);
    if (!st && snprintf(path, sizeof path, "%s%s%s", dest, purpose == PL_OUTPUTS_EXPORT ? "/" : "",
                        purpose == PL_OUTPUTS_EXPORT ? out.file : "") >= (int)sizeof path)
        st = pl_error_set(PL_ERR_INVALID, "%s: path too long", dest);
    if (!st) st = pl_h5_outputs_open(path, &out, file);
    pl_frame_end();
    if (!st && path_out) snprintf(path_out, n, "%s", path);
    if (st && st != PL_ERR_UNSUPPORTED) return pl_error_prefix(st, "model '%s' outputs", model);
    return st;
}

pl_status tr_outputs_batch(trainer *t, pl_outputs_purpose purpose, struct pl_h5_out *file,
                           const pl_batch *b, pl_data_split split) {
    pl_outputs out;
    out.n = 0;
    out.attrs = NULL;
    out.file[0] = '\0';
    pl_status st = MODEL(t)->outputs_batch(t->model.self, purpose, b, split, &out);
    if (!st) st = pl_h5_outputs_write(file, &out);
    return st;
}

pl_status tr_outputs_finish(trainer *t, pl_outputs_purpose purpose, struct pl_h5_out **file,
                            pl_status st) {
    if (st) {
        pl_h5_outputs_abandon(file);
        return st;
    }
    /* the model's end first: a file it says failed is never committed */
    if (MODEL(t)->outputs_end) st = MODEL(t)->outputs_end(t->model.self, purpose);
    if (st) {
        pl_h5_outputs_abandon(file);
        return st;
    }
    return pl_h5_outputs_commit(file);
}
