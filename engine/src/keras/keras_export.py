"""isorun's Keras export process: Keras model files in, SavedModels out.

Started by the isorun engine (engine/src/keras/export.rs), inside the same
sandbox as a worker where the run has one. Reads one JSON request, one line
on stdin:

  {"modules": [FILE.py...], "unsafe": bool,
   "jobs": [{"file": PATH, "out": DIR, "graph": KEY|null,
             "freeze": bool, "check": "here"|"worker"}, ...]}

imports TensorFlow and Keras, says hello, and waits for stdin to close (the
supervisor starts the next process while this one works, so that its import
is done when its turn comes) before it reads a module or a model file.

and answers on the stdout it was given, one JSON object a line:

  {"hello": {"keras": V, "tensorflow": V, "python": V}, "ms": {"imports": MS}}
  {"start": i, "ms": {"cleanup": MS}}
  {"done": i, "ok": true, "loader": "keras"|"tf_keras", "graph": "traced"|"shared",
   "inputs": [...], "outputs": [...], "check": "worker" (frozen, probe left to the worker),
   "ms": {PHASE: MS, ...}}
  {"done": i, "ok": false, "error": TEXT, "ms": {PHASE: MS, ...}}

"ms" says where the time went (`Laps`): in the hello, the imports
(TensorFlow, Keras); in a start, the clean-up after the job before it;
in a done, the job's phases in order, from its start to its done (they add
up to the job's time as this process measured it).

Anything else the model's code prints goes to stderr. Each model is loaded
with keras.models.load_model(safe_mode=not unsafe, compile=False) and written
with keras.export.ExportArchive, whose serving_default endpoint takes the
model's inputs under their input layers' names and returns a dict keyed by
the model's output names, so the SavedModel speaks Keras's names.

Jobs with the same "graph" (the supervisor's key of the file's architecture:
its config without the compile settings, the versions, the modules) share
one trace: the first is exported as above and kept; for each later one the
file's weights are loaded into that model (`load_weights`, which runs no
code from the file) and only `variables/` is written, beside a copy of the
first export's `saved_model.pb`. That is done only when the file's weights
have the very layout (every dataset's path, shape and dtype) of the traced
file's, Keras loads them without a warning and the variables written are
the traced export's (names, shapes, dtypes, count); else the file is
exported in full ("graph": "traced"), so a file never runs in a graph it
does not fit. The supervisor's key only proposes: it read the file's config
with its own zip and HDF5 readers, and a file can say one thing to those
and another to Keras. A file shares the trace only when the config Keras
reads from it has the traced file's digest (`loaded_config_digest`); any
other file of the group is exported in full. In a .keras archive that
digest does not count the layers' names where they provably do not change
the graph (`blind_layer_names`): models of one architecture built
separately, whose automatic names differ, share a trace as checkpoints do.

Any other file is frozen ("graph": "frozen", see export_frozen) unless its
job says "freeze": false (the supervisor's second export of a file whose
frozen graph failed its check in a worker); "check": "worker" leaves the
frozen graph's check to the unit's worker.
"""

import time

_began = time.monotonic()

import importlib.util  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402


class Laps:
    """Where a stretch of this process's time went: each `lap(name)` is the
    time since the one before (or since `since`), in whole milliseconds of
    one clock, so the laps add up to the whole stretch."""

    def __init__(self, since=None):
        self.since = time.monotonic() if since is None else since
        self.last = self.since
        self.laps = {}

    def lap(self, name):
        now = time.monotonic()
        # Rounded at the ends, not per lap: the laps add up to the stretch exactly.
        ms = round((now - self.since) * 1000) - round((self.last - self.since) * 1000)
        self.laps[name] = self.laps.get(name, 0) + ms
        self.last = now


# The protocol keeps the stdout isorun gave us; everything else goes to stderr.
_answers = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr


def say(message):
    _answers.write(json.dumps(message) + "\n")
    _answers.flush()


