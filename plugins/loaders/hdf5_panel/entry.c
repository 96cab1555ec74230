/* entry.c - the hdf5_panel plugin's descriptor (the loader lives in
 * loader_hdf5_panel, which hdf5_graph links for its deprecated mode = panel). */
#include "hdf5_panel_api.h"

PL_PLUGIN_DEFINE(hdf5_panel, PL_KIND_LOADER, "1.0.0",
                 "HDF5 stock panel loader: one correlation graph per day (stocks = nodes, top-k "
                 "|corr| edges), days batched from per-split device staging",
                 hdf5_panel_options, &hdf5_panel_vtable)
