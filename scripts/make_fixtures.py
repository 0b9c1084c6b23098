"""Generate isorun's SavedModel fixtures, expected outputs and demo models.

Run through scripts/make-fixtures, which provides the interpreter
(tensorflow-cpu==2.21.0 + numpy) and the environment. Writes, replacing
whatever was there:

  tests/fixtures/models/<model>/          SavedModels for the tests
  tests/fixtures/expected/<case>/         inputs/<name>.npy, outputs/<name>.npy,
                                          inputs.npz (np.savez, keys = input names)
  tests/fixtures/manifest.json            the list of cases
  tests/fixtures/tf1/<model>/             TF1 SavedModels (graph mode, reference
                                          variables), checked here, not in the manifest
  examples/models/<model>/                SavedModels for the demo
  examples/inputs.npz                     key "x": float32 [8, 4] in [0, 1)

A case is named <model>__<signature>[__<variant>]. Expected outputs are
computed by loading each SavedModel back and calling the signature.

.npy conventions: little-endian, C order, never pickled. Strings are
fixed-width bytes (|S<n>) and may not end in NUL bytes (the format drops
them). bfloat16 outputs are stored as float32 holding the exact values
(the manifest keeps dtype "bfloat16" and adds "stored_as": "float32").
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import fingerprint_pb2, saved_model_pb2  # noqa: E402

MAX_MODEL_BYTES = 1 << 20

DTYPE_NAMES = {
    tf.float32: "float32",
    tf.float64: "float64",
    tf.float16: "float16",
    tf.bfloat16: "bfloat16",
    tf.int8: "int8",
    tf.int16: "int16",
    tf.int32: "int32",
    tf.int64: "int64",
    tf.uint8: "uint8",
    tf.uint16: "uint16",
    tf.bool: "bool",
    tf.string: "string",
}

# numpy dtype used in the .npy files for each TensorFlow dtype (string is
# handled separately: fixed width |S<n>).
NPY_DTYPES = {
    tf.float32: "<f4",
    tf.float64: "<f8",
    tf.float16: "<f2",
    tf.bfloat16: "<f4",  # exact: every bfloat16 is a float32
    tf.int8: "|i1",
    tf.int16: "<i2",
    tf.int32: "<i4",
    tf.int64: "<i8",
    tf.uint8: "|u1",
    tf.uint16: "<u2",
    tf.bool: "|b1",
}


def spec(shape, dtype, name):
    return tf.TensorSpec(shape, dtype, name=name)


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------


def build_keras_mlp(path):
    tf.keras.utils.set_random_seed(0)
    features = tf.keras.Input(shape=(8,), dtype="float32", name="features")
    hidden = tf.keras.layers.Dense(16, activation="relu", name="hidden")(features)
    probs = tf.keras.layers.Dense(4, activation="softmax", name="probabilities")(hidden)
    # A dict output makes the signature's output key "probabilities" (a bare
    # tensor output would be exported as "output_0").
    model = tf.keras.Model(features, {"probabilities": probs}, name="keras_mlp")
    model.export(path, verbose=False)


def build_multi_sig(path):
    class MultiSig(tf.Module):
        @tf.function(input_signature=[spec([None, 3], tf.float32, "x")])
        def serve(self, x):
            return {"y": x * 2.0 + 1.0}

        @tf.function(
            input_signature=[
                spec([None], tf.int64, "a"),
                spec([None], tf.int64, "b"),
            ]
        )
        def add(self, a, b):
            return {"sum": a + b}

        @tf.function(
            input_signature=[
                spec([2, 2], tf.float32, "floats"),
                spec([2], tf.int64, "counts"),
                spec([2], tf.bool, "flags"),
                spec([2], tf.string, "words"),
            ]
        )
        def mixed(self, floats, counts, flags, words):
            return {
                "scaled": floats * 0.5,
                "total": tf.reduce_sum(counts),
                "any_flag": tf.reduce_any(flags),
                "upper": tf.strings.upper(words),
                "lengths": tf.strings.length(words),
                "echo": tf.identity(words),
            }

    m = MultiSig()
    tf.saved_model.save(
        m,
        path,
        signatures={"serving_default": m.serve, "add": m.add, "mixed": m.mixed},
    )


DTYPES_INPUTS = [
    ("f64", tf.float64),
    ("f16", tf.float16),
    ("i8", tf.int8),
    ("i16", tf.int16),
    ("i32", tf.int32),
    ("u8", tf.uint8),
    ("u16", tf.uint16),
]


def build_dtypes(path):
    class Dtypes(tf.Module):
        @tf.function(input_signature=[spec([None], dt, n) for n, dt in DTYPES_INPUTS])
        def serve(self, f64, f16, i8, i16, i32, u8, u16):
            args = dict(f64=f64, f16=f16, i8=i8, i16=i16, i32=i32, u8=u8, u16=u16)
            return {
                f"{n}_out": args[n] + tf.constant(1, dtype=dt) for n, dt in DTYPES_INPUTS
            }

        @tf.function(input_signature=[spec([None], tf.float32, "x")])
        def bf16(self, x):
            as_bf16 = tf.cast(x, tf.bfloat16)
            return {"as_bf16": as_bf16, "back": tf.cast(as_bf16, tf.float32)}

    m = Dtypes()
    tf.saved_model.save(m, path, signatures={"serving_default": m.serve, "bf16": m.bf16})


def build_asserting(path):
    class Asserting(tf.Module):
        @tf.function(input_signature=[spec([None], tf.float32, "x")])
        def serve(self, x):
            check = tf.debugging.assert_non_negative(x, message="x must be non-negative")
            with tf.control_dependencies([check]):
                return {"sqrt": tf.sqrt(x)}

    m = Asserting()
    tf.saved_model.save(m, path, signatures={"serving_default": m.serve})


def build_dynamic(path):
    class Dynamic(tf.Module):
        @tf.function(input_signature=[spec([None, None], tf.float32, "m")])
        def serve(self, m):
            return {"row_sums": tf.reduce_sum(m, axis=1), "shape": tf.shape(m)}

    m = Dynamic()
    tf.saved_model.save(m, path, signatures={"serving_default": m.serve})


def build_fixed_shape(path):
    class FixedShape(tf.Module):
        @tf.function(input_signature=[spec([1, 4, 4, 1], tf.float32, "image")])
        def serve(self, image):
            return {"mean": tf.reduce_mean(image)}

    m = FixedShape()
    tf.saved_model.save(m, path, signatures={"serving_default": m.serve})


# A model that uses the file system, as a hostile model would: the sandbox
# tests point it at paths outside its folder (kept apart in
# tests/fixtures/hostile, so ordinary runs over tests/fixtures/models never
# execute it).


def build_file_ops(path):
    class FileOps(tf.Module):
        @tf.function(input_signature=[spec([], tf.string, "path"), spec([], tf.string, "contents")])
        def write(self, path, contents):
            write = tf.io.write_file(path, contents)
            with tf.control_dependencies([write]):
                return {"written": tf.identity(path)}

        @tf.function(input_signature=[spec([], tf.string, "path")])
        def read(self, path):
            return {"contents": tf.io.read_file(path)}

        @tf.function(input_signature=[spec([], tf.string, "pattern")])
        def list(self, pattern):
            return {"files": tf.io.matching_files(pattern)}

    m = FileOps()
    tf.saved_model.save(m, path, signatures={"write": m.write, "read": m.read, "list": m.list})


HOSTILE_MODELS = {"file_ops": build_file_ops}


# --batch-size over big inputs (tests/integration/run_cli.rs): every output
# keeps the batch dimension (so chunks join) and is 1/1024 of a
# [N, 1024] input, so the supervisor's memory shows what the input costs it.
def build_row_sums(path):
    class RowSums(tf.Module):
        @tf.function(input_signature=[spec([None, None], tf.float32, "m")])
        def serve(self, m):
            return {"row_sums": tf.reduce_sum(m, axis=1)}

    m = RowSums()
    tf.saved_model.save(m, path, signatures={"serving_default": m.serve})


BATCH_MODELS = {"row_sums": build_row_sums}


# TF1 models: built in graph mode with reference variables (`VariableV2`,
# whose outputs have reference dtypes, DT_FLOAT_REF = 101, in the signatures)
# and saved with TF1's SavedModel builder, as TF Serving's own test model
# saved_model_counter is. Python's TF2 loader cannot load every such model;
# the C API, which isorun uses, can. Kept apart in tests/fixtures/tf1: they
# have no serving_default, and their signatures are stateful (the tests
# assert their outputs themselves).

COUNTER_SAVED_VALUE = 42.0
DT_FLOAT_REF = 101


def build_counter(path):
    """A counter: get_counter returns the variable (its saved value is 42.0),
    incr_counter_by adds the scalar input `delta` and returns the new value.
    as_complex returns complex64, a dtype isorun cannot carry, so that the
    tests see the other signatures run all the same."""
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        counter = v1.Variable(COUNTER_SAVED_VALUE, dtype=tf.float32, name="counter", use_resource=False)
        delta = v1.placeholder(tf.float32, shape=[], name="delta")
        incremented = v1.assign_add(counter, delta, name="incr_counter_by")
        info = v1.saved_model.utils.build_tensor_info
        signature = v1.saved_model.signature_def_utils.build_signature_def
        predict = v1.saved_model.signature_constants.PREDICT_METHOD_NAME
        signatures = {
            # The variable's ref tensor itself, as TF Serving's counter returns it.
            "get_counter": signature(inputs={}, outputs={"output": info(counter._ref())}, method_name=predict),
            "incr_counter_by": signature(
                inputs={"delta": info(delta)}, outputs={"output": info(incremented)}, method_name=predict
            ),
            "as_complex": signature(
                inputs={"delta": info(delta)},
                outputs={"output": info(tf.complex(delta, 0.0, name="as_complex"))},
                method_name=predict,
            ),
        }
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            builder = v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(
                session, [v1.saved_model.tag_constants.SERVING], signature_def_map=signatures,
                strip_default_attrs=True,
            )
            builder.save()
    check_counter(path)


def check_counter(path):
    """Reads the counter back: its outputs really are DT_FLOAT_REF in
    saved_model.pb, and TensorFlow (TF1 loader) runs both signatures."""
    sm = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        sm.ParseFromString(f.read())
    sigs = sm.meta_graphs[0].signature_def
    for key in ("get_counter", "incr_counter_by"):
        dtype = sigs[key].outputs["output"].dtype
        if dtype != DT_FLOAT_REF:
            raise RuntimeError(f"{path}: {key} output has dtype {dtype}, not DT_FLOAT_REF")
    v1 = tf.compat.v1
    with tf.Graph().as_default(), v1.Session() as session:
        meta = v1.saved_model.loader.load(session, ["serve"], path)
        get = meta.signature_def["get_counter"].outputs["output"].name
        incr = meta.signature_def["incr_counter_by"]
        got = session.run(get)
        added = session.run(incr.outputs["output"].name, {incr.inputs["delta"].name: 1.5})
    if (got, added) != (COUNTER_SAVED_VALUE, COUNTER_SAVED_VALUE + 1.5):
        raise RuntimeError(f"{path}: get_counter gave {got}, incr_counter_by(1.5) gave {added}")


def quiet_tf1(build):
    """Runs a TF1 builder without TensorFlow's warnings that TF1 APIs are deprecated."""

    def quietly(path):
        logger = tf.get_logger()
        level = logger.level
        logger.setLevel("ERROR")
        try:
            build(path)
        finally:
            logger.setLevel(level)

    return quietly