os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# The request is one line; the supervisor may start this process before its
# turn and close stdin when it is (below, after the import and the hello).
request = json.loads(sys.stdin.readline())
_started = Laps(_began)
_started.lap("request")
if os.environ.get("ISORUN_EXPORT_HANG") == "import":
    import time

    while True:
        time.sleep(1)
# Keras imports pandas and scikit-learn at start-up only to accept their
# types in fit/predict (each guarded by `except ImportError`); an export uses
# neither, and they are ~1 s of a ~4.5 s import, on the first file's path.
# Held off for the import only: a --keras-module or a later import that
# wants them gets them as usual.
_HELD_OFF = [name for name in ("pandas", "sklearn") if name not in sys.modules]
for _name in _HELD_OFF:
    sys.modules[_name] = None
try:
    import numpy as np  # noqa: E402
    import tensorflow as tf  # noqa: E402
    import keras  # noqa: E402
finally:
    for _name in _HELD_OFF:
        if sys.modules.get(_name, 0) is None:
            del sys.modules[_name]

_started.lap("imports")
say({"hello": {"keras": keras.__version__, "tensorflow": tf.__version__, "python": sys.version.split()[0]},
     "ms": {"imports": _started.laps["imports"]}})
# Wait for our turn: no module and no model file is read before it.
sys.stdin.read()

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


def keep_attr_skipsets():
    """Keras 3 (3.15 here) walks a model's attributes to load its weights,
    skipping those a bare `Layer` has (`saving_lib.get_attr_skipset`: the
    `dir()` of a throwaway `Layer()`), and means to compute that set once:
    it stores it as `saving_attr_skipset_T` but looks for
    `saving_attr_skiplist_T`, so every layer of every load builds a new
    throwaway layer, a fifth of a checkpoint's `load_weights` here. This
    stores each set, as Keras computes it, under the name Keras looks for
    (again after each `clear_session`, which forgets them): the same sets,
    once. Nothing where this Keras has no such function."""
    try:
        from keras.src.backend.common import global_state
        from keras.src.saving import saving_lib

        for kind in ("Operation", "Layer", "Functional", "Sequential"):
            name = f"saving_attr_skiplist_{kind}"
            if global_state.get_global_attribute(name) is None:
                global_state.set_global_attribute(name, saving_lib.get_attr_skipset(kind))
    except Exception:  # noqa: BLE001 - another Keras: it computes them as it does
        pass


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


def serving_function(model):
    """The serving function both export ways trace: the model's inputs under
    their input layers' names in, a dict keyed by its output names out."""
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

    return names, specs, outputs, serve


class Unfreezable(Exception):
    """The model cannot be written as a frozen graph: export it the other way."""


# A frozen graph holds its weights in saved_model.pb, which protobuf caps at
# 2 GiB; freezing also holds a few copies of them at once (constants, the
# GraphDef, the graph imported for writing), so bigger models take the
# archive's way, which writes the variables from where they are.
MAX_FROZEN_BYTES = 512 << 20

# Where a frozen export whose check is left to the worker keeps the probe
# and the traced function's outputs on it (beside `saved_model/`; the
# supervisor stores it with the entry), and the most its arrays may take
# (above that the check runs here).
CHECK_FILE = "frozen-check.npz"
MAX_CHECK_BYTES = 32 << 20


def freeze(concrete):
    """The traced function's GraphDef with its variables folded into
    constants. TensorFlow's `convert_variables_to_constants_v2` does the
    same and then imports the result into a new function (`_construct_
    concrete_function`: most of its time on a big model, and the function
    is not needed here); its two steps before that are called directly
    where this TensorFlow has them."""
    from tensorflow.python.framework import convert_to_constants as constants

    steps = getattr(constants, "_FunctionConverterDataInEager", None), getattr(
        constants, "_replace_variables_by_constants", None
    )
    if None not in steps:
        try:
            data = steps[0](func=concrete, lower_control_flow=True, aggressive_inlining=False)
            graph_def, _ = steps[1](converter_data=data)
            return graph_def
        except (TypeError, ValueError, AttributeError):
            # Another TensorFlow's private steps: the public way, whose own errors are the caller's.
            pass
    return constants.convert_variables_to_constants_v2(concrete).graph.as_graph_def()


