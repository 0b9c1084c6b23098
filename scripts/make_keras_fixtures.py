"""Keras model files for isorun's Keras tests (scripts/make-fixtures --keras-only).

Writes tests/fixtures/keras/ with real Keras 3 files and what `model.predict`
gives for the inputs beside them:

  ckpts/               a checkpoint folder as ModelCheckpoint and model.save leave it:
    dense.keras          Functional, input "features" [?, 4], output "logits" [?, 3]
    seq.h5               Keras-3 legacy HDF5 of a Sequential model, input [?, 4]
    dense.weights.h5     weights only: not a model
  multi.keras          two inputs ("a" [?, 3], "b" [?, 2]), two outputs ("score", "probs")
  custom.keras         a registered custom layer (isorun_test>Scale) from custom_layers.py
  custom_layers.py     the module that defines it (--keras-module)
  lambda.keras         a Lambda layer (Python bytecode): refused in safe mode
  lambda_escape.keras  a Lambda that writes /tmp/isorun-keras-lambda-escaped when it runs
  truncated.keras      the first half of dense.keras
  iris.keras           an (untrained) iris classifier, input "x" [?, 4], output "probabilities",
                       for isorun eval over examples/eval/iris.tfrecord
  keras2/k2_seq.h5     Keras 2 (tf_keras) Sequential: Keras 3's legacy loader reads it
  keras2/k2_local.h5   Keras 2 LocallyConnected1D, gone from Keras 3: only tf_keras reads it
  hang_layers.py       a --keras-module that never returns (load timeout)
  checkpoints/run/     one training run's checkpoints (two inputs "a" [?, 3], "b" [?, 2],
                       BatchNorm, outputs "score", "probs"), trained between saves so the
                       weights and moving statistics differ: epoch_01..03.keras; beside them
                       epoch_02_wider.keras (one unit more: its own graph) and
                       epoch_02_extra.keras (epoch_01's config, epoch_03's weights with one
                       dataset more and one bias stored as float64: Keras loads it, but its
                       weights are not laid out as the graph's)
  checkpoints/inputs.npz, checkpoints/expected/<file>/<output>.npy   model.predict's
  inputs/<model>.npz   inputs; expected/<model>/<output>.npy   model.predict's outputs

Run under the fixtures venv (tensorflow-cpu 2.21.0, keras 3); fixed seeds.
"""

import glob
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import keras  # noqa: E402

ESCAPE = "/tmp/isorun-keras-lambda-escaped"

CUSTOM = '''"""A custom layer for isorun's tests (--keras-module)."""
import keras


@keras.saving.register_keras_serializable(package="isorun_test")
class Scale(keras.layers.Layer):
    def __init__(self, factor=2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}
'''

HANG = '''"""A --keras-module that never returns: the export's load timeout must stop it."""
import time

while True:
    time.sleep(1)
'''


def layer_names(tensors):
    """Keras's names of a model's inputs or outputs: their layers' names."""
    return [t._keras_history[0].name for t in tensors]


def output_names(model):
    # Sequential models have no output_names; their output is their last layer's.
    return list(getattr(model, "output_names", None) or layer_names(model.outputs))


def save_case(out, name, model, inputs):
    os.makedirs(os.path.join(out, "inputs"), exist_ok=True)
    np.savez(os.path.join(out, "inputs", name + ".npz"), **inputs)
    feed = inputs if len(inputs) > 1 else next(iter(inputs.values()))
    pred = model.predict(feed, verbose=0)
    names = output_names(model)
    if not isinstance(pred, (list, tuple, dict)):
        pred = [pred]
    if isinstance(pred, dict):
        pred = [pred[n] for n in names]
    exp = os.path.join(out, "expected", name)
    os.makedirs(exp, exist_ok=True)
    for n, p in zip(names, pred):
        np.save(os.path.join(exp, n + ".npy"), np.asarray(p))


