/* lstm_check.c - the LSTM's checks against its [data] section (see lstm_check.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lstm_check.h"
#include "pl_h5.h"

#define MAX_COLS 1024

/* The next comma-separated entry of *s (spaces trimmed) into tok; false at the end. */
static bool next_token(const char **s, char *tok, size_t n) {
    while (**s == ',' || **s == ' ')
        (*s)++;
    if (!**s) return false;
    const char *e = strchr(*s, ',');
    size_t len = e ? (size_t)(e - *s) : strlen(*s);
    while (len > 0 && (*s)[len - 1] == ' ')
        len--;
    snprintf(tok, n, "%.*s", (int)len, *s);
    *s += e ? (size_t)(e - *s) : strlen(*s);
    return true;
}

/* The file's column count and names (pl_h5_column_names: the `/columns`
 * dataset or the series dataset's `columns` attribute, as hdf5_series reads
 * them). *ncols 0 when the file or the series cannot be read; *nnames 0
 * without names. */
static void read_columns(const char *path, const char *series, int64_t *ncols, char (*names)[64],
                         int *nnames) {
    *ncols = 0;
    *nnames = 0;
    if (!path || !path[0]) return;
    char sname[256];
    snprintf(sname, sizeof sname, "%s%s", series[0] == '/' ? "" : "/", series);
    if (pl_file_check_regular(path, NULL)) { /* a FIFO would block; the loader says why */
        pl_error_clear();
        return;
    }
    pl_h5_lock();
    hid_t file = -1, ds = -1;
    H5E_BEGIN_TRY {
        file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
        if (file >= 0) ds = H5Dopen2(file, sname, H5P_DEFAULT);
        if (ds >= 0) {
            hid_t dsp = H5Dget_space(ds);
            hsize_t dims[2] = {0, 0};
            if (dsp >= 0 && H5Sget_simple_extent_ndims(dsp) == 2 &&
                H5Sget_simple_extent_dims(dsp, dims, NULL) == 2)
                *ncols = (int64_t)dims[1];
            if (dsp >= 0) H5Sclose(dsp);
            H5Dclose(ds);
            *nnames = pl_h5_column_names(file, sname, names, MAX_COLS);
        }
        if (file >= 0) H5Fclose(file);
    }
    H5E_END_TRY;
    pl_h5_unlock();
}

/* A column entry's index in the file, as hdf5_series resolves it (a name
 * first, then an index); -1 when it cannot be told without the file. */
static int64_t resolve(const char *tok, int64_t ncols, char (*names)[64], int nnames) {
    for (int i = 0; i < nnames; i++)
        if (!strcmp(names[i], tok)) return i;
    char *end;
    long v = strtol(tok, &end, 10);
    if (*end == 0 && end != tok && v >= 0 && (ncols == 0 || v < ncols)) return v;
    return -1;
}

void lstm_data_facts_read(const pl_config_section *model, lstm_data_facts *f) {
    memset(f, 0, sizeof *f);
    f->num_inputs = f->target_input = LSTM_UNKNOWN;
    const pl_config_section *data = pl_cfg_sibling(model, "data");
    /* a series loader: windows of `window` steps, target_columns among its columns */
    if (!data || !pl_cfg_get(data, "window") || !pl_cfg_get(data, "target_columns")) return;
    f->window = pl_cfg_int(data, "window", 0);
    if (f->window <= 0) return;
    const char *tspec = pl_cfg_str(data, "target_columns", "0");
    const char *fspec = pl_cfg_str(data, "feature_columns", "");
    if (!next_token(&tspec, f->target, sizeof f->target)) return;

    char(*names)[64] = calloc(MAX_COLS, 64);
    if (!names) return;
    int64_t ncols;
    int nnames;
    read_columns(pl_cfg_str(data, "path", ""), pl_cfg_str(data, "series", "series"), &ncols, names,
                 &nnames);
    int64_t tcol = resolve(f->target, ncols, names, nnames);
    char tok[64];
    if (!fspec[0]) { /* every column of the file */
        snprintf(f->inputs, sizeof f->inputs, "feature_columns = (empty: all %s%lld columns of %s)",
                 ncols ? "" : "the ", (long long)ncols, pl_cfg_str(data, "path", "?"));
        if (ncols > 0) {
            f->num_inputs = ncols;
            f->target_input = tcol >= 0 ? tcol : LSTM_UNKNOWN;
        } else if (tcol >= 0 && !nnames) {
            f->target_input = tcol; /* an index is its own place among all columns */
            snprintf(f->inputs, sizeof f->inputs, "feature_columns = (empty: all columns)");
        }
    } else {
        snprintf(f->inputs, sizeof f->inputs, "feature_columns = %s", fspec);
        int64_t n = 0, found = -1;
        bool undecided = false;
        for (const char *s = fspec; next_token(&s, tok, sizeof tok); n++) {
            if (found >= 0) continue;
            int64_t c = resolve(tok, ncols, names, nnames);
            if (!strcmp(tok, f->target) || (c >= 0 && tcol >= 0 && c == tcol))
                found = n;
            else if (c < 0 || tcol < 0)
                undecided = true;
        }
        f->num_inputs = n;
        f->target_input = found >= 0 ? found : undecided ? LSTM_UNKNOWN : -1;
    }
    free(names);
}