def probe_inputs(specs):
    """The one row a frozen graph is checked on: floats uniform in [0, 1)
    from a fixed seed (zeros alone would hide a wrong first-layer weight
    behind a zero input), integers and bools zero (an index into a table
    must be in range)."""
    rng = np.random.default_rng(0)
    values = []
    for spec in specs:
        shape = (1,) + tuple(spec.shape)[1:]
        if spec.dtype.is_floating:
            values.append(rng.random(shape).astype(spec.dtype.as_numpy_dtype))
        else:
            values.append(np.zeros(shape, spec.dtype.as_numpy_dtype))
    return values


def export_frozen(model, out, check_here=True, laps=None):
    """The fast way for a file whose graph no later file shares: trace the
    serving function once, fold the variables into constants, and write a
    SavedModel with that one graph and its signature (TensorFlow's v1
    builder: no object graph, no checkpoint, no traced save and restore
    functions, which are most of `ExportArchive.write_out`'s time on a big
    model, and nothing for the worker to restore when it loads).

    The frozen graph must give the traced function's outputs on one probe
    row (`probe_inputs`). With `check_here` it is run here, in a session;
    else the probe and the function's outputs are written beside `out` in
    `CHECK_FILE`, and the unit's worker runs the probe first (the graph is
    loaded there anyway, and a second run of a loaded graph costs a
    fraction of a session here: ConvNeXtTiny 0.4 s against 2.5 s); a graph
    that fails it is exported again the archive's way. A model that does
    not fit (resources other than variables, an input with an unknown
    inner dimension, outputs that are not a flat dict of tensors, weights
    over 512 MiB) raises Unfreezable. Returns the input names, the output
    names and whether the check was left to the worker. Its steps are
    `laps`' (trace, freeze, probe and write)."""
    laps = laps or Laps()
    names, specs, outputs, serve = serving_function(model)
    weights = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights)
    if weights > MAX_FROZEN_BYTES:
        raise Unfreezable(f"its weights take {weights >> 20} MiB, over {MAX_FROZEN_BYTES >> 20} MiB")
    if any(None in tuple(s.shape)[1:] or s.shape.rank is None or s.shape.rank == 0 for s in specs):
        raise Unfreezable("an input has an unknown inner dimension")
    if any(not (s.dtype.is_floating or s.dtype.is_integer or s.dtype.is_bool) for s in specs):
        raise Unfreezable("an input is not numeric")
    concrete = tf.function(serve).get_concrete_function(*specs)
    laps.lap("trace")
    structured = concrete.structured_outputs
    if not isinstance(structured, dict) or not structured or not all(tf.is_tensor(v) for v in structured.values()):
        raise Unfreezable("the outputs are not a flat dict of tensors")
    try:
        graph_def = freeze(concrete)
    except Exception as error:  # noqa: BLE001 - any model this cannot fold is exported the other way
        raise Unfreezable(f"{type(error).__name__}: {error}") from None
    laps.lap("freeze")
    if graph_def.ByteSize() > 2 * MAX_FROZEN_BYTES:
        raise Unfreezable(f"the frozen graph is over {2 * MAX_FROZEN_BYTES >> 20} MiB")
    # The function's own inputs come first, then what it captured (the
    # variables, folded now); its outputs are the dict's values by sorted
    # key. Freezing keeps their names, so the signature is built from the
    # function's graph (importing the frozen one costs ~1 s on a big model).
    keys = sorted(structured)
    if len(concrete.outputs) != len(keys):
        raise Unfreezable("the traced function's outputs do not match its dict")
    with concrete.graph.as_default():
        signature = tf.compat.v1.saved_model.signature_def_utils.predict_signature_def(
            dict(zip(names, concrete.inputs[: len(specs)])), dict(zip(keys, concrete.outputs))
        )
    probe = probe_inputs(specs)
    expected, failed = {}, []

    def run_probe():
        # Without Grappler (as `check_frozen`'s session): its constant
        # folding costs seconds on a big model and changes nothing the
        # check compares.
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
        try:
            traced = concrete(*[tf.constant(p) for p in probe])
            expected.update({key: traced[key].numpy() for key in keys})
        except BaseException as error:  # noqa: BLE001 - raised again below, on the export's thread
            failed.append(error)
        finally:
            tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": False})

    if check_here:
        run_probe()
    else:
        # The traced function runs in TensorFlow's C++ (the GIL released)
        # while this thread serializes and writes saved_model.pb: on a big
        # model each takes a few tenths of a second.
        probing = threading.Thread(target=run_probe, name="probe")
        probing.start()
        try:
            write_saved_model(out, graph_def, signature)
        finally:
            probing.join()
    laps.lap("probe_and_write" if not check_here else "probe")
    if failed:
        raise failed[0]
    # A probe whose arrays are too big to keep beside the export is checked here after all.
    size = sum(a.nbytes for a in probe) + sum(a.nbytes for a in expected.values())
    keep = not check_here and size <= MAX_CHECK_BYTES
    if not keep:
        check_frozen(graph_def, signature, names, probe, expected)
        laps.lap("session_check")
    if check_here:
        write_saved_model(out, graph_def, signature)
        laps.lap("write")
    if keep:
        arrays = {f"input/{name}": value for name, value in zip(names, probe)}
        arrays.update({f"output/{key}": value for key, value in expected.items()})
        np.savez(os.path.join(os.path.dirname(out), CHECK_FILE), **arrays)
        laps.lap("check_file")
    return names, outputs, keep


