/* lstm_check.h - what the LSTM checks against its [data] section before a
 * run (`pipeline check`, and the trainer before it builds anything, both
 * through batch_needs) and what it derives from it at create.
 *
 * The model reads the target's history from its own input window (seasonal
 * naive metric, naive_skip, revin, exogenous_gate), so the window length and
 * where the target sits among the input columns are facts of the loader's
 * config. They are read from the [data] section of a series loader
 * (hdf5_series' window, target_columns, feature_columns; the column names
 * from the file's metadata, never its data). A loader without these keys,
 * or a file that cannot be read yet, leaves the facts unknown and the checks
 * that need them are skipped (the run checks the window length again).
 */
#ifndef PL_MODEL_LSTM_CHECK_H
#define PL_MODEL_LSTM_CHECK_H

#include <stdint.h>

#include "pipeline/pipeline.h"

#define LSTM_UNKNOWN (-2)

typedef struct lstm_data_facts {
    int64_t window;       /* [data] window (input steps); 0: unknown */
    int64_t num_inputs;   /* input feature columns; LSTM_UNKNOWN */
    int64_t target_input; /* the first target's index among the input columns; -1: not an
                             input; LSTM_UNKNOWN */
    char target[64];      /* the first target_columns entry as written */
    char inputs[256];     /* the input columns, for messages ("feature_columns = a,b") */
} lstm_data_facts;

/* Facts of the [data] section of the config that holds `model` (never fails:
 * what cannot be known is LSTM_UNKNOWN / 0). */
void lstm_data_facts_read(const pl_config_section *model, lstm_data_facts *f);

/* The option combinations the data refuses, with both options' values and
 * where they were set: seasonal_period longer than the window, naive_column
 * that disagrees with the target, the target missing from the inputs.
 * exogenous_gate on a one-column input is a warning (pl_message), not an
 * error: it leaves the model as it would be without the gate. */
pl_status lstm_check_against_data(const pl_config_section *model, const lstm_data_facts *f);

#endif
