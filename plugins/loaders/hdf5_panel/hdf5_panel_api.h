/* hdf5_panel_api.h - what loader_hdf5_panel offers a plugin entry: the
 * hdf5_panel plugin's own (entry.c) and hdf5_graph's deprecated mode = panel. */
#ifndef HDF5_PANEL_API_H
#define HDF5_PANEL_API_H

#include "pipeline/plugin.h"

extern const pl_option_spec hdf5_panel_options[];
extern const pl_loader_vtable hdf5_panel_vtable;

#endif