TF1_MODELS = {"counter": quiet_tf1(build_counter)}


# Example (demo) models: all take x float32 [None, 4].


def build_iris_classifier(path):
    tf.keras.utils.set_random_seed(0)
    x = tf.keras.Input(shape=(4,), dtype="float32", name="x")
    hidden = tf.keras.layers.Dense(16, activation="relu", name="hidden")(x)
    probs = tf.keras.layers.Dense(3, activation="softmax", name="probabilities")(hidden)
    model = tf.keras.Model(x, {"probabilities": probs}, name="iris_classifier")
    model.export(path, verbose=False)


def build_linear_regressor(path):
    class LinearRegressor(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable([[0.5], [-1.0], [2.0], [0.25]], dtype=tf.float32, name="w")
            self.b = tf.Variable([0.125], dtype=tf.float32, name="b")

        @tf.function(input_signature=[spec([None, 4], tf.float32, "x")])
        def serve(self, x):
            return {"y": tf.matmul(x, self.w) + self.b}

    m = LinearRegressor()
    tf.saved_model.save(m, path, signatures={"serving_default": m.serve})


def build_must_be_negative(path):
    class MustBeNegative(tf.Module):
        @tf.function(input_signature=[spec([None, 4], tf.float32, "x")])
        def serve(self, x):
            check = tf.debugging.assert_negative(
                x, message="must_be_negative expects negative inputs"
            )
            with tf.control_dependencies([check]):
                return {"y": -x}

    m = MustBeNegative()
    tf.saved_model.save(m, path, signatures={"serving_default": m.serve})


FIXTURE_MODELS = {
    "keras_mlp": build_keras_mlp,
    "multi_sig": build_multi_sig,
    "dtypes": build_dtypes,
    "asserting": build_asserting,
    "dynamic": build_dynamic,
    "fixed_shape": build_fixed_shape,
}

EXAMPLE_MODELS = {
    "iris_classifier": build_iris_classifier,
    "linear_regressor": build_linear_regressor,
    "must_be_negative": build_must_be_negative,
}


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------


def rng(seed):
    return np.random.default_rng(seed)


def cases():
    """(case, model, signature, inputs, expect_error) in manifest order."""
    out = []

    def case(model, signature, inputs, variant=None, expect_error=None):
        name = f"{model}__{signature}" + (f"__{variant}" if variant else "")
        out.append((name, model, signature, inputs, expect_error))

    case(
        "keras_mlp",
        "serving_default",
        {"features": rng(1).uniform(-1.0, 1.0, size=(3, 8)).astype(np.float32)},
    )

    case(
        "multi_sig",
        "serving_default",
        {"x": np.array([[0.0, 1.0, -2.5], [3.25, -0.5, 100.0]], dtype=np.float32)},
    )
    case(
        "multi_sig",
        "add",
        {
            "a": np.array([1, -7, 1 << 40], dtype=np.int64),
            "b": np.array([2, 3, -(1 << 33)], dtype=np.int64),
        },
    )
    case(
        "multi_sig",
        "mixed",
        {
            "floats": np.array([[1.0, -2.0], [0.25, 8.0]], dtype=np.float32),
            "counts": np.array([5, 1 << 35], dtype=np.int64),
            "flags": np.array([False, True], dtype=np.bool_),
            # One plain ASCII word and one that is not valid UTF-8.
            "words": np.array([b"hello", b"\xff\xfeok"], dtype="S"),
        },
    )

    case(
        "dtypes",
        "serving_default",
        {
            "f64": np.array([1.5, -2.25, 1e10], dtype=np.float64),
            "f16": np.array([0.5, -1.5, 1000.0], dtype=np.float16),
            "i8": np.array([-128, 0, 126], dtype=np.int8),
            "i16": np.array([-32768, 0, 32766], dtype=np.int16),
            "i32": np.array([-(1 << 31), 0, (1 << 31) - 2], dtype=np.int32),
            "u8": np.array([0, 1, 254], dtype=np.uint8),
            "u16": np.array([0, 1000, 65534], dtype=np.uint16),
        },
    )
    case(
        "dtypes",
        "bf16",
        # 1.0 is exact in bfloat16; pi and 1/3 are rounded.
        {"x": np.array([1.0, 3.1415927, -0.33333334], dtype=np.float32)},
    )

    case("asserting", "serving_default", {"x": np.array([0.0, 4.0, 2.25], dtype=np.float32)})
    case(
        "asserting",
        "serving_default",
        {"x": np.array([1.0, -4.0], dtype=np.float32)},
        variant="negative",
        expect_error={
            "kind": "tensorflow",
            "code": "INVALID_ARGUMENT",
            "message_contains": "x must be non-negative",
        },
    )

    case(
        "dynamic",
        "serving_default",
        {"m": np.array([[1.0, 2.0, 3.0], [-1.0, 0.5, 0.25]], dtype=np.float32)},
    )
    case(
        "dynamic",
        "serving_default",
        {"m": np.arange(15, dtype=np.float32).reshape(3, 5) * 0.5 - 2.0},
        variant="3x5",
    )

    case(
        "fixed_shape",
        "serving_default",
        {"image": (np.arange(16, dtype=np.float32) / 8.0).reshape(1, 4, 4, 1)},
    )
    return out


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------


def to_npy_array(value, dtype):
    """A numpy array fit for np.save without pickling."""
    arr = np.asarray(value)
    if dtype == tf.string:
        flat = [bytes(b) for b in arr.reshape(-1).tolist()]
        for b in flat:
            if b.endswith(b"\0"):
                raise ValueError(f"string {b!r} ends in NUL; .npy |S would drop it")
        width = max([len(b) for b in flat] + [1])
        arr = np.array(flat, dtype=f"S{width}").reshape(arr.shape)
    else:
        arr = arr.astype(NPY_DTYPES[dtype])
    return np.array(arr, order="C", copy=True)  # (ascontiguousarray makes 0-d arrays 1-d)


def shape_list(shape):
    return [None if d is None else int(d) for d in tf.TensorShape(shape).as_list()]


def tensor_names(model_dir, signature):
    sm = saved_model_pb2.SavedModel()
    with open(os.path.join(model_dir, "saved_model.pb"), "rb") as f:
        sm.ParseFromString(f.read())
    sig = sm.meta_graphs[0].signature_def[signature]
    return (
        {k: v.name for k, v in sig.inputs.items()},
        {k: v.name for k, v in sig.outputs.items()},
    )


def dir_size(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def save_npy(path, arr):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.save(path, arr, allow_pickle=False)


def make_keras_export_stable():
    """Byte-stable model.export() output.

    Keras lists the variables an exported function uses in an order that
    changes from run to run, which reorders the graph and the checkpoint (same
    values, different bytes). Sorting them by name fixes that. This patches a
    private Keras helper; if it is gone, the export still works, only not
    byte for byte the same across runs.
    """
    try:
        from keras.src.export import saved_model_export_archive as archive
    except ImportError:
        return
    original = getattr(archive, "_list_variables_used_by_fns", None)
    if original is None or getattr(original, "_isorun_sorted", False):
        return

    def sorted_variables(fns):
        trainable, non_trainable = original(fns)
        return (
            sorted(trainable, key=lambda v: v.name),
            sorted(non_trainable, key=lambda v: v.name),
        )

    sorted_variables._isorun_sorted = True
    archive._list_variables_used_by_fns = sorted_variables


def stabilise_fingerprint(path):
    """Replace the random uuid in fingerprint.pb with one derived from the
    model's content hashes, so that unchanged models give unchanged files.
    (TensorFlow only reads the fingerprint for logging and metrics.)"""
    fp_path = os.path.join(path, "fingerprint.pb")
    if not os.path.exists(fp_path):
        return
    fp = fingerprint_pb2.FingerprintDef()
    with open(fp_path, "rb") as f:
        fp.ParseFromString(f.read())
    fp.uuid = ""
    digest = hashlib.sha256(fp.SerializeToString(deterministic=True)).digest()
    fp.uuid = str(int.from_bytes(digest[:16], "big"))
    with open(fp_path, "wb") as f:
        f.write(fp.SerializeToString(deterministic=True))


def build_models(builders, models_dir):
    for name, build in builders.items():
        path = os.path.join(models_dir, name)
        build(path)
        stabilise_fingerprint(path)
        size = dir_size(path)
        if size >= MAX_MODEL_BYTES:
            raise RuntimeError(f"{path} is {size} bytes, over the 1 MB limit")


def run_cases(models_dir, expected_dir):
    manifest = []
    loaded = {}
    for name, model, signature, inputs, expect_error in cases():
        model_dir = os.path.join(models_dir, model)
        if model not in loaded:
            loaded[model] = tf.saved_model.load(model_dir)
        fn = loaded[model].signatures[signature]
        in_specs = fn.structured_input_signature[1]
        out_specs = fn.structured_outputs
        in_names, out_names = tensor_names(model_dir, signature)
        if set(inputs) != set(in_specs):
            raise RuntimeError(f"{name}: inputs {sorted(inputs)} != {sorted(in_specs)}")

        case_dir = os.path.join(expected_dir, name)
        entry_inputs = {}
        feed = {}
        npz = {}
        for key in sorted(inputs):
            s = in_specs[key]
            arr = to_npy_array(inputs[key], s.dtype)
            if not tf.TensorShape(s.shape).is_compatible_with(arr.shape):
                raise RuntimeError(f"{name}: input {key} shape {arr.shape} vs {s.shape}")
            save_npy(os.path.join(case_dir, "inputs", key + ".npy"), arr)
            npz[key] = arr
            feed[key] = tf.constant(arr, dtype=s.dtype)
            entry_inputs[key] = {
                "dtype": DTYPE_NAMES[s.dtype],
                "shape": list(arr.shape),
                "spec_shape": shape_list(s.shape),
                "tensor_name": in_names[key],
            }
        np.savez(os.path.join(case_dir, "inputs.npz"), **npz)

        entry_outputs = {}
        notes = []
        if expect_error is None:
            result = fn(**feed)
            if set(result) != set(out_specs):
                raise RuntimeError(f"{name}: outputs {sorted(result)} != {sorted(out_specs)}")
            for key in sorted(result):
                s = out_specs[key]
                t = result[key]
                if t.dtype == tf.bfloat16:
                    t = tf.cast(t, tf.float32)  # exact
                arr = to_npy_array(t.numpy(), s.dtype)
                save_npy(os.path.join(case_dir, "outputs", key + ".npy"), arr)
                entry_outputs[key] = {
                    "dtype": DTYPE_NAMES[s.dtype],
                    "shape": list(arr.shape),
                    "spec_shape": shape_list(s.shape),
                    "tensor_name": out_names[key],
                }
                if s.dtype == tf.bfloat16:
                    entry_outputs[key]["stored_as"] = "float32"
                    notes.append(
                        f"output {key} is bfloat16; its .npy holds the same values as float32"
                    )
        else:
            try:
                fn(**feed)
            except tf.errors.InvalidArgumentError as e:
                if expect_error["message_contains"] not in e.message:
                    raise RuntimeError(f"{name}: unexpected error message {e.message!r}")
            else:
                raise RuntimeError(f"{name}: expected an error, got none")

        entry = {
            "case": name,
            "model": model,
            "signature": signature,
            "inputs": entry_inputs,
            "outputs": entry_outputs,
            "expect_error": expect_error,
        }
        if notes:
            entry["notes"] = "; ".join(notes)
        manifest.append(entry)
    return manifest


def to_json(value):
    """Indented JSON, with lists of numbers/nulls (shapes) kept on one line."""
    text = json.dumps(value, indent=2, ensure_ascii=True)
    text = re.sub(
        r"\[\s*((?:-?\d+|null)(?:,\s*(?:-?\d+|null))*)?\s*\]",
        lambda m: "[" + ", ".join(re.split(r",\s*", m.group(1))) + "]" if m.group(1) else "[]",
        text,
    )
    assert json.loads(text) == value
    return text + "\n"


def replace(tmp_path, final_path, trash_dir):
    """Move tmp_path to final_path, removing what was there."""
    if os.path.lexists(final_path):
        os.rename(final_path, os.path.join(trash_dir, os.path.basename(final_path)))
    os.rename(tmp_path, final_path)


def build_tf1_only(fixtures):
    """Rebuilds tests/fixtures/tf1 alone (everything else stays as it is)."""
    os.makedirs(fixtures, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".make-fixtures-", dir=fixtures)
    try:
        build_models(TF1_MODELS, os.path.join(tmp, "tf1"))
        trash = os.path.join(tmp, ".old")
        os.makedirs(trash)
        replace(os.path.join(tmp, "tf1"), os.path.join(fixtures, "tf1"), trash)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="repository root")
    ap.add_argument(
        "--tf1-only",
        action="store_true",
        help="rebuild only tests/fixtures/tf1, leaving the other fixtures and examples as they are",
    )
    args = ap.parse_args()
    repo = os.path.abspath(args.repo)
    started = time.monotonic()
    tf.keras.utils.set_random_seed(0)
    make_keras_export_stable()

    fixtures = os.path.join(repo, "tests", "fixtures")
    if args.tf1_only:
        build_tf1_only(fixtures)
        print(
            f"make-fixtures: {len(TF1_MODELS)} TF1 models in {time.monotonic() - started:.1f}s",
            file=sys.stderr,
        )
        return
    examples = os.path.join(repo, "examples")
    os.makedirs(fixtures, exist_ok=True)
    os.makedirs(examples, exist_ok=True)
    # Temporary folders beside the targets (same file system, so renames work).
    tmp_fix = tempfile.mkdtemp(prefix=".make-fixtures-", dir=fixtures)
    tmp_ex = tempfile.mkdtemp(prefix=".make-fixtures-", dir=examples)
    try:
        # Fixtures.
        models_dir = os.path.join(tmp_fix, "models")
        expected_dir = os.path.join(tmp_fix, "expected")
        build_models(FIXTURE_MODELS, models_dir)
        manifest = run_cases(models_dir, expected_dir)
        with open(os.path.join(tmp_fix, "manifest.json"), "w") as f:
            f.write(to_json(manifest))
        build_models(HOSTILE_MODELS, os.path.join(tmp_fix, "hostile"))
        build_models(BATCH_MODELS, os.path.join(tmp_fix, "batch"))
        build_models(TF1_MODELS, os.path.join(tmp_fix, "tf1"))

        # Examples.
        ex_models = os.path.join(tmp_ex, "models")
        build_models(EXAMPLE_MODELS, ex_models)
        x = rng(42).random((8, 4), dtype=np.float64).astype(np.float32)
        np.savez(os.path.join(tmp_ex, "inputs.npz"), x=x)
        for name in EXAMPLE_MODELS:
            fn = tf.saved_model.load(os.path.join(ex_models, name)).signatures["serving_default"]
            try:
                out = fn(x=tf.constant(x))
            except tf.errors.InvalidArgumentError as e:
                if name != "must_be_negative":
                    raise
                msg = next(
                    (ln for ln in e.message.splitlines() if "must_be_negative expects" in ln),
                    None,
                )
                if msg is None:
                    raise
                print(f"examples/models/{name}: fails as intended: {msg.strip()}",
                      file=sys.stderr)
            else:
                if name == "must_be_negative":
                    raise RuntimeError("must_be_negative did not fail on the demo inputs")
                shapes = {k: tuple(v.shape) for k, v in out.items()}
                print(f"examples/models/{name}: outputs {shapes}", file=sys.stderr)

        # Swap everything into place.
        trash = os.path.join(tmp_fix, ".old")
        trash_ex = os.path.join(tmp_ex, ".old")
        os.makedirs(trash)
        os.makedirs(trash_ex)
        for part in ("models", "expected", "manifest.json", "hostile", "batch", "tf1"):
            replace(os.path.join(tmp_fix, part), os.path.join(fixtures, part), trash)
        for part in ("models", "inputs.npz"):
            replace(os.path.join(tmp_ex, part), os.path.join(examples, part), trash_ex)
    finally:
        shutil.rmtree(tmp_fix, ignore_errors=True)
        shutil.rmtree(tmp_ex, ignore_errors=True)

    print(
        f"make-fixtures: {len(manifest)} cases, {len(FIXTURE_MODELS)} fixture models, "
        f"{len(EXAMPLE_MODELS)} example models in {time.monotonic() - started:.1f}s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
