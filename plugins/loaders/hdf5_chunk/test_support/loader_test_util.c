#include "loader_test_util.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"
#include "registry.h"
#include "runobjs.h"

pl_status lt_open(lt_loader *L, const char *plugin, const char *body, const char *run_dir) {
    memset(L, 0, sizeof *L);
    pl_registry *reg = pl_registry_new();
    pl_registry_add_dir(reg, PL_TEST_PLUGIN_DIR);
    pl_registry_add_dir(reg, PL_LOADER_TEST_PLUGIN_DIR);
    size_t n = strlen(body) + 256;
    char *ini = malloc(n);
    snprintf(ini, n, "[data]\nplugin = %s\n%s\n[model]\nplugin = test_null_model\n", plugin, body);
    pl_config *cfg = pl_config_load_string(ini, "test.ini", NULL, 0, NULL, reg);
    free(ini);
    L->reg = reg;
    if (!cfg) {
        pl_status st = pl_error_status();
        pl_registry_free(reg);
        L->reg = NULL;
        return st;
    }
    L->cfg = cfg;
    L->vt = pl_config_plugin(cfg, "data")->vtable;
    L->ctx.device = PL_CPU;
    L->ctx.seed = 42;
    L->ctx.run_dir = run_dir;
    L->ctx.meta = pl_meta_new();
    pl_status st = L->vt->create(pl_config_section_get(cfg, "data"), &L->ctx, &L->self);
    if (st) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", pl_error_message());
        L->self = NULL;
        lt_close(L);
        pl_error_set(st, "%s", msg);
    }
    return st;
}

void lt_close(lt_loader *L) {
    if (L->self) L->vt->destroy(L->self);
    L->self = NULL;
    if (L->cfg) pl_config_free(L->cfg);
    if (L->reg) pl_registry_free(L->reg);
    pl_meta_free(L->ctx.meta);
    memset(L, 0, sizeof *L);
}

int lt_write(const char *file, const char *name, long type, int ndim, const long long *dims, const void *data) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(file, H5F_ACC_RDWR, H5P_DEFAULT);
    if (f < 0) f = H5Fcreate(file, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) return -1;
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hsize_t d[8];
    for (int i = 0; i < ndim; i++) d[i] = (hsize_t)dims[i];
    hid_t sp = ndim ? H5Screate_simple(ndim, d, NULL) : H5Screate(H5S_SCALAR);
    hid_t ds = H5Dcreate2(f, name, (hid_t)type, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    int rc = ds < 0 ? -1 : (H5Dwrite(ds, (hid_t)type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0 ? -1 : 0);
    if (ds >= 0) H5Dclose(ds);
    H5Sclose(sp);
    H5Pclose(lcpl);
    H5Fclose(f);
    return rc;
}
