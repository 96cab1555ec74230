/* entry.c - the hdf5_series plugin's descriptor (the loader lives in
 * loader_hdf5_series, which the deprecated hdf5_chunk alias links too). */
#include "hdf5_series_api.h"

PL_PLUGIN_DEFINE(hdf5_series, PL_KIND_LOADER, "1.0.0",
                 "HDF5 time series loader: one [T, F] series cut into windows (timeframes, "
                 "date splits, standardization, naive baselines); shuffled batches gathered on "
                 "the device",
                 hdf5_series_options, &hdf5_series_vtable)