def check_frozen(graph_def, signature, names, probe, expected):
    """Runs the frozen graph on the probe in a session, without Grappler,
    and raises Unfreezable unless it gives the `expected` outputs."""
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    feed = {graph.get_tensor_by_name(signature.inputs[name].name): value for name, value in zip(names, probe)}
    fetch = {key: graph.get_tensor_by_name(info.name) for key, info in signature.outputs.items()}
    config = tf.compat.v1.ConfigProto()
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        got = session.run(fetch, feed)
    for key, a in expected.items():
        b = got[key]
        if a.shape != b.shape or a.dtype != b.dtype or not np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True):
            raise Unfreezable(f"the frozen graph's output {key} differs from the model's")


def write_saved_model(out, graph_def, signature):
    """A SavedModel of one meta graph (tag `serve`) and its `serving_default`
    signature, written from `graph_def` as it is: what TensorFlow's v1
    builder writes for a graph with no variables, without importing the
    graph into a session and serializing it back."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved_model = saved_model_pb2.SavedModel(saved_model_schema_version=1)
    meta_graph = saved_model.meta_graphs.add()
    meta_graph.meta_info_def.tags.append("serve")
    meta_graph.meta_info_def.tensorflow_version = tf.__version__
    meta_graph.meta_info_def.tensorflow_git_version = tf.__git_version__
    meta_graph.graph_def.CopyFrom(graph_def)
    meta_graph.signature_def["serving_default"].CopyFrom(signature)
    os.makedirs(os.path.join(out, "variables"))
    with open(os.path.join(out, "saved_model.pb"), "wb") as f:
        f.write(saved_model.SerializeToString())


def export_keras(model, out):
    names, specs, outputs, serve = serving_function(model)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(name="serving_default", fn=serve, input_signature=specs)
    archive.write_out(out, verbose=False)
    return names, outputs, archive


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
    as the supervisor checks too (engine/src/keras/files/model_config.rs, code_in_config);
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


def weights_layout(path):
    """Every weight dataset of a Keras file (path, shape, dtype), without
    reading the values; None where the weights are not in one HDF5 store
    (sharded weights, or an unreadable file): such a file is not shared."""
    import h5py
    import zipfile

    found = []

    def visit(name, item):
        if isinstance(item, h5py.Dataset):
            found.append((name, tuple(item.shape), item.dtype.str))

    try:
        if path.endswith(".keras"):
            with zipfile.ZipFile(path) as archive, archive.open("model.weights.h5") as member:
                with h5py.File(member, "r") as store:
                    store.visititems(visit)
        else:
            with h5py.File(path, "r") as store:
                store.visititems(visit)
    except Exception:  # noqa: BLE001 - not shareable, exported in full
        return None
    return sorted(found)


def checkpoint_layout(out):
    """The variables of an export's checkpoint: name -> (shape, dtype)."""
    prefix = os.path.join(out, "variables", "variables")
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    return {name: (tuple(shapes[name]), dtypes[name].name) for name in shapes}


