/* teacher_export.h - the ilora model's teacher-output exporter: the model
 * vtable's export_begin / export_batch / export_end, writing
 * OUTPUTS/teacher_outputs.h5 (layout in teacher_export.c and README.md).
 * Plugin-internal. `self` is the ilora_model (ilora.h); this header needs
 * nothing of it, so the model includes it without an include cycle. */
#ifndef ILORA_TEACHER_EXPORT_H
#define ILORA_TEACHER_EXPORT_H

#include <pipeline/pipeline.h>

pl_status ilora_export_begin(void *self, const char *outputs_dir);
pl_status ilora_export_batch(void *self, const pl_batch *b, pl_data_split split);
/* Closes the file (written as teacher_outputs.h5.tmp.<pid>) and renames it
 * to teacher_outputs.h5; a no-op when no export is open. */
pl_status ilora_export_end(void *self);
/* An export that did not finish: close and delete the temporary file
 * (`self` as above; used when the model is destroyed mid-export). */
void ilora_export_abort(void *self);

#endif
