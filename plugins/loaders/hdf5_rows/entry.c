/* entry.c - the hdf5_rows plugin's descriptor (the loader lives in
 * loader_hdf5_rows, which the deprecated hdf5_chunk alias links too). */
#include "hdf5_rows_api.h"

PL_PLUGIN_DEFINE(hdf5_rows, PL_KIND_LOADER, "1.0.0",
                 "HDF5 rows loader: samples along axis 0 of datasets, mega-batch chunks on the "
                 "device, batches are views, prefetch, teacher outputs join",
                 hdf5_rows_options, &hdf5_rows_vtable)
