/* swa.h - SWALR annealing as a pure function, exposed
 * for the plugin's test (not installed). */
#ifndef PL_SWA_H
#define PL_SWA_H

#include <stdbool.h>
#include <stdint.h>

/* SWALR: the lr after `j` SWALR steps (j = epochs since the SWA start),
 * alpha = anneal(clamp(j / max(1, anneal_epochs), 0, 1)) with
 * anneal = (1 - cos(pi t)) / 2 (cos) or t (linear):
 *     lr = swa_lr * alpha + lr0 * (1 - alpha)
 * where lr0 is the lr when SWA started. Works for absolute lrs and factors. */
double pl_swalr(double swa_lr, double lr0, int64_t j, int64_t anneal_epochs, bool cos_anneal);

#endif