def keras2(out, rng):
    """Files saved by Keras 2 (tf_keras 2.21, as TF <= 2.15 users have them)."""
    import tf_keras as k2

    k2.utils.set_random_seed(7)
    folder = os.path.join(out, "keras2")
    os.makedirs(folder)
    seq = k2.Sequential(
        [k2.layers.Dense(3, activation="relu", input_shape=(4,), name="hidden"), k2.layers.Dense(2, name="out")]
    )
    seq.save(os.path.join(folder, "k2_seq.h5"))
    x = k2.Input((6, 2), name="sequence")
    local = k2.layers.Flatten(name="flat")(k2.layers.LocallyConnected1D(2, 3, name="local")(x))
    local = k2.Model(x, local)
    local.save(os.path.join(folder, "k2_local.h5"))
    for name, model, shape in [("k2_seq", seq, (3, 4)), ("k2_local", local, (2, 6, 2))]:
        inputs = rng.standard_normal(shape).astype("float32")
        os.makedirs(os.path.join(out, "inputs"), exist_ok=True)
        np.savez(os.path.join(out, "inputs", name + ".npz"), **{model.input_names[0]: inputs})
        exp = os.path.join(out, "expected", name)
        os.makedirs(exp, exist_ok=True)
        np.save(os.path.join(exp, model.output_names[0] + ".npy"), model.predict(inputs, verbose=0))


def checkpoint_model(units):
    a = keras.Input((3,), name="a")
    b = keras.Input((2,), name="b")
    h = keras.layers.Dense(units, activation="relu", name="hidden")(keras.layers.Concatenate(name="joined")([a, b]))
    h = keras.layers.BatchNormalization(name="norm")(h)
    score = keras.layers.Dense(1, name="score")(h)
    probs = keras.layers.Dense(4, activation="softmax", name="probs")(h)
    model = keras.Model({"a": a, "b": b}, {"score": score, "probs": probs}, name="run")
    model.compile("adam", {"score": "mse", "probs": "categorical_crossentropy"})
    return model


def checkpoints(out):
    """One training run's checkpoints (ModelCheckpoint-like: one model saved
    after each epoch), a file one unit wider, and a file whose weights do not
    lay out as its config's graph; with model.predict's outputs."""
    import h5py
    import zipfile

    keras.utils.set_random_seed(11)
    rng = np.random.default_rng(11)
    folder = os.path.join(out, "checkpoints", "run")
    os.makedirs(folder)
    data = {"a": rng.standard_normal((64, 3)).astype("float32"), "b": rng.standard_normal((64, 2)).astype("float32")}
    targets = {"score": rng.standard_normal((64, 1)), "probs": np.eye(4)[rng.integers(0, 4, 64)]}
    inputs = {"a": rng.standard_normal((4, 3)).astype("float32"), "b": rng.standard_normal((4, 2)).astype("float32")}
    np.savez(os.path.join(out, "checkpoints", "inputs.npz"), **inputs)
    model = checkpoint_model(8)
    files = {}
    for epoch in (1, 2, 3):
        model.fit(data, targets, epochs=1, batch_size=16, verbose=0)
        files[f"epoch_{epoch:02d}"] = os.path.join(folder, f"epoch_{epoch:02d}.keras")
        model.save(files[f"epoch_{epoch:02d}"])
    wider = checkpoint_model(9)
    wider.fit(data, targets, epochs=1, batch_size=16, verbose=0)
    files["epoch_02_wider"] = os.path.join(folder, "epoch_02_wider.keras")
    wider.save(files["epoch_02_wider"])
    # epoch_01's config and metadata, epoch_03's weights re-laid: an extra
    # dataset, and the hidden bias as float64.
    extra = os.path.join(folder, "epoch_02_extra.keras")
    tmp = tempfile.mkdtemp()
    with zipfile.ZipFile(files["epoch_03"]) as source:
        source.extract("model.weights.h5", tmp)
    weights = os.path.join(tmp, "model.weights.h5")
    with h5py.File(weights, "r+") as store:
        store.create_dataset("layers/unused/vars/0", data=np.ones((2, 2), dtype="float32"))
        # The store names layers by class ("dense" is the first Dense: hidden).
        bias = store["layers/dense/vars/1"][()]
        del store["layers/dense/vars/1"]
        store.create_dataset("layers/dense/vars/1", data=bias.astype("float64"))
    with zipfile.ZipFile(files["epoch_01"]) as source, zipfile.ZipFile(extra, "w") as target:
        for name in ("metadata.json", "config.json"):
            target.writestr(name, source.read(name))
        target.write(weights, "model.weights.h5")
    shutil.rmtree(tmp)
    files["epoch_02_extra"] = extra
    for stem, path in files.items():
        loaded = keras.models.load_model(path, compile=False)
        pred = loaded.predict(inputs, verbose=0)
        exp = os.path.join(out, "checkpoints", "expected", stem + ".keras")
        os.makedirs(exp, exist_ok=True)
        for name, value in pred.items():
            np.save(os.path.join(exp, name + ".npy"), np.asarray(value))


