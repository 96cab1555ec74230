/* hdf5_series_api.h - what loader_hdf5_series offers a plugin entry: the
 * hdf5_series plugin's own (entry.c) and the hdf5_chunk alias. */
#ifndef HDF5_SERIES_API_H
#define HDF5_SERIES_API_H

#include "pipeline/plugin.h"

extern const pl_option_spec hdf5_series_options[];
extern const pl_loader_vtable hdf5_series_vtable;

#endif
