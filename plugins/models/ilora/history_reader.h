/* history_reader.h - the ilora model's reader of per-user item histories:
 * the CSR /val/history and /test/history {offsets i64 [U+1], items i32 [n]}
 * of a tools/movielens_to_h5.py file, the items each user rated before the
 * held-out target. Ranking excludes them (ilora_forward.c, `history_path`).
 * Plugin-internal; depends on nothing of the model. */
#ifndef ILORA_HISTORY_READER_H
#define ILORA_HISTORY_READER_H

#include <pipeline/pipeline.h>

/* CSR histories of one split (items seen before the target), per user. */
typedef struct ilora_hist {
    int64_t n_users;
    int64_t *offsets; /* [n_users + 1] */
    int32_t *items;
} ilora_hist;

/* Read hist[PL_SPLIT_VAL] and hist[PL_SPLIT_TEST] from `path` (train stays
 * empty). Errors name the file and dataset: missing, not 1-D, offsets not a
 * CSR over items (first 0, last = item count, never decreasing). On error
 * every entry is left empty. The arrays are owned by hist (ilora_hist_free). */
pl_status ilora_hist_read(const char *path, ilora_hist hist[PL_SPLIT_COUNT]);
void ilora_hist_free(ilora_hist hist[PL_SPLIT_COUNT]);

#endif
