/* hf_export.h - the ilora model's export_model (plugin.h, ABI 2.4): the
 * model written as a Hugging Face directory for transformers + PEFT
 * (`pipeline export RUN_DIR --format hf OUT_DIR`). Layouts, the exact
 * gate formula of a MoE-LoRA export and what is refused: README.md,
 * "Export to Hugging Face". Plugin-internal; `self` is the ilora_model. */
#ifndef ILORA_HF_EXPORT_H
#define ILORA_HF_EXPORT_H

#include <pipeline/pipeline.h>

/* format "hf" only (else PL_ERR_UNSUPPORTED); options "lora=peft|merge"
 * (default peft), "dtype=f32|bf16|f16" (default f32), "dest=PATH" and
 * "checkpoint=PATH" (from the core); any other key or value:
 * PL_ERR_CONFIG naming it. Writes into `dir` (exists, empty); the model's
 * parameters are not changed. */
pl_status ilora_export_model(void *self, const char *format, const char *dir,
                             const char *const *options);

#endif
