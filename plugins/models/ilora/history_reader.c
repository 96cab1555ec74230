/* history_reader.c - reading the per-user history CSR (history_reader.h)
 * through the shared HDF5 helpers, under the process-wide HDF5 lock. */
#include "history_reader.h"

#include <stdlib.h>
#include <string.h>

#include "pl_h5.h"

/* offsets [U+1] must start at 0, never decrease and end at the item count. */
static pl_status check_csr(const char *path, const char *po, const char *pi, const ilora_hist *h,
                           int64_t no, int64_t ni) {
    if (no < 1 || h->offsets[0] != 0 || h->offsets[no - 1] != ni)
        return pl_error_set(PL_ERR_IO,
                            "%s: %s is not a CSR over %s (%lld offsets, first %lld, last %lld, "
                            "%lld items)",
                            path, po, pi, (long long)no, no ? (long long)h->offsets[0] : -1LL,
                            no ? (long long)h->offsets[no - 1] : -1LL, (long long)ni);
    for (int64_t u = 0; u + 1 < no; u++)
        if (h->offsets[u + 1] < h->offsets[u])
            return pl_error_set(PL_ERR_IO, "%s: %s decreases at user %lld", path, po, (long long)u);
    return PL_OK;
}

pl_status ilora_hist_read(const char *path, ilora_hist hist[PL_SPLIT_COUNT]) {
    memset(hist, 0, sizeof *hist * PL_SPLIT_COUNT);
    hid_t f;
    pl_status st = pl_h5_open_read(path, NULL, &f);
    if (st) return pl_error_prefix(st, "ilora: history_path");
    const pl_data_split sp[2] = {PL_SPLIT_VAL, PL_SPLIT_TEST};
    for (int s = 0; s < 2 && !st; s++) {
        char po[64], pi[64];
        snprintf(po, sizeof po, "/%s/history/offsets", pl_split_name(sp[s]));
        snprintf(pi, sizeof pi, "/%s/history/items", pl_split_name(sp[s]));
        ilora_hist *h = &hist[sp[s]];
        pl_h5_info io, ii;
        st = pl_h5_read_alloc(path, f, po, H5T_NATIVE_INT64, 1, 1, NULL, (void **)&h->offsets, &io);
        if (!st)
            st = pl_h5_read_alloc(path, f, pi, H5T_NATIVE_INT32, 1, 1, NULL, (void **)&h->items,
                                  &ii);
        if (!st) st = check_csr(path, po, pi, h, io.dims[0], ii.dims[0]);
        if (!st) h->n_users = io.dims[0] - 1;
    }
    pl_status cst = pl_h5_close(path, f);
    if (!st) st = cst;
    if (st) ilora_hist_free(hist);
    return st;
}

void ilora_hist_free(ilora_hist hist[PL_SPLIT_COUNT]) {
    for (int s = 0; s < PL_SPLIT_COUNT; s++) {
        free(hist[s].offsets);
        free(hist[s].items);
        memset(&hist[s], 0, sizeof hist[s]);
    }
}
