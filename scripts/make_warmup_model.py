"""The SavedModel a spare worker warms up with (worker/warmup/): run by
scripts/make-fixtures --warmup-only under tensorflow-cpu==2.21.0.

A spare (`isorun run --spares N`) loads and runs this model once, after it is
sandboxed and before it is given its unit, so that TensorFlow's per-process
first use (the session's thread pools, the SavedModel loader and restore,
the function runtime, Grappler, oneDNN's set-up) is done by the time the
user's model arrives. It is a Keras model exported with `model.export`, as
the models isorun runs mostly are, and as small as such a model gets (one
Dense layer: MatMul, BiasAdd): what a spare gains is the process's first
use, not any kernel of its own, and every millisecond of warm-up is CPU the
run pays. Measured on the bench zoo (-j 1, one spare): with this model the
warm-up takes ~90 ms and a unit ~80 ms (~130 ms without a spare); a model
with Conv2D, normalisation and embedding layers took ~280 ms to warm up
and gained the units nothing more.
"""

import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402


def build():
    keras.utils.set_random_seed(0)
    x = keras.Input((4,), dtype="float32", name="x")
    y = keras.layers.Dense(2, name="y")(x)
    return keras.Model(x, y, name="isorun_warmup")


def main(out):
    model = build()
    staging = tempfile.mkdtemp(prefix="warmup-", dir=os.path.dirname(os.path.abspath(out)))
    try:
        model.export(os.path.join(staging, "model"), verbose=False)
        if os.path.exists(out):
            shutil.rmtree(out)
        os.rename(os.path.join(staging, "model"), out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for root, _, files in os.walk(out):
        for name in files:
            path = os.path.join(root, name)
            print(f"{os.path.relpath(path, out)}\t{os.path.getsize(path)} bytes")


if __name__ == "__main__":
    main(sys.argv[1])
