/* distill.h - knowledge distillation term of the ilora model (distill.c has
 * the formula; README.md "Knowledge distillation"). Plugin-internal; `m` is
 * the ilora_model of ilora.h. */
#ifndef ILORA_DISTILL_H
#define ILORA_DISTILL_H

#include <pipeline/pipeline.h>

typedef struct ilora_model ilora_model;

/* kd_weight > 0: the temperature from the loader's meta teacher_temperature
 * (kd_temperature 0), or checked equal to it; PL_ERR_CONFIG naming both. */
pl_status ilora_kd_temperature(ilora_model *m);

/* kd_weight * tau^2 * mean_j KL(q_j || p_j) over np positions (0-dim f32,
 * differentiable in `logits`). logits [np, V] are the student's (item 0 =
 * padding, excluded); ids i32 [np, K] the teacher's items (1..V-1),
 * tlogits f32 [np, K] their logits / tau, lognorm f32 [np] the teacher's
 * logsumexp over every item at tau. NULL with the error set. */
pl_tensor *ilora_kd_loss(pl_tensor *logits, const int32_t *ids, const float *tlogits,
                         const float *lognorm, int64_t np, int64_t K, double tau, double weight);

/* The term for the labelled positions `pos` (i64 [np] on the device: flat
 * indices into [B, L]) of a train batch, from its fields kd_ids [B, L, K]
 * (items checked by the loader's join), kd_logits [B, L, K] and kd_lognorm
 * [B, L] (B, L those of the input ids), computed on the device without a
 * copy through the host; logits [np, V] are those positions' student
 * logits. NULL with the error set (a missing field or shape named). */
pl_tensor *ilora_kd_term(ilora_model *m, const pl_batch *b, pl_tensor *logits, pl_tensor *pos);
/* The same term over every position of the batch, each weighted by mask
 * [B*L, 1] (1 labelled, 0 not), divided by count (device scalar, the
 * labelled positions, >= 1): no host read (the trainer's device path). */
pl_tensor *ilora_kd_term_masked(ilora_model *m, const pl_batch *b, pl_tensor *logits,
                                pl_tensor *mask, pl_tensor *count);

#endif