def shareable(model, out):
    """Whether later files of this architecture may reuse this export: no
    assets (a vocabulary travels beside the graph, not in variables) and no
    layer that keeps state outside its variables."""
    assets = os.path.join(out, "assets")
    if os.path.isdir(assets) and os.listdir(assets):
        return False
    layers = list(model._flatten_layers(include_self=True))
    return not any(hasattr(layer, "load_assets") for layer in layers)


def renumber_shared_objects(value, seen):
    """Each `shared_object_id` (a Python id() when saved, an address that
    differs in every process) becomes its index among the distinct ids met
    so far, depth first in the file's key order."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "shared_object_id":
                if item not in seen:
                    seen.append(item)
                value[key] = seen.index(item)
            else:
                renumber_shared_objects(item, seen)
    elif isinstance(value, list):
        for item in value:
            renumber_shared_objects(item, seen)


def keras_class(value):
    """Whether a config object (one with a "class_name") names one of
    Keras's own classes: its module `keras` or `keras.*`, no registered
    name but its own, and not a `Lambda` (code of the file's)."""
    name = value.get("class_name")
    if name == "__keras_tensor__":
        return True
    module = value.get("module")
    return (isinstance(name, str) and name != "Lambda" and isinstance(module, str)
            and (module == "keras" or module.startswith("keras."))
            and value.get("registered_name") in (None, name))


def blind_layer_names(config):
    """The config of a `.keras` archive with its layers' names replaced by
    "/0", "/1", ... in the order the layers are listed (depth first), or
    None where that is not provably harmless (then the names count as they
    are). Keras 3 binds a `.keras` archive's weights to layers by position
    and class (`layers/dense_1/vars/0` is the second Dense, whatever its
    name), and its own layers use a name for naming only, so two models
    whose configs differ only in the names of such layers build the same
    graph; what a name reaches beyond that is kept:
    - the names the export's signature speaks (the model's input and
      output layers: every string in the top-level `input_layers` and
      `output_layers` of a functional model, the first and last layer of a
      Sequential one) are kept as they are;
    - a name is replaced only where it names a layer (a layer's `name`
      and its config's `name`) or refers to one (a `keras_history`'s first
      item, a nested model's `input_layers` and `output_layers`), the same
      name by the same placeholder everywhere: a name met anywhere else
      (a wrapper's inner layer, a custom field), a reference to no listed
      layer, a layer whose two names differ, a name with "/" (which Keras
      refuses: a placeholder cannot be forged) or any class that is not
      Keras's own (a custom layer may read its name) leaves the names as
      they are."""
    import copy

    if not isinstance(config, dict) or not isinstance(config.get("config"), dict):
        return None
    top = config["config"]
    if not isinstance(top.get("layers"), list):
        return None

    def strings(value, out):
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list):
            for item in value:
                strings(item, out)
        elif isinstance(value, dict):
            for key, item in value.items():
                out.append(key)
                strings(item, out)
        return out

    def every_class_keras(value):
        if isinstance(value, dict):
            if "class_name" in value and not keras_class(value):
                return False
            return all(every_class_keras(item) for item in value.values())
        if isinstance(value, list):
            return all(every_class_keras(item) for item in value)
        return True

    if not every_class_keras(config):
        return None
    if "input_layers" in top and "output_layers" in top:
        kept = set(strings(top["input_layers"], []) + strings(top["output_layers"], []))
    elif config.get("class_name") == "Sequential":
        kept = set()
        for entry in (top["layers"][:1] + top["layers"][-1:]):
            if isinstance(entry, dict) and isinstance(entry.get("config"), dict):
                kept.update(n for n in (entry["config"].get("name"), entry.get("name")) if isinstance(n, str))
    else:
        return None
    blind = copy.deepcopy(config)
    names = {}

    def name_of(value):
        if not isinstance(value, str) or "/" in value:
            raise ValueError
        if value in kept:
            return value
        return names.setdefault(value, f"/{len(names)}")

    def reference(value):
        if not isinstance(value, str) or (value not in names and value not in kept):
            raise ValueError
        return names.get(value, value)

    def layers(model):
        # Each layer's name, and a nested model's layers after it, in order.
        for entry in model["layers"]:
            if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
                raise ValueError
            inner = entry["config"]
            if "name" in entry and entry["name"] != inner.get("name"):
                raise ValueError
            inner["name"] = name_of(inner.get("name"))
            if "name" in entry:
                entry["name"] = inner["name"]
            if "layers" in inner:
                if not isinstance(inner["layers"], list):
                    raise ValueError
                layers(inner)

    def references(value):
        # Each keras_history's layer; a nested model's input_layers and output_layers.
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "keras_history":
                    if not isinstance(item, list) or not item:
                        raise ValueError
                    item[0] = reference(item[0])
                elif key in ("input_layers", "output_layers") and value is not blind["config"]:
                    value[key] = rename_all(item)
                else:
                    references(item)
        elif isinstance(value, list):
            for item in value:
                references(item)

    def rename_all(value):
        if isinstance(value, str):
            return reference(value)
        if isinstance(value, list):
            return [rename_all(item) for item in value]
        if isinstance(value, dict):
            return {key: rename_all(item) for key, item in value.items()}
        return value

    try:
        if "name" in blind["config"]:
            blind["config"]["name"] = name_of(blind["config"]["name"])
        layers(blind["config"])
        references(blind)
    except ValueError:
        return None
    # A replaced name met anywhere else: the names stay as they are.
    if names.keys() & set(strings(blind, [])):
        return None
    return blind


