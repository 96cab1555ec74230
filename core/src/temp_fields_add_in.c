/* TEMP: pl_fields_add_in (plugin.h, ABI 2.0) until the SDK branch (h-sdk)
 * implements it; ilora's batch_needs calls it. The lead drops this file. */
#include <stdio.h>
#include <string.h>

#include "pipeline/plugin.h"

pl_status pl_fields_add_in(pl_field_list *l, unsigned splits, const char *name, pl_dtype dtype,
                           int rank, bool optional) {
    if (!l || !name || !name[0] || strlen(name) >= sizeof l->f[0].name)
        return pl_error_set(PL_ERR_INVALID, "pl_fields_add_in: bad field name '%s'",
                            name ? name : "(null)");
    unsigned all = (1u << PL_SPLIT_COUNT) - 1, mine = splits ? splits : all;
    for (int i = 0; i < l->n; i++) {
        unsigned theirs = l->f[i].splits ? l->f[i].splits : all;
        if (!strcmp(l->f[i].name, name) && (theirs & mine))
            return pl_error_set(PL_ERR_INVALID, "pl_fields_add_in: field '%s' declared twice", name);
    }
    if (l->n >= PL_FIELDS_MAX)
        return pl_error_set(PL_ERR_INVALID, "pl_fields_add_in: more than %d fields ('%s')",
                            PL_FIELDS_MAX, name);
    pl_field_spec *f = &l->f[l->n++];
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    f->dtype = dtype;
    f->rank = rank;
    f->optional = optional;
    f->splits = splits;
    return PL_OK;
}
