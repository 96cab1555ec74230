/* hdf5_rows_api.h - what loader_hdf5_rows offers a plugin entry: the
 * hdf5_rows plugin's own (entry.c) and the hdf5_chunk alias. */
#ifndef HDF5_ROWS_API_H
#define HDF5_ROWS_API_H

#include "pipeline/plugin.h"

extern const pl_option_spec hdf5_rows_options[];
extern const pl_loader_vtable hdf5_rows_vtable;

#endif