pl_status lstm_check_against_data(const pl_config_section *model, const lstm_data_facts *f) {
    const pl_config_section *data = pl_cfg_sibling(model, "data");
    int64_t period = pl_cfg_int(model, "seasonal_period", 0);
    int64_t col = pl_cfg_int(model, "naive_column", -1);
    const char *skip = pl_cfg_str(model, "naive_skip", "false");
    bool corrected = !strcmp(skip, "corrected") || !strcmp(skip, "auto");
    bool gate = pl_cfg_bool(model, "exogenous_gate", false);
    bool uses_column = period > 0 || gate || strcmp(pl_cfg_str(model, "revin", "off"), "off");
    if (f->window > 0 && period > f->window) {
        pl_hint_set("the seasonal naive forecast of step t reads y[t - seasonal_period] from the "
                    "input window: make [data] window at least seasonal_period, or the period "
                    "shorter");
        return pl_error_set(PL_ERR_CONFIG, "lstm: seasonal_period = %lld (%s) is longer than [data] "
                            "window = %lld (%s): y[t - %lld] is outside the %lld-step input window",
                            (long long)period, pl_cfg_origin(model, "seasonal_period"),
                            (long long)f->window, pl_cfg_origin(data, "window"), (long long)period,
                            (long long)f->window);
    }
    if (f->window > 0 && corrected && period >= f->window) {
        pl_hint_set("naive_skip = corrected reads y[t - 1 - seasonal_period]: make [data] window "
                    "longer than seasonal_period, or use naive_skip = true");
        return pl_error_set(PL_ERR_CONFIG, "lstm: naive_skip = corrected with seasonal_period = %lld "
                            "(%s) needs a window longer than the period; [data] window = %lld (%s)",
                            (long long)period, pl_cfg_origin(model, "seasonal_period"),
                            (long long)f->window, pl_cfg_origin(data, "window"));
    }
    if (!strcmp(skip, "auto")) {
        /* the loader computes both baselines' training MAE for this period */
        int64_t np = data && pl_cfg_get(data, "window") ? pl_cfg_int(data, "naive_period", 0) : -1;
        if (np >= 0 && np != period) {
            pl_hint_set(
                "set [data] naive_period = seasonal_period: hdf5_series then publishes both "
                "baselines' MAE over the training windows, which naive_skip = auto compares");
            return pl_error_set(PL_ERR_CONFIG,
                                "lstm: naive_skip = auto (%s) with seasonal_period = "
                                "%lld (%s) needs [data] naive_period = %lld; found %lld (%s)",
                                pl_cfg_origin(model, "naive_skip"), (long long)period,
                                pl_cfg_origin(model, "seasonal_period"), (long long)period,
                                (long long)np, pl_cfg_origin(data, "naive_period"));
        }
    }
    if (uses_column && f->target_input == -1) {
        pl_hint_set("add the target to [data] feature_columns (or leave feature_columns empty)");
        return pl_error_set(PL_ERR_CONFIG, "lstm: seasonal_period / naive_skip / revin / "
                            "exogenous_gate read the target's history from the inputs, but [data] "
                            "target_columns = %s (%s) is not among the inputs: %s (%s)",
                            f->target, pl_cfg_origin(data, "target_columns"), f->inputs,
                            pl_cfg_origin(data, "feature_columns"));
    }
    if (uses_column && col >= 0 && f->target_input >= 0 && col != f->target_input) {
        pl_hint_set("leave naive_column out: it is derived from [data] target_columns");
        return pl_error_set(PL_ERR_CONFIG, "lstm: naive_column = %lld (%s) but [data] target_columns "
                            "= %s (%s) is input column %lld of %s",
                            (long long)col, pl_cfg_origin(model, "naive_column"), f->target,
                            pl_cfg_origin(data, "target_columns"), (long long)f->target_input,
                            f->inputs);
    }
    if (gate && f->num_inputs == 1)
        pl_message("lstm: warning: exogenous_gate = true (%s) has no other column to gate: the "
                   "input is the target alone (%s), so the model is the one without the gate",
                   pl_cfg_origin(model, "exogenous_gate"), f->inputs);
    return PL_OK;
}