def loaded_config_digest(path):
    """The SHA-256 of the model config Keras builds a file's model from, or
    None (then the file shares no trace). It is read the way Keras reads it,
    not the way the supervisor did: for a .keras archive, the bytes of
    `zipfile.ZipFile(path).open("config.json")` (saving_lib's
    `_load_model_from_fileobj`: zipfile cuts a name at a NUL byte and lets
    a later entry of the same name win, so this is the entry Keras takes);
    for an .h5 file, h5py's root attribute `model_config` (legacy_h5_format).
    The JSON is parsed with `json.loads` as Keras parses it, its top-level
    `compile_config` dropped (loaded with compile=False, Keras ignores it),
    each `shared_object_id` renumbered by first appearance, in a .keras
    archive its layers' names replaced where that provably changes nothing
    (`blind_layer_names`: Keras's automatic names do not count, the input
    and output names do), and written with sorted keys and no spaces
    (`json.dumps(sort_keys=True)`); the digest covers the format and
    whether the names were replaced too. An archive with two entries of one name
    as zipfile reads them has no digest: which one Keras took is zipfile's
    choice, not the file's plain meaning."""
    import hashlib
    import zipfile

    try:
        if path.endswith(".keras"):
            fmt = "keras"
            with zipfile.ZipFile(path) as archive:
                names = [info.filename for info in archive.infolist()]
                if len(names) != len(set(names)):
                    return None
                with archive.open("config.json") as member:
                    raw = member.read()
        else:
            import h5py

            fmt = "h5"
            with h5py.File(path, "r") as f:
                raw = f.attrs.get("model_config")
            if raw is None:
                return None
        if hasattr(raw, "decode"):
            raw = raw.decode("utf-8")
        config = json.loads(raw)
    except Exception:  # noqa: BLE001 - unreadable: exported in full, where Keras says why
        return None
    if not isinstance(config, dict):
        return None
    config.pop("compile_config", None)
    # A .keras archive's weights are bound by position and class, not by
    # layer name: Keras's automatic names (dense_2 or dense_7) do not count.
    blind = blind_layer_names(config) if fmt == "keras" else None
    names = "names-blind" if blind is not None else "names"
    config = blind if blind is not None else config
    renumber_shared_objects(config, [])
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{fmt}\0{names}\0{text}".encode()).hexdigest()


