/* teacher_export.h - the ilora model's teacher outputs: the model's
 * outputs_begin / outputs_batch for PL_OUTPUTS_EXPORT (plugin.h pl_outputs),
 * which the run writes as OUTPUTS/teacher_outputs.h5 (layout in
 * teacher_export.c and README.md). Plugin-internal. `self` is the
 * ilora_model (ilora.h); this header needs nothing of it, so the model
 * includes it without an include cycle. */
#ifndef ILORA_TEACHER_EXPORT_H
#define ILORA_TEACHER_EXPORT_H

#include <pipeline/pipeline.h>

/* outputs_begin(EXPORT): names the file, adds the root attributes, declares
 * every dataset (0 rows) and resets the row counters. */
pl_status ilora_teacher_begin(void *self, pl_outputs *out);
/* outputs_batch(EXPORT): the rows of batch b of `split`. */
pl_status ilora_teacher_batch(void *self, const pl_batch *b, pl_data_split split,
                              pl_outputs *out);

/* The same file written without the run (the unit tests), with the run's
 * writer (pl_h5_outputs_*): begin opens OUTPUTS_DIR/teacher_outputs.h5.tmp.<pid>,
 * batch appends a batch's outputs, end closes it and renames it to
 * teacher_outputs.h5 (a no-op when none is open); abort removes an
 * unfinished one (the model's destroy calls it). */
pl_status ilora_export_begin(void *self, const char *outputs_dir);
pl_status ilora_export_batch(void *self, const pl_batch *b, pl_data_split split);
pl_status ilora_export_end(void *self);
void ilora_export_abort(void *self);

#endif
