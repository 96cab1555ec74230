#!/usr/bin/env python3
"""Regenerate the loader test fixtures in this folder (committed, tiny).

lzf.h5: /train/x f32 [8, 2] compressed with h5py's LZF filter (id 32000),
which the HDF5 C library cannot decode: the loaders must refuse it with a
message naming the file, the dataset and the filter.
"""
import os

import h5py
import numpy as np

here = os.path.dirname(os.path.abspath(__file__))
with h5py.File(os.path.join(here, "lzf.h5"), "w") as f:
    f.create_dataset("train/x", data=np.arange(16, dtype=np.float32).reshape(8, 2),
                     compression="lzf", chunks=(4, 2))
    f.create_dataset("train/y", data=np.arange(8, dtype=np.int64))