class Graph:
    """A traced export kept for the files of the same architecture: only a
    file whose config, as Keras reads it, has the traced file's digest
    (`config`) may share it."""

    def __init__(self, key, config, model, archive, out, layout, names, outputs):
        self.key = key
        self.config = config
        self.model = model
        self.archive = archive
        self.layout = layout
        self.names = names
        self.outputs = outputs
        # The export itself is moved into the cache once reported: keep what is copied.
        with open(os.path.join(out, "saved_model.pb"), "rb") as f:
            self.saved_model = f.read()
        self.variables = checkpoint_layout(out)


def export_shared(graph, path, out, laps):
    """Writes `out` from `graph` with the weights of `path`; a string says
    why not (the caller exports the file in full). Its steps are `laps`'."""
    from tensorflow.python.checkpoint import checkpoint as checkpoint_lib
    from tensorflow.python.checkpoint import graph_view

    config = loaded_config_digest(path)
    laps.lap("config")
    if config is None or config != graph.config:
        return "its config, as Keras reads it, is not the traced file's"
    layout = weights_layout(path)
    laps.lap("layout")
    if layout is None or layout != graph.layout:
        return "its weights are laid out unlike the traced file's"
    keep_attr_skipsets()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph.model.load_weights(path)
    laps.lap("load_weights")
    if caught:
        return f"loading its weights warned: {caught[0].message}"
    os.makedirs(os.path.join(out, "variables"))
    os.makedirs(os.path.join(out, "assets"))
    with open(os.path.join(out, "saved_model.pb"), "wb") as f:
        f.write(graph.saved_model)
    saver = checkpoint_lib.TrackableSaver(graph_view.ObjectGraphView(graph.archive._tf_trackable))
    saver.save(os.path.join(out, "variables", "variables"))
    laps.lap("write")
    written = checkpoint_layout(out)
    laps.lap("verify")
    if written != graph.variables:
        return "the variables written differ from the traced export's"
    try:
        from tensorflow.python.saved_model.pywrap_saved_model import fingerprinting

        with open(os.path.join(out, "fingerprint.pb"), "wb") as f:
            f.write(fingerprinting.CreateFingerprintDef(out))
    except Exception:  # noqa: BLE001 - the fingerprint is optional (no loader requires it)
        pass
    laps.lap("fingerprint")
    return None


