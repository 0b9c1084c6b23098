"""isorun's Keras export process: Keras model files in, SavedModels out.

Started by the isorun engine (engine/src/keras/export.rs), inside the same
sandbox as a worker where the run has one. Reads one JSON request on stdin:

  {"modules": [FILE.py...], "unsafe": bool,
   "jobs": [{"file": PATH, "out": DIR}, ...]}

and answers on the stdout it was given, one JSON object a line:

  {"hello": {"keras": V, "tensorflow": V, "python": V}}
  {"start": i}
  {"done": i, "ok": true, "loader": "keras"|"tf_keras", "inputs": [...], "outputs": [...]}
  {"done": i, "ok": false, "error": TEXT}

Anything else the model's code prints goes to stderr. Each model is loaded
with keras.models.load_model(safe_mode=not unsafe, compile=False) and written
with keras.export.ExportArchive, whose serving_default endpoint takes the
model's inputs under their input layers' names and returns a dict keyed by
the model's output names, so the SavedModel speaks Keras's names.
"""

import importlib.util
import json
import os
import sys
import traceback

# The protocol keeps the stdout isorun gave us; everything else goes to stderr.
_answers = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr


def say(message):
    _answers.write(json.dumps(message) + "\n")
    _answers.flush()


os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
request = json.loads(sys.stdin.read())
if os.environ.get("ISORUN_EXPORT_HANG") == "import":
    import time

    while True:
        time.sleep(1)
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

say({"hello": {"keras": keras.__version__, "tensorflow": tf.__version__, "python": sys.version.split()[0]}})

module_error = None
for index, module in enumerate(request.get("modules", [])):
    try:
        spec = importlib.util.spec_from_file_location(f"isorun_keras_module_{index}", module)
        loaded = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = loaded
        spec.loader.exec_module(loaded)
    except BaseException as error:  # noqa: BLE001 - each file's record says it
        traceback.print_exc(file=sys.stderr)
        module_error = f"cannot import --keras-module {module}: {type(error).__name__}: {error}"
        break


def layer_names(tensors):
    return [t._keras_history[0].name for t in tensors]


def input_names(model):
    struct = getattr(model, "_inputs_struct", None)
    if isinstance(struct, dict):
        return list(struct.keys()), True
    return layer_names(model.inputs), False


def output_names(model):
    # Sequential models have no output_names; their output is their last layer's.
    return list(getattr(model, "output_names", None) or layer_names(model.outputs))


def export_keras(model, out):
    names, as_dict = input_names(model)
    specs = [
        tf.TensorSpec(shape=tuple(t.shape), dtype=t.dtype, name=name)
        for name, t in zip(names, model.inputs if not as_dict else [model._inputs_struct[n] for n in names])
    ]
    outputs = output_names(model)

    def serve(*args):
        if as_dict:
            feed = dict(zip(names, args))
        elif len(args) == 1:
            feed = args[0]
        else:
            feed = list(args)
        result = model(feed, training=False)
        if isinstance(result, dict):
            return {k: result[k] for k in outputs if k in result} or dict(result)
        if not isinstance(result, (list, tuple)):
            result = [result]
        return dict(zip(outputs, result))

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name="serving_default", fn=serve, input_signature=specs)
    archive.write_out(out, verbose=False)
    return names, outputs


def export_tf_keras(path, out):
    """Keras 2 files Keras 3 cannot read: tf_keras, and TensorFlow's own saver."""
    import tf_keras

    model = tf_keras.models.load_model(path, compile=False)
    names = [t.name.split(":")[0] for t in model.inputs]
    outputs = list(model.output_names)
    specs = [tf.TensorSpec(t.shape, t.dtype, name=n) for n, t in zip(names, model.inputs)]

    @tf.function(input_signature=specs)
    def serve(*args):
        result = model(list(args) if len(args) > 1 else args[0], training=False)
        if isinstance(result, dict):
            return dict(result)
        if not isinstance(result, (list, tuple)):
            result = [result]
        return dict(zip(outputs, result))

    tf.saved_model.save(model, out, signatures={"serving_default": serve})
    return names, outputs


def h5_carries_code(path):
    """Whether an HDF5 model's config holds Python code (a Lambda's bytecode),
    as the supervisor checks too (engine/src/keras/files.rs, code_in_config);
    a config that cannot be read counts as code."""
    try:
        import h5py

        with h5py.File(path, "r") as f:
            raw = f.attrs.get("model_config")
        config = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
    except Exception:  # noqa: BLE001 - unreadable means unchecked
        return True

    def search(value):
        if isinstance(value, dict):
            if value.get("class_name") == "__lambda__":
                return True
            if any(value.get(k) == "lambda" for k in ("function_type", "output_shape_type", "mask_type")):
                return True
            return any(search(v) for v in value.values())
        if isinstance(value, list):
            return any(search(v) for v in value)
        return False

    return search(config)


exported_bytes = 0
for index, job in enumerate(request["jobs"]):
    say({"start": index})
    if module_error is not None:
        say({"done": index, "ok": False, "error": module_error})
        continue
    if os.environ.get("ISORUN_EXPORT_HANG") == "export":
        import time

        while True:
            time.sleep(1)
    try:
        loader = "keras"
        unsafe = request.get("unsafe", False)
        try:
            model = keras.models.load_model(job["file"], compile=False, safe_mode=not unsafe)
        except Exception as keras_error:
            if not job["file"].endswith((".h5", ".hdf5")) or importlib.util.find_spec("tf_keras") is None:
                raise
            # A safety refusal is final: tf_keras ignores safe_mode for HDF5
            # files and would run the very bytecode Keras refused.
            if not unsafe and ("safe_mode" in str(keras_error) or h5_carries_code(job["file"])):
                raise
            try:
                names, outputs = export_tf_keras(job["file"], job["out"])
                loader = "tf_keras"
            except Exception:
                raise keras_error from None
        else:
            names, outputs = export_keras(model, job["out"])
            del model
        say({"done": index, "ok": True, "loader": loader, "inputs": names, "outputs": outputs})
    except BaseException as error:  # noqa: BLE001 - every failure is this model's record
        text = f"{type(error).__name__}: {error}".strip()
        traceback.print_exc(file=sys.stderr)
        say({"done": index, "ok": False, "error": text})
    # A full collection costs ~0.3 s with TensorFlow loaded, more than many
    # an export: collect after big files and every few files, not after each.
    exported_bytes += os.path.getsize(job["file"]) if os.path.exists(job["file"]) else 0
    full = exported_bytes >= 256 << 20 or index % 8 == 7
    keras.backend.clear_session(free_memory=full)
    if full:
        exported_bytes = 0