def main(repo):
    keras.utils.set_random_seed(7)
    final = os.path.join(repo, "tests", "fixtures", "keras")
    # Staging folders of an earlier run that died half-way (never committed).
    for stale in glob.glob(os.path.join(repo, "tests", "fixtures", "keras-fixtures-*")):
        shutil.rmtree(stale, ignore_errors=True)
    out = tempfile.mkdtemp(prefix="keras-fixtures-", dir=os.path.join(repo, "tests", "fixtures"))
    ckpts = os.path.join(out, "ckpts")
    os.makedirs(ckpts)
    rng = np.random.default_rng(7)

    x = keras.Input((4,), name="features")
    h = keras.layers.Dense(8, activation="relu")(x)
    y = keras.layers.Dense(3, name="logits")(h)
    dense = keras.Model(x, y, name="dense")
    dense.save(os.path.join(ckpts, "dense.keras"))
    dense.save_weights(os.path.join(ckpts, "dense.weights.h5"))
    save_case(out, "dense", dense, {"features": rng.standard_normal((5, 4)).astype("float32")})

    seq = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="tanh")], name="seq")
    seq.save(os.path.join(ckpts, "seq.h5"))
    save_case(out, "seq", seq, {layer_names(seq.inputs)[0]: rng.standard_normal((3, 4)).astype("float32")})

    a = keras.Input((3,), name="a")
    b = keras.Input((2,), name="b")
    joined = keras.layers.Concatenate()([a, b])
    score = keras.layers.Dense(1, name="score")(joined)
    probs = keras.layers.Dense(4, activation="softmax", name="probs")(joined)
    multi = keras.Model({"a": a, "b": b}, {"score": score, "probs": probs}, name="multi")
    multi.save(os.path.join(out, "multi.keras"))
    save_case(
        out,
        "multi",
        multi,
        {"a": rng.standard_normal((2, 3)).astype("float32"), "b": rng.standard_normal((2, 2)).astype("float32")},
    )

    with open(os.path.join(out, "custom_layers.py"), "w") as f:
        f.write(CUSTOM)
    with open(os.path.join(out, "hang_layers.py"), "w") as f:
        f.write(HANG)
    sys.path.insert(0, out)
    import custom_layers  # noqa: E402

    c_in = keras.Input((2,), name="values")
    custom = keras.Model(c_in, custom_layers.Scale(3.0, name="scaled")(c_in), name="custom")
    custom.save(os.path.join(out, "custom.keras"))
    save_case(out, "custom", custom, {"values": np.array([[1, 2], [3, 4]], dtype="float32")})

    l_in = keras.Input((2,), name="values")
    lam = keras.Model(l_in, keras.layers.Lambda(lambda v: v * 2.0 + 1.0, name="doubled")(l_in), name="lam")
    lam.save(os.path.join(out, "lambda.keras"))
    save_case(out, "lambda", lam, {"values": np.array([[1, 2], [3, 4]], dtype="float32")})

    # A lambda (saved as bytecode) that writes outside whenever the layer is
    # called, as it is while the export traces it.
    escape = lambda v: (open("/tmp/isorun-keras-lambda-escaped", "w").write("escaped"), v)[1]  # noqa: E731
    e_in = keras.Input((2,), name="values")
    esc = keras.Model(e_in, keras.layers.Lambda(escape, output_shape=(2,), name="escape")(e_in), name="escape")
    esc.save(os.path.join(out, "lambda_escape.keras"))
    if os.path.exists(ESCAPE):
        os.remove(ESCAPE)

    i_in = keras.Input((4,), name="x")
    iris = keras.Model(i_in, keras.layers.Dense(3, activation="softmax", name="probabilities")(i_in), name="iris")
    iris.save(os.path.join(out, "iris.keras"))

    keras2(out, rng)
    checkpoints(out)

    data = open(os.path.join(ckpts, "dense.keras"), "rb").read()
    open(os.path.join(out, "truncated.keras"), "wb").write(data[: len(data) // 2])

    if os.path.exists(final):
        shutil.rmtree(final)
    os.chmod(out, 0o755)
    os.rename(out, final)
    shutil.rmtree(os.path.join(final, "__pycache__"), ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[2] == "--checkpoints-only":
        # Only tests/fixtures/keras/checkpoints (the other files as they are).
        final = os.path.join(sys.argv[1], "tests", "fixtures", "keras")
        shutil.rmtree(os.path.join(final, "checkpoints"), ignore_errors=True)
        checkpoints(final)
    else:
        main(sys.argv[1])