graph = None
exported_bytes = 0
cleanup_ms = None
for index, job in enumerate(request["jobs"]):
    say({"start": index} if cleanup_ms is None else {"start": index, "ms": {"cleanup": cleanup_ms}})
    laps = Laps()
    if module_error is not None:
        say({"done": index, "ok": False, "error": module_error})
        continue
    if os.environ.get("ISORUN_EXPORT_HANG") == "export":
        import time

        while True:
            time.sleep(1)
    try:
        loader = "keras"
        graph_way = "traced"
        unsafe = request.get("unsafe", False)
        key = job.get("graph")
        if key is not None and not unsafe and graph is not None and graph.key == key:
            try:
                why = export_shared(graph, job["file"], job["out"], laps)
            except Exception as error:  # noqa: BLE001 - a file that does not fit is exported in full
                why = f"{type(error).__name__}: {error}"
            if why is None:
                say({"done": index, "ok": True, "loader": "keras", "graph": "shared", "inputs": graph.names,
                     "outputs": graph.outputs, "ms": laps.laps})
                cleanup_ms = None
                continue
            print(f"isorun: {job['file']}: exported in full: {why}", file=sys.stderr)
            shutil.rmtree(job["out"], ignore_errors=True)
            laps.lap("not_shared")
        # Read before Keras reads the file: the config this trace may be shared on.
        config = loaded_config_digest(job["file"]) if key is not None and not unsafe else None
        laps.lap("config")
        keep_attr_skipsets()
        try:
            model = keras.models.load_model(job["file"], compile=False, safe_mode=not unsafe)
            laps.lap("load_model")
        except Exception as keras_error:
            if not job["file"].endswith((".h5", ".hdf5")) or importlib.util.find_spec("tf_keras") is None:
                raise
            # A safety refusal is final: tf_keras ignores safe_mode for HDF5
            # files and would run the very bytecode Keras refused.
            if not unsafe and ("safe_mode" in str(keras_error) or h5_carries_code(job["file"])):
                raise
            try:
                laps.lap("load_model")
                names, outputs = export_tf_keras(job["file"], job["out"])
                laps.lap("tf_keras")
                loader = "tf_keras"
            except Exception:
                raise keras_error from None
        else:
            # A file whose graph a later job shares is exported with the
            # archive that job needs; any other is frozen when it can be.
            shared_later = key is not None and not unsafe and any(
                later.get("graph") == key for later in request["jobs"][index + 1:]
            )
            archive = None
            if not shared_later and job.get("freeze", True):
                try:
                    names, outputs, deferred = export_frozen(model, job["out"], job.get("check") != "worker", laps)
                    graph_way = "frozen"
                    # No later job shares this group's graph, nor an earlier group's (groups come in a row).
                    graph = None
                except Exception as why:  # noqa: BLE001 - Unfreezable, or anything else: the archive's way
                    print(f"isorun: {job['file']}: not frozen: {why}", file=sys.stderr)
                    shutil.rmtree(job["out"], ignore_errors=True)
                    check_file = os.path.join(os.path.dirname(job["out"]), CHECK_FILE)
                    if os.path.exists(check_file):
                        os.remove(check_file)
                    if os.path.exists(job["out"]):
                        raise RuntimeError(f"cannot remove the unfinished frozen export {job['out']}") from None
                    laps.lap("not_frozen")
            if graph_way != "frozen":
                names, outputs, archive = export_keras(model, job["out"])
                laps.lap("archive")
                graph_way = "traced"
            if archive is not None and key is not None and not unsafe and (graph is None or graph.key != key):
                layout = weights_layout(job["file"])
                # Only one graph is kept: the supervisor sends a group's files in a row.
                graph = None
                if layout is not None and config is not None and shareable(model, job["out"]):
                    graph = Graph(key, config, model, archive, job["out"], layout, names, outputs)
                laps.lap("keep")
            del model, archive
        done = {"done": index, "ok": True, "loader": loader, "graph": graph_way, "inputs": names, "outputs": outputs,
                "ms": laps.laps}
        if graph_way == "frozen" and deferred:
            done["check"] = "worker"
        say(done)
    except BaseException as error:  # noqa: BLE001 - every failure is this model's record
        text = f"{type(error).__name__}: {error}".strip()
        traceback.print_exc(file=sys.stderr)
        laps.lap("failed")
        say({"done": index, "ok": False, "error": text, "ms": laps.laps})
    # A full collection costs ~0.3 s with TensorFlow loaded, more than many
    # an export: collect after big files and every few files, not after each.
    exported_bytes += os.path.getsize(job["file"]) if os.path.exists(job["file"]) else 0
    full = exported_bytes >= 256 << 20 or index % 8 == 7
    cleanup = Laps()
    keras.backend.clear_session(free_memory=full)
    cleanup.lap("cleanup")
    cleanup_ms = cleanup.laps["cleanup"]
    if full:
        exported_bytes = 0
