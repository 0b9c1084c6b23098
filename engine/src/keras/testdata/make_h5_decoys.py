"""Makes the HDF5 files of engine/src/keras/files/h5.rs's tests: a full-model
file's root `model_config` attribute beside decoys (another model config
in a dataset written first, in another root attribute and in a nested
group's `model_config`), in both of HDF5's layouts (h5py's default, the
oldest format versions, and libver="latest"), with the strings stored
variable-length (h5py's `str` and `bytes`) and fixed-length (numpy bytes).

    python engine/src/keras/testdata/make_h5_decoys.py   (needs h5py, numpy)
"""

import json
import os

import h5py
import numpy as np


def config(output):
    return json.dumps({"class_name": "Functional", "config": {"name": output, "layers": [
        {"class_name": "InputLayer", "name": "x",
         "config": {"batch_shape": [None, 2], "dtype": "float32", "name": "x"}},
        {"class_name": "Dense", "name": output, "config": {"name": output, "units": 3}}],
        "input_layers": [["x", 0, 0]], "output_layers": [[output, 0, 0]]}})


here = os.path.dirname(os.path.abspath(__file__))
for name, libver, fixed in [("h5_decoys_v0.h5", "earliest", False), ("h5_decoys_latest.h5", "latest", True)]:
    with h5py.File(os.path.join(here, name), "w", libver=libver) as f:
        # Written first, so its string comes first in the global heap.
        f.create_dataset("decoy", data=config("decoy_in_a_dataset"), dtype=h5py.string_dtype())
        f.attrs["a_decoy"] = config("decoy_in_an_attribute")
        f.create_group("inner").attrs["model_config"] = config("decoy_in_a_group")
        if fixed:
            f.attrs["model_config"] = np.bytes_(config("real_out"))
            f.attrs["keras_version"] = b"3.15.1"
        else:
            f.attrs["model_config"] = config("real_out")
            f.attrs["keras_version"] = np.bytes_("3.15.1")
        f.attrs["backend"] = "tensorflow"
