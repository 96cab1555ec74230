/* prec_model.h - a tiny LoRA-style model for the precision plugin tests
 * (test-only). y = head(relu(x W^T + (x A^T) B^T)) with W [H, D] frozen base
 * (PL_TAG_BASE), A [R, D] and B [H, R] adapters (role "lora"), head [1, H] +
 * bias; loss = mse(y, target). The base matmul uses pl_nf4_matmul when W is
 * nf4, the way model plugins do. Parameters are looked up in the list at
 * every forward (never cached), so precision replacements are seen. */
#ifndef PL_PREC_MODEL_H
#define PL_PREC_MODEL_H

#include "pl_test.h"

#define PM_B 16
#define PM_D 64
#define PM_H 32
#define PM_R 4

/* Add the model's parameters (deterministic init) to `ps`. */
void pm_add_params(pl_params *ps, uint64_t seed);
/* Fixed batch: x [B, D], target [B, 1]. Owned by the caller. */
void pm_batch(pl_tensor **x, pl_tensor **target);
/* Loss (0-dim f32, recorded) inside the caller's frame; NULL on error. */
pl_tensor *pm_loss(pl_params *ps, pl_tensor *x, pl_tensor *target);
/* Model output y [B, 1] (no grad needed). */
pl_tensor *pm_forward(pl_params *ps, pl_tensor *x);
/* One training step through a precision vtable: backward seeded with
 * loss_scale, before_step, SGD (lr) on trainable f32 params, after_step,
 * zero grads. Returns the loss; *stepped tells whether the step ran. */
double pm_train_step(const pl_precision_vtable *vt, void *self, pl_params *ps, pl_tensor *x,
                     pl_tensor *target, double lr, bool *stepped);

/* Lean loading: parameters arriving in a checkpoint file's dtype. Adds to
 * `ps` (deterministic values, bf16 ones from random bits so that bf16 ->
 * f32 exactness is tested on full mantissas):
 *   half.base_bf16  bf16 [8, 64] frozen, PL_TAG_BASE (what qlora4 quantizes)
 *   half.norm_f16   f16  [64]    frozen, no tag
 *   half.lora_bf16  bf16 [4, 8]  trainable
 *   half.stat_f16   f16  [4]     frozen, PL_TAG_BUFFER
 * and returns their f32 values (caller frees each of vals[0..3]). */
void pm_add_half_params(pl_params *ps, float *vals[4]);
/* After setup: half.base_bf16 is `base` and half.norm_f16 is `norm`;
 * trainable and buffers are f32; every float one holds its original value
 * rounded to its new dtype, in its original tensor header (`hdr`, from
 * before setup; nf4 is replaced, its values are not checked). */
void pm_check_half_params(pl_params *ps, float *vals[4], pl_tensor *hdr[4], pl_dtype base,
                          pl_dtype norm);
/* The whole check for one precision: open `plugin` with `ini_body`, add
 * the half parameters, setup, pm_check_half_params, setup again (nothing
 * changes), close. */
void pm_setup_converts_half_params(const char *plugin, const char *ini_body, pl_dtype base,
                                   pl_dtype norm);

#endif
