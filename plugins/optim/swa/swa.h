/* swa.h - SWA running mean and SWALR annealing as pure functions, exposed
 * for the plugin's test (not installed). */
#ifndef PL_SWA_H
#define PL_SWA_H

#include <stdbool.h>
#include <stdint.h>

/* torch.optim.swa_utils.AveragedModel.update_parameters for one tensor:
 * n_averaged == 0: avg = cur; else avg += (cur - avg) / (n_averaged + 1),
 * in f32 (OpenMP when n is large). */
void pl_swa_accumulate(float *avg, const float *cur, int64_t n, int64_t n_averaged);

/* SWALR: the lr after `j` SWALR steps (j = epochs since the SWA start),
 * alpha = anneal(clamp(j / max(1, anneal_epochs), 0, 1)) with
 * anneal = (1 - cos(pi t)) / 2 (cos) or t (linear):
 *     lr = swa_lr * alpha + lr0 * (1 - alpha)
 * where lr0 is the lr when SWA started. Works for absolute lrs and factors. */
double pl_swalr(double swa_lr, double lr0, int64_t j, int64_t anneal_epochs, bool cos_anneal);

#endif
